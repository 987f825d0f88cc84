"""The elector role: runs the pure ElectorCore and TransferCore (node/core) against I/O.

The cores decide; this class only executes their effects, in the order they give them:
`Persist` (currterm file, fsync) before anything that depends on it, `RoleChanged` into the
shared block (and a wake-up to every role), then `Send`/`Reply` on the network.

Cross-process safety (docs/contracts.md C17): DLedger decides votes and appends under
`synchronized(memberState)`. Here every core call that may read the ledger or change the term,
vote or role runs under the member lock (an fcntl lock the handler also takes around
"check leader of term T → append with T → publish ledger end"), together with the persist and
the block write. So a vote is never granted against a ledger end that is about to grow by an
entry this node already acknowledged. Sends and replies happen after the lock is released.

The elector does not vote or stand before the handler has published the recovered ledger end
(its first beat): deciding on an unknown ledger could elect a node lacking committed entries.

I/O is injectable (docs/contracts.md C7), so the simulator runs this very class: everything outside the
process goes through `self.transport` (`send(peer, frame) -> bool`, `reply(ident, frame)`,
`role_changed(frame)`, `control_reply(ident, frame)`), time through `rc.clock()`, and `lock`,
`termvote` may be replaced after construction. The inputs are `start()`, `on_request`,
`on_response`, `on_control`, `tick()` and `next_wait_ms()`; `run()` only builds the ZeroMQ
transport and poller and loops over them.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode, Role, VoteResult
from ipc.security import authorize, parse_user_id, recv_routed_user
from ipc.sockets import (
    recv_routed,
)
from node.block.shared_state import NO_SLOT, ConfigWords, LedgerView
from node.core.election import (
    ElectorCore,
    LeadershipConfirmed,
    LedgerEnd,
    Persist,
    Reply,
    RoleChanged,
    Send,
    Step,
)
from node.core.lost_state import vote_floor_met
from node.core.membership import Configuration, ConfigurationError, bootstrap_configuration
from node.core.slots import SlotTable, add_guest, bootstrap_slots
from node.core.transfer import (
    Answer,
    PeerView,
    SendTakeLeadership,
    SetTransferee,
    TransferConfig,
    TransferCore,
    TransferEffect,
    TransferView,
)
from node.host.member_lock import MemberLock
from node.roles.elector_transport import MAX_ELECTOR_FRAME, ZmqElectorTransport
from node.roles.group_term import (
    NOT_VOTING_CATCH_UP,
    NOT_VOTING_REPAIR,
    NOT_VOTING_TERM_LOST,
    NOT_VOTING_WHY,
    learn_group_term,
    needs_group_term,
)
from node.roles.member_mismatch import MemberMismatch
from node.roles.runtime import RoleContext, role_main
from node.store.base import StoreError
from node.store.layout import LOCK_FILE, TERM_FILE, LayoutError
from node.store.term_vote import TermVoteFile
from node.wiring import channels
from node.wiring.slot_file import SlotFileError, slot_store

MAX_WAIT_MS = 1000  # the loop beats at least this often



def damaged_term_file(path: Path, e: Exception) -> str:
    """One line saying what is wrong with the term/vote file (the node refuses to start)."""
    if isinstance(e, UnicodeDecodeError):
        bad = e.object[e.start:e.start + 1].hex() if isinstance(e.object, bytes) else "?"
        return f"{path}: damaged term/vote file: not UTF-8 text (byte 0x{bad} at offset {e.start})"
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
        return f"{path}: cannot read the term/vote file: {e.strerror or e}"
    text = str(e)
    if text.startswith(str(path)):
        text = text[len(str(path)):].lstrip(": ")
    if isinstance(e, LayoutError):  # the store's own words: they already say it is damaged
        return f"{path}: {text}"
    return f"{path}: damaged term/vote file: {text}"


class Elector:
    """One node's elector: the cores plus the effects' execution (see module docstring)."""

    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer_ids = self.cfg.peer_ids
        # Who holds which peer slot (node.wiring.slot_file): `slot` maps ids to slots, `others`
        # is every other member with a slot; both follow the table as members come and go.
        self.slot_file = slot_store(getattr(rc, "run_dir", None))
        self.slots: SlotTable = bootstrap_slots(self.cfg.peer_map)
        self.slot: dict[str, int] = {}
        self.others: list[str] = []
        self._poller: zmq.Poller | None = None  # run(): a dealer opened later is registered
        self._by_sock: dict[zmq.Socket, str] = {}
        self.transport: ZmqElectorTransport | None = None  # set by run() or the simulator
        self._refresh_slots()
        self.termvote = self._open_termvote()
        self.lock = MemberLock(f"{self.cfg.store_dir}/{LOCK_FILE}")
        self.transport: ZmqElectorTransport | None = None  # set by run() or the simulator
        self.core: ElectorCore | None = None  # built by start(), from `termvote` as it is then
        preferred = tuple(p.strip() for p in self.cfg.preferred_leader_ids.split(",") if p.strip())
        self.transfers = TransferCore(TransferConfig(
            self.cfg.id, tuple(self.slot), self.cfg.transfer_timeout_ms,
            self.cfg.heartbeat_interval_ms, self.cfg.max_heartbeat_leak, preferred))
        self._published: tuple | None = None
        self.hook = shlex.split(self.cfg.on_role_change) if self.cfg.on_role_change else []
        self.hook_procs: list[subprocess.Popen] = []
        self.leader_since_ms = 0
        self._not_voting = 0  # the reason last published to the block's `not_voting`
        self.mismatch = MemberMismatch(self.log, self.cfg.id, list(self.slot))  # --peers disagreements
        self._config_key: ConfigWords | None = None  # the ledger group's config words, as counted

    def now(self) -> int:
        return self.rc.clock()

    def _open_termvote(self) -> TermVoteFile:
        """Read term and vote. A file that cannot be trusted is not used: a wrong term or a
        forgotten vote could make this node vote twice in one term. The node then learns the
        group's term before it votes (`_learn_group_term`); only a file that cannot even be
        examined stops the node (naming it)."""
        path = Path(self.cfg.store_dir) / TERM_FILE
        try:
            return TermVoteFile(self.cfg.store_dir, tolerate_damage=True)
        except (LayoutError, ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
            self.rc.fatal(damaged_term_file(path, e))

    # ------------------------------------------------------------------ reading the block
    def _ledger(self) -> LedgerEnd:
        led, words = self.state.read_ledger_config()  # one snapshot: the ledger and its voters
        self._follow_configuration(words)
        try:
            writable = self.state.get("store_unwritable_ms") == 0
        except KeyError:  # a block layout without the field: the handler cannot tell us
            writable = True
        reason = self._not_voting_reason(led)
        if reason != self._not_voting:
            self._not_voting = reason
            self.state.set("not_voting", reason)
            if reason:
                self.log.warning("%s does not vote or stand: %s", self.cfg.id, NOT_VOTING_WHY[reason])
            else:
                self.log.warning("%s votes again", self.cfg.id)
        tv = self.termvote.current
        floor = tv.floor if reason == NOT_VOTING_CATCH_UP else None
        return LedgerEnd(led.ledger_end_index, led.ledger_end_term, writable, reason == 0,
                         led.committed_index, floor)

    def _refresh_slots(self) -> None:
        """Re-read the slot table if it moved; open a dealer to each member new to it."""
        try:
            table = self.slot_file.refresh()
        except SlotFileError as e:
            self.rc.fatal(str(e))
        if (table is not None and table != self.slots) or not self.slot:  # moved, or never adopted
            self._adopt_slots(table or self.slots)

    def _adopt_slots(self, table: SlotTable) -> None:
        self.slots = table
        # each id's slot as the table ranks them: a member's, else a guest leader's, else leaving
        slot: dict[str, int] = {o.id: table.slot_of(o.id) for _, o in table.held()}  # type: ignore[misc]
        self.slot = slot
        # whom to dial: not this node, not a guest (no address: a leader it only follows)
        self.others = [p for p in slot if p != self.cfg.id and not table.owners[slot[p]].guest]
        if hasattr(self, "mismatch"):  # built after the first table (__init__)
            self.mismatch.members = frozenset(slot)
            self.transfers.cfg = dataclasses.replace(self.transfers.cfg, members=tuple(slot))
        tr = self.transport
        if isinstance(tr, ZmqElectorTransport):
            for p in self.others:
                if p not in tr.dealers:
                    o = table.owners[slot[p]]
                    s = tr.connect(p, o.host, o.port)  # type: ignore[union-attr]
                    if self._poller is not None:
                        self._poller.register(s, zmq.POLLIN)
                        self._by_sock[s] = p

    def _configuration(self, w: ConfigWords) -> Configuration:
        """The newest configuration in this node's log, as the handler published it: the
        masks over the slot table (the handler writes the table before it publishes masks
        that name a new slot, so a table read after the words holds every slot they name)."""
        if w.config_voters == 0:  # nothing published yet: the bootstrap configuration
            return bootstrap_configuration(self.cfg.bootstrap_members)
        try:
            return self.slots.configuration(w.config_index, w.config_voters, w.config_learners)
        except ConfigurationError:
            self._refresh_slots()
        try:
            return self.slots.configuration(w.config_index, w.config_voters, w.config_learners)
        except ConfigurationError as e:  # the handler never publishes one: a damaged block
            self.rc.fatal(f"the published configuration (entry {w.config_index}) is not one: {e}")

    def _follow_configuration(self, w: ConfigWords) -> None:
        """Count the newest configuration from the same ledger snapshot the decision reads
        (one snapshot per decision: a tally never mixes two configurations)."""
        if self.core is None or w == self._config_key:
            return
        self._config_key = w
        self._refresh_slots()  # a configuration that moved may have given a slot to a new member
        c = self._configuration(w)
        if c == self.core.configuration:
            return
        self.core.set_configuration(c, self.now())
        self.log.warning("%s counts configuration entry %d: voters %s, learners %s%s", self.cfg.id,
                         c.index, ",".join(c.voters), ",".join(c.learners) or "-",
                         "" if self.core.stands else "; not a voter: does not stand")

    def _not_voting_reason(self, led: LedgerView) -> int:
        """0 when this node may vote, else why not (NOT_VOTING_WHY; the block's `not_voting`).
        After a lost disk it is caught up once entries up to the catch-up index are committed
        here, or once its own log reaches the floor (voteFloorTerm, voteFloorIndex) in Raft's
        order: such a log holds every entry the lost disk could have held, as a candidate's
        does that gets its vote meanwhile (node/core/lost_state.py). The second matters when the group never
        commits that index: the highest end it heard was a tail that no majority stored, and the
        node may be the one that must lead (the simulator's lost-disk fault, seed 1,748)."""
        if self.state.get("repair_index") >= 0:
            return NOT_VOTING_REPAIR
        tv = self.termvote.current
        if tv.catch_up >= 0:
            if led.committed_index < tv.catch_up:
                if tv.floor is None or not vote_floor_met(led.ledger_end_term, led.ledger_end_index,
                                                          tv.floor):
                    return NOT_VOTING_CATCH_UP
                how = f" (its log reaches term {tv.floor[0]}, index {tv.floor[1]})"
            else:
                how = ""
            self.termvote.save(tv.term, tv.voted_for, catch_up=-1)  # caught up, durably
            self.log.warning("%s caught up to index %d after a lost disk%s", self.cfg.id, tv.catch_up, how)
        return 0

    def _learn_group_term(self) -> bool:
        """The term/vote file is damaged or absent: learn the group's term before the core
        starts (node/roles/group_term.py). False when the node is stopping."""
        if needs_group_term(self.cfg, self.termvote, self.state.read_ledger()):
            self._not_voting = NOT_VOTING_TERM_LOST
            self.state.set("not_voting", NOT_VOTING_TERM_LOST)
            return learn_group_term(self.rc, self.termvote, self.now)
        return True

    def _transfer_view(self) -> TransferView:
        c = self.core
        peers = {}
        for p in self.others:
            v = self.state.read_peer(self.slot[p])
            peers[p] = PeerView(bool(v.alive), v.last_ack_ms, v.match_term, v.match_index)
        return TransferView(c.role, c.term, c.leader_id, self.state.read_ledger().ledger_end_index,
                            self.leader_since_ms, peers)

    # ------------------------------------------------------------------ election effects
    def _decide(self, fn: Callable[[LedgerEnd], Step]) -> Step:
        """Run one core call and its durable/shared effects atomically under the member lock."""
        c = self.core
        before = (c.role, c.last_leader_heartbeat_ms, c.last_vote_round)
        with self.lock:
            step = fn(self._ledger())
            for e in step.effects:
                if isinstance(e, Persist):
                    self._persist(e)  # fsynced before anything else
            self._publish(step)
        self._log_election(before)
        return step

    def _log_election(self, before: tuple) -> None:
        """Log what explains an election's length (tools/bench/failover.py parses these
        lines): how long the leader had been silent when this follower gave up, each vote
        round's tally and decision, and heartbeat gaps long enough to threaten a spurious
        election (the elector starved, or heartbeats delayed under load)."""
        c = self.core
        role0, hb0, round0 = before
        now = self.now()
        if role0 == Role.FOLLOWER and c.role == Role.CANDIDATE:
            self.log.info("%s leader silent for %d ms (term %d)", self.cfg.id,
                          now - c.last_leader_heartbeat_ms, c.term)
        elif (role0 == Role.FOLLOWER and c.role == Role.FOLLOWER
              and c.last_leader_heartbeat_ms != hb0
              and c.last_leader_heartbeat_ms - hb0 > 2 * self.cfg.heartbeat_interval_ms):
            self.log.warning("%s heartbeat gap %d ms (term %d)", self.cfg.id,
                             c.last_leader_heartbeat_ms - hb0, c.term)
        r = c.last_vote_round
        if r is not None and r is not round0:
            self.log.info("%s vote round term=%d %s accepted=%d valid=%d bigger_ledger=%d "
                          "not_ready=%d has_leader=%d cost=%dms next_in=%s", self.cfg.id,
                          r.term, r.result.name, r.accepted, r.valid, r.bigger_ledger,
                          r.not_ready, int(r.already_has_leader), r.cost_ms,
                          "-" if r.next_vote_in_ms is None else f"{r.next_vote_in_ms}ms")

    def _persist(self, e: Persist) -> None:
        try:
            self.termvote.save(e.term, e.voted_for)
        except StoreError as err:  # DiskFull / DiskError: the message names the file
            # The core already acts on the new term/vote; going on without it on disk could
            # make a restarted node vote twice in one term. Stop, naming the file.
            self.rc.fatal(f"cannot write the term/vote file: {err}")
        except OSError as err:
            self.rc.fatal(f"{self.termvote.path}: cannot write the term/vote file: "
                          f"{err.strerror or err}")

    def _guest_slot(self, leader_id: str) -> int:
        """A slot for a leader that no configuration in this node's log names (its log lacks
        the entry that added it): a guest owner in the slot table (node/core/slots.py), so the
        block can name it and the handler accept its pushes, which bring that entry."""
        try:
            table = self.slot_file.update(lambda t: add_guest(t or self.slots, leader_id))
        except (SlotFileError, ConfigurationError) as e:
            self.log.error("cannot follow leader %s: %s", leader_id, e)
            return NO_SLOT
        self._adopt_slots(table)
        self.log.warning("%s follows %s, which no configuration in its log names yet", self.cfg.id,
                         leader_id)
        return self.slot.get(leader_id, NO_SLOT)

    def _publish(self, step: Step) -> None:
        c = self.core
        self._refresh_slots()  # a stat: a slot released or given since (the block names slots)
        if c.leader_id and c.leader_id not in self.slot:
            self._guest_slot(c.leader_id)
        leader = self.slot.get(c.leader_id, NO_SLOT) if c.leader_id else NO_SLOT
        voted = self.slot.get(c.voted_for, NO_SLOT) if c.voted_for else NO_SLOT
        snap = (c.role, c.term, leader, voted, c.last_leader_heartbeat_ms, c.last_succ_heartbeat_ms)
        if snap == self._published:
            return
        changed = self._published is None or snap[:3] != self._published[:3]
        self._published = snap
        m = self.state.write_member(role=c.role, current_term=c.term, leader_slot=leader,
                                    voted_for_slot=voted, last_leader_heartbeat_ms=c.last_leader_heartbeat_ms,
                                    last_quorum_heartbeat_ms=c.last_succ_heartbeat_ms)
        if changed:
            if c.role == Role.LEADER:
                self.leader_since_ms = self.now()
            for e in step.effects:
                if isinstance(e, RoleChanged):
                    lead = f" leader={e.leader_id}" if e.leader_id and e.role == Role.FOLLOWER else ""
                    self.log.info("%s became %s term=%d%s", self.cfg.id, e.role.name, e.term, lead)
            self.state.incr("role_changes")
            self._run_hook(c.role, c.term, c.leader_id)
            self.transport.role_changed(channels.encode_role_msg(c.role, c.term, leader, m.role_epoch))

    def _run_hook(self, role: Role, term: int, leader: str | None) -> None:
        """The role-change listener for embedding code (DLedger's RoleChangeHandler): run the
        configured command without waiting; the environment says what changed."""
        self.hook_procs = [p for p in self.hook_procs if p.poll() is None]  # reap finished ones
        if not self.hook:
            return
        env = {**os.environ, "DLEDGER_NODE": self.cfg.id, "DLEDGER_GROUP": self.cfg.group,
               "DLEDGER_ROLE": role.name, "DLEDGER_TERM": str(term), "DLEDGER_LEADER": leader or ""}
        try:
            self.hook_procs.append(subprocess.Popen(self.hook, env=env, stdin=subprocess.DEVNULL,
                                                    close_fds=True))
        except OSError as e:
            self.log.warning("on_role_change command failed to start: %s", e)

    def _transmit(self, step: Step) -> None:
        """Network effects, outside the lock. A peer we cannot reach right now answers
        'unreachable' at once (IMMEDIATE dealers), which keeps failover fast."""
        unreachable: list[int] = []
        for e in step.effects:
            if isinstance(e, Send):
                if self.transport.send(e.peer, P.encode(e.message)):
                    self.state.incr("votes_requested" if isinstance(e.message, P.VoteRequest)
                                    else "heartbeats_sent")
                else:
                    unreachable.append(e.message.request_id)
            elif isinstance(e, Reply):
                if isinstance(e.message, P.VoteResponse) and e.message.vote_result == VoteResult.ACCEPT:
                    self.state.incr("votes_granted")
                self.transport.reply(e.token, P.encode(e.message))
            elif isinstance(e, LeadershipConfirmed):
                # After _decide published the round's start in the block: the handler that
                # wakes up on this finds the quorum time there (the block is the truth:
                # docs/contracts.md C4, C24).
                self.transport.control_reply(e.token, channels.LEADERSHIP_CONFIRMED)
        for rid in unreachable:
            self._run(lambda _led, rid=rid: self.core.on_peer_unreachable(rid, self.now()))

    def _run(self, fn: Callable[[LedgerEnd], Step]) -> None:
        self._transmit(self._decide(fn))

    # ------------------------------------------------------------------ transfer effects
    def _apply_transfer(self, effects: list[TransferEffect]) -> None:
        while effects:
            e = effects.pop(0)
            if isinstance(e, SetTransferee):
                with self.lock:  # the handler stops appends while a transferee is set
                    self.state.write_member(
                        transferee_slot=NO_SLOT if e.target is None else self.slot[e.target])
                if e.target is not None:
                    self.log.info("%s transferring leadership to %s (term %d)", self.cfg.id,
                                  e.target, self.core.term)
            elif isinstance(e, SendTakeLeadership):
                frame = P.encode(P.TakeLeadershipRequest(self.cfg.group, e.target, self.cfg.id,
                                                         e.term, e.request_id))
                if not self.transport.send(e.target, frame):
                    effects += self.transfers.on_send_failed()
            elif isinstance(e, Answer):
                if e.ident is not None:
                    # A refusal with a reason travels as an ERROR answer, which every client
                    # reads for any request; TRANSFER's own answer has no room for one.
                    answer = (P.ErrorResponse(int(e.code), self.cfg.group, self.core.term,
                                              self.core.leader_id or "", e.why[:200],
                                              int(P.MsgType.LEADERSHIP_TRANSFER), e.request_id)
                              if e.why and e.code != ResponseCode.SUCCESS else
                              P.TransferResponse(int(e.code), self.cfg.group, self.core.term,
                                                 self.core.leader_id or "", e.request_id))
                    self.transport.control_reply(e.ident, P.encode(answer))
                if e.code == ResponseCode.SUCCESS:
                    self.log.info("%s handed leadership to %s", self.cfg.id, e.target)
                else:
                    self.log.warning("transfer to %s failed: %s%s", e.target, e.code.name,
                                     f": {e.why}" if e.why else "")

    # ------------------------------------------------------------------ inputs
    def start(self) -> None:
        """Build the core from the term file and publish the initial role (call once the
        handler published the ledger end: see the module docstring)."""
        tv = self.termvote.current
        led, self._config_key = self.state.read_ledger_config()
        # Never voted (no term/vote file, also after learning the group's term: a group with
        # history makes it record one) and nothing stored: its first campaign may come sooner.
        new_member = (self.termvote.absent and led.ledger_end_index < 0
                      and led.ledger_begin_index < 0)
        self.core = ElectorCore(self.cfg.id, self._configuration(self._config_key), self.cfg.group,
                                self.cfg.election_config(), term=tv.term, voted_for=tv.voted_for,
                                now_ms=self.now(), new_member=new_member, peers=self.peer_ids)
        with self.lock:
            self._publish(Step([RoleChanged(self.core.role, self.core.term, None)], 0))
        # Whether it may vote, decided (and said, in the log and the block) before it is ready:
        # a store being repaired at start is announced at once, not at the first vote request.
        self._ledger()
        self.log.info("%s elector ready term=%d voted_for=%s", self.cfg.id, self.core.term,
                      self.core.voted_for)

    def on_request(self, ident: bytes, frame: bytes,
                   principal: tuple[str, str, str] | None = None) -> None:
        """A frame on the elector port from a peer's elector (VOTE, HEARTBEAT, TAKE_LEADERSHIP).
        `principal`: the sender's key (`ipc.security.parse_user_id`); None in plain mode."""
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError as e:
            self.state.incr("elector_bad_frames")
            self.transport.reply(ident, P.encode(P.error_reply(
                frame, ResponseCode.UNEXPECTED_ARGUMENT,
                group=self.cfg.group, term=self.core.term, reason=str(e)[:200])))
            return
        if P.is_response(msg):
            self.state.incr("elector_bad_frames")
            return
        refused = authorize(principal, msg)
        if refused is not None:  # a member's key speaking for another member: nothing changes
            self.state.incr("elector_bad_frames")
            self.log.warning("refused %s: %s", type(msg).__name__, refused)
            self.transport.reply(ident, P.encode(P.error_reply(
                frame, ResponseCode.PERMISSION_DENIED,
                group=self.cfg.group, term=self.core.term, reason=refused[:200])))
            return
        self.mismatch.on_request(msg, self.now())
        self._run(lambda led: self.core.handle(msg, self.now(), led, ident))

    def on_response(self, frame: bytes) -> None:
        """An answer to one of our requests, from a peer's elector."""
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError:
            self.state.incr("elector_bad_frames")
            return
        if not P.is_response(msg):
            self.state.incr("elector_bad_frames")
            return
        if isinstance(msg, P.TakeLeadershipResponse):
            self._apply_transfer(self.transfers.on_take_response(msg.request_id, msg.code))
            return
        self.mismatch.on_response(msg, self.now())
        self._run(lambda _led: self.core.on_response(msg, self.now()))

    def on_control(self, ident: bytes | str, frame: bytes) -> None:
        """A frame from the handler on the control channel: CONFIRM_LEADERSHIP (docs/contracts.md
        C4) or a LEADERSHIP_TRANSFER request."""
        if frame == channels.CONFIRM_LEADERSHIP:
            self._run(lambda _led: self.core.request_heartbeat(self.now(), ident))
            return
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError:
            return
        if isinstance(msg, P.LeadershipTransferRequest):
            self._apply_transfer(self.transfers.request(
                msg.transferee_id, ident, msg.request_id, msg.term, self._transfer_view(),
                self.now()))

    def tick(self) -> None:
        """Everything due by the clock: the core's timers, then the transfer / preferred check."""
        now = self.now()
        if now >= self.core.next_deadline(now):
            self._run(lambda led: self.core.tick(self.now(), led))
        due = self.transfers.next_check_ms(now)
        if due is not None and now >= due:
            self._apply_transfer(self.transfers.tick(self._transfer_view(), self.now()))

    def next_wait_ms(self) -> int:
        """How long the loop may wait for input before `tick` has something to do."""
        now = self.now()
        due = [self.core.next_deadline(now), now + MAX_WAIT_MS]
        t = self.transfers.next_check_ms(now)
        if t is not None:
            due.append(t)
        return max(0, min(due) - now)

    # ------------------------------------------------------------------ loop
    def _wait_for_handler(self) -> bool:
        """The ledger end must be known before any vote (see module docstring)."""
        while not self.rc.should_stop():
            if self.state.last_beat("handler") > 0:
                return True
            self.rc.beat()
            time.sleep(0.01)
        return False

    def run(self) -> None:
        rc = self.rc
        tr = self.transport = ZmqElectorTransport(rc, self.others, self.slots)
        if not self._wait_for_handler() or not self._learn_group_term():
            return
        self.start()
        rc.beat()  # ready: the supervisor starts the remaining roles on this (supervisor.py)
        poller = zmq.Poller()
        poller.register(tr.router, zmq.POLLIN)
        poller.register(tr.ctl, zmq.POLLIN)
        poller.register(tr.confirm.fd, zmq.POLLIN)
        poller.register(rc.wake_fd, zmq.POLLIN)
        by_sock = self._by_sock
        by_sock.update({s: p for p, s in tr.dealers.items()})
        for s in tr.dealers.values():
            poller.register(s, zmq.POLLIN)
        self._poller = poller
        self._adopt_slots(self.slots)  # members the table gained before the poller existed

        def replaced(peer: str, old: zmq.Socket, new: zmq.Socket) -> None:
            poller.unregister(old)
            by_sock.pop(old, None)
            poller.register(new, zmq.POLLIN)
            by_sock[new] = peer

        tr.on_replaced = replaced
        counted = 0  # handshakes refused by this process's ZAP handler, as added to the block
        while not rc.should_stop():
            events = dict(poller.poll(self.next_wait_ms()))
            if (refused := rc.auth_refused()) != counted:  # ZAP counts in its own thread
                self.state.incr("elector_auth_refused", refused - counted)
                counted = refused
            if rc.wake_fd in events:
                rc.drain_wake()
            # Read everything queued before ticking (the core wants inputs before the clock).
            if tr.router in events:
                while True:
                    try:
                        got = recv_routed_user(tr.router, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if got is None:
                        self.state.incr("elector_bad_frames")
                    else:
                        self.on_request(got[0], got[1], parse_user_id(got[2]))
            for s in list(events):
                if s in by_sock:
                    while True:
                        try:
                            frames = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 1:
                            self.on_response(frames[0])
            if tr.ctl in events:
                while True:
                    try:
                        got = recv_routed(tr.ctl, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if got is not None:
                        self.on_control(*got)
            if tr.confirm.fd in events:
                tr.confirm.drain()  # one round answers every ring so far
                self.on_control(channels.BELL_TOKEN, channels.CONFIRM_LEADERSHIP)
            self.tick()
            rc.beat()
        tr.close()


def main() -> int:
    return role_main("elector", lambda rc: Elector(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
