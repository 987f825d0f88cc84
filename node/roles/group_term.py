"""Why a node does not vote, and how it learns the group's term when its own is lost.

A node whose term/vote file is damaged or absent may already have voted in some term of the
group: voting again there could elect two leaders in one term. So before its elector starts,
it asks the other members' handlers for their term (METADATA) until
`node/core/lost_state.py:decide_lost_state` can decide, and records that term with no vote to
give in it (docs/contracts.md C15). Meanwhile nothing is voted or answered: the role is still
the block's initial one (no leader, term 0), so the handler refuses pushes too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode
from ipc.sockets import Redial, data_address, dealer, from_source
from node.block.shared_state import LedgerView
from node.config import NodeConfig
from node.core.lost_state import (
    NEW_GROUP_PATIENCE_MS,
    LostStateDecision,
    PeerTerm,
    answers_needed,
    decide_lost_state,
    majority,
)
from node.roles.member_mismatch import member_set_difference
from node.roles.runtime import RoleContext
from node.store.term_vote import LOST_VOTE, TermVoteFile

# Why a node does not vote (the block's `not_voting`, metric dledger_not_voting).
NOT_VOTING_REPAIR = 1
NOT_VOTING_TERM_LOST = 2
NOT_VOTING_CATCH_UP = 3
NOT_VOTING_WHY = {
    NOT_VOTING_REPAIR: "its store is fetching a damaged committed range again (repair_index "
                       "in the block, repairIndex in the checkpoint)",
    NOT_VOTING_TERM_LOST: "its term/vote state is lost; asking the other members for the "
                          "group's term",
    NOT_VOTING_CATCH_UP: "it lost its disk and has not yet caught up to what the group had "
                         "(catchUpIndex in currterm); it votes only for a candidate whose log "
                         "reaches (voteFloorTerm, voteFloorIndex) and does not stand",
}
LOST_STATE_ASK_MS = 300  # how often an unanswered member is asked again for its term
# How long a node with no file and no log asks before `majority - 1` answers may make a new group
# (node/core/lost_state.py). The environment variable is for tests that must not race it.
PATIENCE_MS = int(os.environ.get("DLEDGER_NEW_GROUP_PATIENCE_MS", NEW_GROUP_PATIENCE_MS))
UNSENT_RETRY_MS = 10  # how soon a request that could not be sent (no connection yet) is retried


def needs_group_term(cfg: NodeConfig, termvote: TermVoteFile, led: LedgerView) -> bool:
    """True when the term/vote state cannot be trusted and the group must be asked. A single
    member with no file and no log is a new one-node group: nobody to ask, nothing voted."""
    if termvote.damaged is None and not termvote.absent:
        return False
    local_empty = led.ledger_end_index < 0 and led.ledger_begin_index < 0
    return not (len(cfg.peer_ids) == 1 and termvote.absent and local_empty)


def learn_group_term(rc: RoleContext, termvote: TermVoteFile, now: Callable[[], int]) -> bool:
    """Ask the other members for their term until the decision can be made, then record it
    (with a catch-up index after a lost disk). False when the node is stopping."""
    cfg, log = rc.cfg, rc.log
    led = rc.state.read_ledger()
    local_empty = led.ledger_end_index < 0 and led.ledger_begin_index < 0
    n = len(cfg.peer_ids)
    what = termvote.damaged or ("no term/vote file and an empty store (a new member, or a lost disk)"
                                if local_empty else "no term/vote file, but a log")
    log.warning("%s: %s; not voting until %d other member(s) told their term%s",
                cfg.id, what, answers_needed(n),
                f" ({majority(n) - 1} after {PATIENCE_MS / 1000:g} s if no answer shows a log)"
                if local_empty and termvote.absent and majority(n) - 1 < answers_needed(n) else "")
    answers: dict[str, PeerTerm] = {}
    socks: dict[str, zmq.Socket] = {}
    redials: dict[str, Redial] = {}
    source = cfg.address[0] if cfg.connect_from_own_host else None
    server_keys = getattr(rc, "server_keys", None)  # (a test's context has none: plain)
    secure = server_keys is not None and server_keys() is not None
    for peer in cfg.peer_ids:
        if peer != cfg.id:
            h, p = cfg.peer_map[peer]
            # Made again while refused (ipc.sockets.Redial): a joining node's key is admitted
            # only once the members store the entry that adds it.
            redials[peer] = Redial(lambda h=h, p=p, peer=peer: dealer(
                rc.zctx, from_source(data_address(h, p), source), curve=rc.peer_curve(peer)),
                enabled=secure)
            socks[peer] = redials[peer].sock
    poller = zmq.Poller()
    for sk in socks.values():
        poller.register(sk, zmq.POLLIN)
    asked: dict[str, int] = {}
    began = now()
    try:
        while not rc.should_stop():
            decision = decide_lost_state(n, list(answers.values()), file_absent=termvote.absent,
                                         local_empty=local_empty, local_end_term=led.ledger_end_term,
                                         patience_over=now() - began >= PATIENCE_MS)
            if decision is not None:
                break
            t = now()
            unsent = False
            for peer, sk in socks.items():
                if peer not in answers and t - asked.get(peer, -LOST_STATE_ASK_MS) >= LOST_STATE_ASK_MS:
                    try:
                        sk.send(P.encode(metadata_request(cfg.group, peer, t)), zmq.NOBLOCK)
                        asked[peer] = t
                        redials[peer].sent()
                    except zmq.Again:  # not connected yet (IMMEDIATE): ask as soon as it is
                        unsent = True
                        if (old := redials[peer].failed()) is not None:
                            poller.unregister(old)
                            socks[peer] = redials[peer].sock
                            poller.register(socks[peer], zmq.POLLIN)
            # A group starting together: the peers' handlers bind a moment after we connect, so
            # a request that could not be sent is retried at once, not a whole ask interval on.
            for sk, _ in poller.poll(UNSENT_RETRY_MS if unsent else 100):
                peer = next(q for q, x in socks.items() if x is sk)
                try:
                    msg = P.decode(sk.recv(zmq.NOBLOCK))
                except (zmq.Again, P.ProtocolError):
                    continue
                if (got := peer_term(peer, cfg.group, msg)) is not None:
                    if peer not in answers:
                        log.info("%s: %s is in term %d, ledger end %d (%d of %d answers)", cfg.id, peer,
                                 got.term, got.ledger_end, len(answers) + 1, answers_needed(n))
                    answers[peer] = got
                    differs = member_set_difference(cfg.id, cfg.peer_map, peer, msg.peers)
                    if differs is not None and not cfg.join:  # a joining node is not one of them yet
                        log.warning("%s", differs)
            rc.beat()
        else:
            return False
    finally:
        for sk in socks.values():
            sk.close(linger=0)
    record_group_term(cfg, log, termvote, decision, answers)
    return True


def metadata_request(group: str, peer: str, request_id: int) -> P.MetadataRequest:
    """What the node asks each member: METADATA with the last entry's term (the status and
    configuration come with it; a member of an older version answers without the term)."""
    return P.MetadataRequest(group, peer, request_id=request_id, want_status=True,
                             want_config=True, want_end_term=True)


def peer_term(peer: str, group: str, msg: object) -> PeerTerm | None:
    """`peer`'s answer to METADATA as the decision reads it; None for anything else (an
    error, another group's or another member's answer)."""
    if (isinstance(msg, P.MetadataResponse) and msg.code == ResponseCode.SUCCESS
            and msg.group == group and msg.self_id == peer):
        end_term = msg.status.ledger_end_term if msg.status is not None else None
        return PeerTerm(peer, msg.term, msg.ledger_end_index, msg.committed_index, end_term)
    return None


def record_group_term(cfg: NodeConfig, log: logging.Logger, termvote: TermVoteFile,
                      decision: LostStateDecision, answers: dict[str, PeerTerm]) -> None:
    """Act on the decision: a new group votes from the start; otherwise the group's term is
    saved with no vote to give in it (and, after a lost disk, what to catch up to). Shared with
    the simulator (tools/sim), which asks the members through its own network."""
    if decision.new_group:
        log.info("%s: a new group (every member that answered is in term 0 with an empty log): "
                 "voting from the start", cfg.id)
        return
    termvote.save(decision.term, LOST_VOTE, catch_up=decision.catch_up, floor=decision.floor)
    log.warning("%s: the group is in term %d (answers: %s); recorded term %d with no vote to give "
                "in it: votes from term %d on%s", cfg.id, decision.term,
                ", ".join(f"{a.peer}={a.term}" for a in answers.values()), decision.term,
                decision.term + 1,
                f", once entries up to {decision.catch_up} are committed here or its log reaches "
                f"the most up to date one it heard of (term {decision.floor[0]}, index "
                f"{decision.floor[1]}; meanwhile it votes only for a candidate whose log does)"
                if decision.catch_up >= 0 and decision.floor is not None else "")
