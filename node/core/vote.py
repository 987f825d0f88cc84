"""Vote decisions, pure: DLedgerLeaderElector.handleVote and the candidate's tally/parse.

Sources: docs/election.md "Decision tables" and openmessaging/dledger DLedgerLeaderElector.java
(handleVote, maintainAsCandidate). The order of the checks
below IS the protocol: e.g. the ledger comparison comes before the term comparison, so a
candidate with a shorter log but a larger term is rejected without the voter adopting its
term (unlike textbook Raft, which would step down first).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ipc.codes import ParseResult, ResponseCode, VoteResult
from ipc.protocol import VoteRequest
from node.core.election_types import ElectionConfig, ElectorView, is_quorum


@dataclass(frozen=True, slots=True)
class VoteDecision:
    """What handleVote decided; the caller applies it, persists, THEN replies.

    - `grant_to`: set votedFor to this candidate (ACCEPT). It must be made durable before the
      reply leaves the node (etcd's "persist before send"; DLedger's setCurrVoteFor +
      persistTerm, but fsynced).
    - `candidate_term`: DLedger's ``changeRoleToCandidate(request.term)`` +
      ``needIncreaseTermImmediately``: step down to candidate and adopt this term (durably,
      votedFor cleared) before replying REJECT_TERM_NOT_READY.
    """

    result: VoteResult
    reply_term: int
    code: ResponseCode = ResponseCode.SUCCESS
    grant_to: str | None = None
    candidate_term: int | None = None


def decide_vote(view: ElectorView, req: VoteRequest, *, is_self: bool = False) -> VoteDecision:
    """handleVote(request, self) in DLedger's exact decision order (docs/election.md "Decision
    tables")."""
    cand = req.leader_id
    # Envelope checks DLedgerServer.handleVote does before delegating (PreConditions):
    # a request for another group or addressed to another node gets an error code and an
    # UNKNOWN vote (the candidate counts UNKNOWN as "no valid answer").
    if req.group != view.group:
        return VoteDecision(VoteResult.UNKNOWN, view.term, ResponseCode.UNKNOWN_GROUP)
    if req.remote_id != view.self_id:
        return VoteDecision(VoteResult.UNKNOWN, view.term, ResponseCode.UNKNOWN_MEMBER)
    # 1. "[BUG] remoteId is an unknown member": only group members may be elected.
    if cand not in view.peers:
        return VoteDecision(VoteResult.REJECT_UNKNOWN_LEADER, view.term)
    # 2. Someone else claims to be me (misconfigured peers): never vote for it.
    if not is_self and cand == view.self_id:
        return VoteDecision(VoteResult.REJECT_UNEXPECTED_LEADER, view.term)
    # 3. Log comparison first (Raft §5.4.1 election restriction): a candidate whose last entry
    #    has an older term, or the same term and a lower index, lacks entries I may have
    #    acknowledged; it must never win. Note: no term adoption on this path.
    if req.ledger_end_term < view.ledger_end_term:
        return VoteDecision(VoteResult.REJECT_EXPIRED_LEDGER_TERM, view.term)
    if req.ledger_end_term == view.ledger_end_term and req.ledger_end_index < view.ledger_end_index:
        return VoteDecision(VoteResult.REJECT_SMALL_LEDGER_END_INDEX, view.term)
    # 4. Term comparison.
    if req.term < view.term:
        # Stale candidate: tell it my term so it can catch up (knownMaxTermInGroup).
        return VoteDecision(VoteResult.REJECT_EXPIRED_VOTE_TERM, view.term)
    if req.term == view.term:
        # One vote per term: unvoted or a repeat for the same candidate may proceed.
        if view.voted_for is not None and view.voted_for != cand:
            if view.leader_id is not None:
                return VoteDecision(VoteResult.REJECT_ALREADY_HAS_LEADER, view.term)
            return VoteDecision(VoteResult.REJECT_ALREADY_VOTED, view.term)
    else:
        # "stepped down by larger term": DLedger never votes in a term it has not entered yet;
        # it becomes candidate in that term and answers NOT_READY; the candidate then revotes
        # immediately (REVOTE_IMMEDIATELY) and finds me in its term with no vote cast.
        return VoteDecision(VoteResult.REJECT_TERM_NOT_READY, req.term, candidate_term=req.term)
    # 5. A vote term older than my last entry's term cannot produce a legal leader; answer
    #    with my ledger end term (that is what DLedger puts in the reply).
    if req.term < view.ledger_end_term:
        return VoteDecision(VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, view.ledger_end_term)
    # 6. Leadership transfer: while I am taking leadership, other candidates whose log is not
    #    longer than mine are turned away so the transfer target wins (DLedger's handleVote).
    if (not is_self and view.taking_leadership
            and req.ledger_end_term == view.ledger_end_term
            and view.ledger_end_index >= req.ledger_end_index):
        return VoteDecision(VoteResult.REJECT_TAKING_LEADERSHIP, view.term)
    # 7. Grant. votedFor must be durable before the ACCEPT is sent.
    return VoteDecision(VoteResult.ACCEPT, view.term, grant_to=cand)


# ---------------------------------------------------------------------------------------------
# Candidate side: tally one round (voteForQuorumResponses + the whenComplete callbacks) and parse
# it (the if/else chain at the end of maintainAsCandidate).
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class VoteTally:
    """Counters of one vote round, named as in maintainAsCandidate."""

    term: int
    known_max_term: int = -1  # knownMaxTermInGroup, starts at the round's term
    all_num: int = 0
    valid_num: int = 0
    accepted_num: int = 0
    not_ready_term_num: int = 0
    bigger_ledger_num: int = 0
    already_has_leader: bool = False
    ahead_num: int = 0  # valid answers from members that rank before me (log_ahead)

    def __post_init__(self) -> None:
        if self.known_max_term < self.term:
            self.known_max_term = self.term

    def add(self, result: VoteResult | None, resp_term: int = -1, ahead: bool = False) -> None:
        """Count one answer; `None` = no answer (network error / peer unreachable).
        `ahead`: the answering member ranks before me for the next campaign (log_ahead)."""
        self.all_num += 1
        if result is None:
            return  # the future completed exceptionally: counted in allNum only
        # REJECT_UNKNOWN_LEADER ("you are not in my newest configuration") is no valid answer
        # either: a removed member that lacks the entry removing it would otherwise count the
        # refusals of the group as a quorum that answered without a leader, and raise its term
        # each round (docs/membership.md "Removed members cannot disrupt"); re-added later, it
        # would bring that term back and depose the leader.
        if result != VoteResult.UNKNOWN and result != VoteResult.REJECT_UNKNOWN_LEADER:
            self.valid_num += 1
            if ahead:
                self.ahead_num += 1
        if result == VoteResult.ACCEPT:
            self.accepted_num += 1
        elif result == VoteResult.REJECT_ALREADY_HAS_LEADER:
            self.already_has_leader = True
        elif result in (VoteResult.REJECT_TERM_SMALL_THAN_LEDGER,
                        VoteResult.REJECT_EXPIRED_VOTE_TERM):
            if resp_term > self.known_max_term:
                self.known_max_term = resp_term
        elif result in (VoteResult.REJECT_EXPIRED_LEDGER_TERM,
                        VoteResult.REJECT_SMALL_LEDGER_END_INDEX):
            self.bigger_ledger_num += 1
        elif result == VoteResult.REJECT_TERM_NOT_READY:
            self.not_ready_term_num += 1
        # REJECT_ALREADY_VOTED, REJECT_TAKING_LEADERSHIP, REJECT_UNEXPECTED_LEADER: valid
        # answers that count for nothing else.

    def done(self, member_count: int) -> bool:
        """voteLatch.countDown conditions: enough is known to parse before the deadline."""
        return (self.already_has_leader
                or is_quorum(self.accepted_num, member_count)
                or is_quorum(self.accepted_num + self.not_ready_term_num, member_count)
                or self.all_num >= member_count)


def log_ahead(peer: str, peer_end: tuple[int, int], me: str, my_end: tuple[int, int],
              members: Sequence[str]) -> bool:
    """True when `peer` should campaign before me: its ledger end (term, index) is more up to
    date than mine, or the same and `peer` comes first in the member list.

    Every member that answered a round computes this from the same ledger ends (the voters
    put theirs in the VOTE answer), so after a leader dies the survivors agree on one member
    to stand first: the best log (which the others will vote for; Raft §5.4.1), ties broken by
    member order. A follower's ledger end does not move while there is no leader, so the views
    agree; when they do not (an entry landing between two rounds) the cost is one split
    vote, which the random timer then resolves."""
    if peer_end != my_end:
        return peer_end > my_end
    order = {m: i for i, m in enumerate(members)}
    return order.get(peer, len(order)) < order.get(me, len(order))


def next_time_to_request_vote(now_ms: int, last_vote_cost_ms: int, cfg: ElectionConfig,
                              rng: random.Random, taking_leadership: bool = False) -> int:
    """getNextTimeToRequestVote: now + lastVoteCost + random(min, max) (docs/election.md "Timers and
    defaults").

    The random spread desynchronizes candidates (no endless split votes); adding the last
    round's cost backs off further when answers are slow (a loaded machine). While taking
    leadership the (short) take-leadership interval is used and the cost is not added, so a
    transfer completes fast.
    """
    if taking_leadership:
        lo = cfg.min_take_leadership_vote_interval_ms
        hi = cfg.max_take_leadership_vote_interval_ms
        return now_ms + lo + (rng.randrange(hi - lo) if hi > lo else 0)
    lo, hi = cfg.min_vote_interval_ms, cfg.max_vote_interval_ms
    return now_ms + max(0, last_vote_cost_ms) + lo + (rng.randrange(hi - lo) if hi > lo else 0)


@dataclass(frozen=True, slots=True)
class VoteParse:
    """Outcome of parse_vote. `next_time_ms` None = leave the vote timer as it is;
    `candidate_term` = call changeRoleToCandidate(candidate_term) (a bigger term was seen)."""

    result: ParseResult
    next_time_ms: int | None = None
    candidate_term: int | None = None
    fast: bool = False  # rule 7 let me stand in the next term at once (I rank first)


def parse_vote(tally: VoteTally, member_count: int, now_ms: int, last_vote_cost_ms: int,
               cfg: ElectionConfig, rng: random.Random,
               taking_leadership: bool = False, fast_ok: bool = False) -> VoteParse:
    """The parse chain at the end of maintainAsCandidate, in DLedger's order (docs/election.md
    "Candidate parse"), with two changes for fast failover (docs/election.md "Failover timing"):

    - rule 2 (a voter still has a leader) retries after one heartbeat interval instead of
      timer + election timeout: a round in my current term cannot win (the voters voted for
      the old leader) nor raise anyone's term, so it disturbs nobody; and when the leader is
      dead the other followers time out a few ms after me, so a short retry is what finds them.
    - rule 7 (no leader, nobody accepted enough) is the end of a *pre-vote*: a quorum answered,
      nobody has a leader and nobody has a better log than mine. If no answering member ranks
      before me (`ahead_num == 0`, see log_ahead) and `fast_ok`, the next round (new term)
      starts at once; a member that ranks after someone waits the random timer plus one
      heartbeat interval, so the first-ranked one wins without a split vote. `fast_ok` False
      (the caller already took the fast path once in this election) falls back to the random
      timer, so two members with diverging views cannot split votes in lockstep forever.
    """

    def timer() -> int:
        return next_time_to_request_vote(now_ms, last_vote_cost_ms, cfg, rng, taking_leadership)

    # 1. Someone is in a later term: we cannot win this one; move to that term next round
    #    (WAIT_TO_VOTE_NEXT makes the next round call nextTerm(), which jumps to knownMax).
    if tally.known_max_term > tally.term:
        return VoteParse(ParseResult.WAIT_TO_VOTE_NEXT, timer(), tally.known_max_term)
    # 2. A voter still follows a leader in this term: if it is alive its next heartbeat makes
    #    me a follower within an interval; if it is dead that voter times out within about
    #    the same time. Ask again then (this term: the round cannot disturb a live leader).
    if tally.already_has_leader:
        return VoteParse(ParseResult.WAIT_TO_REVOTE,
                         now_ms + max(0, last_vote_cost_ms) + cfg.heartbeat_interval_ms)
    # 3. Not even a quorum answered: retry in the same term (no term inflation while
    #    partitioned, which is what keeps an isolated node from disrupting the group later).
    if not is_quorum(tally.valid_num, member_count):
        return VoteParse(ParseResult.WAIT_TO_REVOTE, timer())
    # 4. Too many voters have a longer log than mine: back off the longest so a better
    #    candidate goes first.
    if not is_quorum(tally.valid_num - tally.bigger_ledger_num, member_count):
        return VoteParse(ParseResult.WAIT_TO_REVOTE, timer() + cfg.max_vote_interval_ms)
    # 5. Elected.
    if is_quorum(tally.accepted_num, member_count):
        return VoteParse(ParseResult.PASSED)
    # 6. Would be elected once the NOT_READY voters have entered my term: ask again now.
    if is_quorum(tally.accepted_num + tally.not_ready_term_num, member_count):
        return VoteParse(ParseResult.REVOTE_IMMEDIATELY, now_ms)
    # 7. Split vote / pre-vote passed: next round in a new term, at once for the member that
    #    ranks first, after a random wait (+ one interval) for the others.
    if fast_ok and tally.ahead_num == 0:
        return VoteParse(ParseResult.WAIT_TO_VOTE_NEXT, now_ms, fast=True)
    if tally.ahead_num > 0:
        return VoteParse(ParseResult.WAIT_TO_VOTE_NEXT, timer() + cfg.heartbeat_interval_ms)
    return VoteParse(ParseResult.WAIT_TO_VOTE_NEXT, timer())
