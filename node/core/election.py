"""The pure election core: DLedgerLeaderElector as a deterministic state machine.

etcd-raft style, so tests and the simulator drive it deterministically: no sockets, files, clocks or
randomness inside. Time is an integer millisecond count passed in; randomness is an injected
``random.Random``; the ledger end is passed in by the caller (the handler process owns the store).
Each input returns a ``Step``: a list of effects plus the time at which ``tick`` must be called
next.

Effects, in the order they must be executed:

1. ``Persist(term, voted_for)`` -- at most one, always first: write the ``currterm`` file and
   fsync it BEFORE anything else leaves the node (etcd's "persist before send": a restarted
   node never votes twice in one term; docs/contracts.md C16).
2. ``RoleChanged(role, term, leader_id)`` -- publish to the shared state block and the
   role-change listeners (DLedger's RoleChangeHandler). Emitted whenever (role, term, leader)
   differs from the last published value.
3. ``Send(peer, message)`` -- a VOTE / HEARTBEAT request for a peer's elector port. Feed the
   answer back with ``on_response``; if it cannot be sent (peer down: ``zmq.Again`` on an
   IMMEDIATE dealer) call ``on_peer_unreachable(request_id)``. Rounds have their own deadline
   inside the core, so a silent peer costs at most that deadline.
4. ``Reply(message, token)`` -- the answer to a request; `token` is whatever the caller passed
   with the request (ROUTER identity...). TAKE_LEADERSHIP is answered later, on a role change.

How DLedger's DLedgerLeaderElector maps here:

- ``maintainState`` (run every 10 ms by StateMaintainer) = ``tick(now, ledger)``, called when
  ``Step.next_deadline_ms`` is reached and after any input (it is idempotent when nothing is due).
- ``handleVote`` = ``on_vote_request``; ``handleHeartBeat`` = ``on_heartbeat_request``;
  ``handleTakeLeadership`` = ``on_take_leadership``. The decisions themselves are the pure
  functions in vote.py / heartbeat.py; this class only applies them.
- The blocking ``voteLatch`` / ``beatLatch`` waits become explicit in-flight rounds that end
  early on the same conditions (VoteTally.done / HeartbeatTally.done) or at their deadline.
- ``needIncreaseTermImmediately`` + ``stateMaintainer.wakeup()`` is applied inline: the node
  enters the new term (durably) before it answers TERM_NOT_READY, so the candidate's immediate
  revote always finds it ready.

Deliberate differences from DLedger (docs/election.md lists them): a new leader's lease starts
at its election (DLedger keeps the previous lastSuccHeartBeatTime, so a fresh leader whose
first heartbeat round misses quorum steps down at once); a leader steps down on a higher term
in ANY response (#325); taking leadership does not require preferredLeaderIds to name the node.

Safety rules added on top of DLedger (docs/contracts.md C3, C5, C18):

- **Higher term, at once.** A higher term in any answer (or heartbeat) is entered at once,
  durably (Persist, vote cleared), before anything else; DLedger only noted it as
  knownMaxTermInGroup and a deposed leader then campaigned again in its *old* term, where its
  old voters accepted it again (docs/contracts.md C18).
- **Never lead twice in one term.** A leader that steps down (lease expired, inconsistent
  leader, store not writable) campaigns next in a new term; a (re)started node whose vote is
  for itself campaigns first in term + 1 (one that voted for another node cannot have led its
  term and rejoins it, so a restarted follower never deposes a healthy leader); every restarted
  node waits a heartbeat interval plus a randomized vote interval, so it normally hears the
  current leader first. A leader restarted with its self-vote on disk was
  otherwise re-elected in the same term, possibly with a log that lost a tail it had sent.
- **Lease from round start.** `last_succ_heartbeat_ms` (published as
  `last_quorum_heartbeat_ms`) is the START time of the last quorum heartbeat round (or of the
  vote round won): node/core/lease.py explains why the other roles may act on it.
- **Unwritable store.** A LEADER whose `LedgerEnd.writable` is False steps down; a candidate
  that cannot write does not campaign (it still votes).
- **Non-voting member.** While `LedgerEnd.voting` is False (a store repairing a damaged
  committed range, lost term/vote state) the node neither votes nor stands, refuses
  TAKE_LEADERSHIP, and a LEADER steps down; it still follows (docs/election.md). One vote is
  left to a member catching up after a lost disk: to a candidate whose log reaches its
  `LedgerEnd.vote_floor`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ipc.codes import ParseResult, ResponseCode, Role, VoteResult
from ipc.protocol import (
    ErrorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    TakeLeadershipRequest,
    TakeLeadershipResponse,
    VoteRequest,
    VoteResponse,
)
from node.core.election_types import (
    EMPTY_LEDGER,
    ElectionConfig,
    ElectorView,
    LedgerEnd,
    is_quorum,
)
from node.core.heartbeat import (
    HeartbeatAction,
    HeartbeatDecision,
    HeartbeatOutcome,
    HeartbeatParse,
    HeartbeatTally,
    decide_heartbeat,
    follower_deadline,
    follower_timed_out,
    parse_heartbeats,
)
from node.core.lost_state import vote_floor_met
from node.core.membership import Configuration, leader_steps_down
from node.core.vote import (
    VoteDecision,
    VoteParse,
    VoteTally,
    decide_vote,
    log_ahead,
    next_time_to_request_vote,
    parse_vote,
)
from node.store.term_vote import LOST_VOTE

# ---------------------------------------------------------------------------------------------
# Effects
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Persist:
    """Make (currTerm, votedFor) durable (currterm file, fsync) before executing later effects."""

    term: int
    voted_for: str | None


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """(role, term, leader) changed: publish to the shared block and role-change listeners."""

    role: Role
    term: int
    leader_id: str | None


@dataclass(frozen=True, slots=True)
class Send:
    """Send `message` to `peer`'s elector port."""

    peer: str
    message: VoteRequest | HeartbeatRequest


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer a request; `token` is the caller's routing handle given with the request."""

    message: VoteResponse | HeartbeatResponse | TakeLeadershipResponse | ErrorResponse
    token: object = None


@dataclass(frozen=True, slots=True)
class LeadershipConfirmed:
    """A heartbeat round that started at `round_started_ms` reached a quorum, and it started
    at or after a confirmation `token` asked for (`request_heartbeat`): tell whoever is behind
    the token (the handler, on the control channel) at once, instead of leaving it to find the
    new quorum time in the block on its next poll. A hint: the block stays the truth (C4)."""

    token: object
    round_started_ms: int


Effect = Persist | RoleChanged | Send | Reply | LeadershipConfirmed

MAX_CONFIRM_WAITERS = 64
"""Confirmation requests remembered at once. Requests from one token collapse to at most two
(one for the round in flight, one for the next), and a node has one handler: more than this
means tokens of dead handler incarnations, the oldest of which are forgotten."""


@dataclass(slots=True)
class Step:
    """Output of every ElectorCore input: effects in execution order + the next tick time."""

    effects: list[Effect]
    next_deadline_ms: int

    def of(self, kind: type) -> list:
        """Effects of one type (tests and logs)."""
        return [e for e in self.effects if isinstance(e, kind)]


# ---------------------------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _VoteRound:
    term: int
    tally: VoteTally
    started_ms: int
    deadline_ms: int
    ledger: LedgerEnd = EMPTY_LEDGER  # mine when the round started (log_ahead compares)


@dataclass(slots=True, eq=False)
class _HeartbeatRound:
    term: int
    tally: HeartbeatTally
    deadline_ms: int
    started_ms: int


@dataclass(frozen=True, slots=True)
class VoteRoundRecord:
    """What one finished vote round saw and decided: read-only, for logs and the failover
    bench's per-kill breakdown (why an election needed more than one round)."""

    term: int
    result: ParseResult
    accepted: int
    valid: int
    bigger_ledger: int
    not_ready: int
    already_has_leader: bool
    cost_ms: int
    next_vote_in_ms: int | None


@dataclass(slots=True)
class _PendingTake:
    token: object
    request_id: int


@dataclass(slots=True)
class _Outbox:
    sends: list[Send] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    confirms: list[LeadershipConfirmed] = field(default_factory=list)


_TERM_BEARING_CODES = frozenset({
    ResponseCode.SUCCESS, ResponseCode.EXPIRED_TERM, ResponseCode.INCONSISTENT_LEADER,
    ResponseCode.TERM_NOT_READY})
"""Answer codes whose `term` is the answering member's term in *this* group. Envelope errors
(UNKNOWN_GROUP, UNKNOWN_MEMBER...) carry the term of whatever answered, which may be a node of
another group on a misconfigured port: never adopted."""


class ElectorCore:
    """One member's election state machine (MemberState's election fields + the elector).

    Starts as CANDIDATE in its persisted term with its persisted vote (DLedger's MemberState starts
    as candidate). Its first campaign waits one heartbeat interval plus a randomized vote interval
    (DLedger votes at once), and if its persisted vote is for itself it is in a NEW term (term + 1):
    a node restarted with its self-vote on disk could otherwise be elected a second time in the term
    it led (with a log that may have lost a tail it had already sent). A node that voted for another
    node, or not at all, cannot have led its term, so it rejoins that term: restarting a follower
    must not depose a healthy leader by bringing a higher term back with it. A `new_member`
    (nothing on disk: no vote, no log, in a group the elector found new) skips the heartbeat
    interval: there is no leader to hear, and the vote rules alone keep elections safe.
    """

    def __init__(self, self_id: str, members: Iterable[str] | Configuration, group: str = "default",
                 cfg: ElectionConfig | None = None, rng: random.Random | None = None, *,
                 term: int = 0, voted_for: str | None = None, now_ms: int = 0,
                 new_member: bool = False, peers: Iterable[str] = ()) -> None:
        self.cfg = (cfg or ElectionConfig()).validate()
        # Tests inject a seeded Random; the default is OS-seeded because identical sequences
        # on all members would synchronize their vote timers (endless split votes).
        self.rng = rng if rng is not None else random.Random()
        self.self_id = self_id
        self.group = group
        # The voters of a Configuration (docs/membership.md), or a plain id list (every one a
        # voter: the bootstrap configuration, as tests and tools give it). Learners do not vote
        # and are not counted: `_n` is the voter count every tally divides.
        # A plain list must name this node; a Configuration need not (a learner, or a member the
        # newest configuration removed: it follows, answers votes, never stands or counts).
        if not isinstance(members, Configuration):
            ids = tuple(dict.fromkeys(members))
            if self_id not in ids:
                raise ValueError(f"self id {self_id!r} is not among the voters {ids}")
        # Whose heartbeats this node follows besides its newest configuration's members: the
        # `--peers` members. A node whose configuration is stale (it was removed, or missed
        # the entry adding another leader) must still follow the group's leader, or it never
        # receives the entries that bring it up to date (Raft: append entries are accepted
        # whatever the receiver's configuration; votes are where configurations decide).
        self._known_leaders = frozenset(peers)
        self._set_members(members)

        # MemberState
        self.role = Role.CANDIDATE
        self.term = term
        self.voted_for = voted_for
        self.leader_id: str | None = None
        self.known_max_term = -1  # knownMaxTermInGroup (not persisted, as in DLedger)
        self.term_to_take_leadership = -1
        self.peers_alive: dict[str, bool] = {}  # peersLiveTable (leader's view)

        # DLedgerLeaderElector timers (ms; None = "never"/"send at once")
        self.last_leader_heartbeat_ms = now_ms
        self.last_send_heartbeat_ms: int | None = None
        self.last_succ_heartbeat_ms = now_ms
        self.last_vote_cost_ms = 0
        # Restart rule (class docstring): a node whose vote in its term is for itself may have
        # led that term, so its first campaign is in term + 1. One that voted for another node
        # (or not at all) can never have led it; it first tries to rejoin that term, so a
        # restarted follower hears the leader of its term instead of deposing it with a higher
        # term. Either way it waits until the leader had a chance to be heard. The timer is
        # drawn on first use (next_vote_ms), so an `rng` replaced right after construction
        # (the simulator's seeded one) decides it too.
        # Term 0 is "no term yet" (a brand-new store): the first election is in term 1.
        rejoin = voted_for != self_id and term > 0
        self.last_parse = ParseResult.WAIT_TO_REVOTE if rejoin else ParseResult.WAIT_TO_VOTE_NEXT
        self._started_ms = now_ms
        # A new member (never voted: no term/vote file; an empty store) of a group with no
        # history has no leader to hear first: its first campaign waits the randomized vote
        # interval only, not the heartbeat interval before it. Timing only: votes decide.
        self._first_wait_ms = 0 if new_member else self.cfg.heartbeat_interval_ms
        # ... and it draws from the lower half of the vote interval: members of a new group
        # start together, and the first of them stands sooner; a split vote (they all stood
        # within one round trip) only costs a round, then the full interval applies.
        self._first_cfg = self.cfg if not new_member else replace(
            self.cfg, max_vote_interval_ms=max(self.cfg.min_vote_interval_ms + 1, (
                self.cfg.min_vote_interval_ms + self.cfg.max_vote_interval_ms) // 2))
        self._next_vote_ms: int | None = None
        # The newest term in which this node's voter set changed (a configuration from the log
        # counted at start, or a change since); -1: never. A round won in that term or before
        # does not make it leader: it was a pre-vote, the next round is in a new term. Why: DLedger's candidates revote in their current
        # term, which is safe while one voter set decides a term (each voter votes once in it,
        # so two majorities of it share a voter). A configuration change inside a term breaks
        # that: a leader elected by {n2} alone, then {n1} alone after n2 removed itself, and n1,
        # which never voted in that term, elected itself in it too: two leaders of one term
        # (found by the simulator's membership fault). Static groups never set it.
        self._stale_term = self.term if self.configuration is not None and self.configuration.index >= 0 else -1
        self._beat_requested = False  # request_heartbeat while a round was in flight
        # (token, asked at) of confirmations waiting for a quorum round that started at or
        # after `asked at` (request_heartbeat with a token): answered by LeadershipConfirmed.
        self._confirm_waiters: list[tuple[object, int]] = []

        self._vote_round: _VoteRound | None = None
        self._hb_round: _HeartbeatRound | None = None
        self._inflight: dict[int, tuple[_VoteRound | _HeartbeatRound, str]] = {}
        self._next_rid = 1
        self._pending_take: _PendingTake | None = None
        self.last_vote_round: VoteRoundRecord | None = None  # observability only
        # parse_vote's fast path (stand in the next term at once) is taken once per election;
        # reset when a leader is known again (follower or leader).
        self._fast_used = False
        # Left to the candidate that woke this node (TERM_NOT_READY): added to the vote timer
        # until the timer is set again or a leader is known (`_vote_due_ms`).
        self._head_start_ms = 0
        self._persisted = (term, voted_for)
        self._published = (self.role, self.term, self.leader_id)
        self._out = _Outbox()

    def _set_members(self, members: Iterable[str] | Configuration) -> None:
        """The sets every count and every send uses, from one configuration:

        * `members`: the voters, the only ones a tally counts (`_n` of them);
        * `others`: the voters but this node, whom a vote round asks;
        * `beat_to`: every member but this node, learners too, whom heartbeats go to (a learner
          must know the leader to accept its pushes), though only voters' answers count;
        * `_member_set`: every member, voters and learners, and every `--peers` member: the
          candidates this node may vote for. Refusing a `--peers` member because this node's
          newest configuration lacks it deadlocked a group (simulator seed 510003: n0 still
          counted the entry removing n1, n1 and n2 the later one removing n2 and re-adding n1;
          each candidate needed a vote its voter refused, for ever). Raft's safety is in the
          candidate's count (only its configuration's voters) and the log comparison, not in
          whom a voter knows; a removed member is kept from disrupting by pre-vote and leader
          stickiness (docs/membership.md "Removed members cannot disrupt");
        * `stands`: whether this node may stand or count itself (a voter)."""
        self.configuration = members if isinstance(members, Configuration) else None
        if self.configuration is not None:
            self.members = self.configuration.voters
            everyone = self.configuration.ids
        else:
            self.members = everyone = tuple(dict.fromkeys(members))
        self.others = tuple(m for m in self.members if m != self.self_id)
        self.beat_to = tuple(m for m in everyone if m != self.self_id)
        self._member_set = frozenset(everyone) | self._known_leaders
        self._voter_set = frozenset(self.members)
        self._n = len(self.members)
        self.stands = self.self_id in self._voter_set

    def _may_stand(self, ledger: LedgerEnd) -> bool:
        """A voter of its newest configuration stands. So does a member that configuration
        removed, while it is not committed (Raft's dissertation, 4.2.2): it may hold the only
        copy of the entry that removes it, as the leader that removed itself does until its
        change commits. If it stood back, the remaining voters (still counting it: they lack
        the entry) could elect nobody, since it has the longer log (found by the simulator's
        membership fault). Elected, it counts only the new voters, commits the entry and steps
        down (`leader_steps_down`). A learner never stands."""
        if self.stands:
            return True
        c = self.configuration
        return c is not None and c.member(self.self_id) is None and ledger.committed < c.index

    def set_configuration(self, config: Configuration, now_ms: int) -> None:
        """The newest configuration in this node's log changed (appended, or rolled back by a
        truncation): count its voters from now on. Rounds in flight were counted against the
        old one and are dropped, so no decision mixes two configurations: a leader beats again
        at once, a candidate asks again at once (same term: its own vote stands)."""
        if config == self.configuration:
            return
        self._set_members(config)
        self._stale_term = self.term
        self._inflight.clear()
        if self._hb_round is not None:
            self._hb_round = None
            self.last_send_heartbeat_ms = None
        if self._vote_round is not None:
            self._vote_round = None
            self.next_vote_ms = now_ms

    @property
    def next_vote_ms(self) -> int:
        """nextTimeToRequestVote: when a candidate's next vote round may start."""
        if self._next_vote_ms is None:
            self._next_vote_ms = self._first_wait_ms + next_time_to_request_vote(
                self._started_ms, 0, self._first_cfg, self.rng)
        return self._next_vote_ms

    @next_vote_ms.setter
    def next_vote_ms(self, value: int) -> None:
        self._next_vote_ms = value
        self._head_start_ms = 0  # a timer set for any other reason owes nobody a head start

    def _vote_due_ms(self) -> int:
        """When this candidate may stand: its vote timer, after the head start it owes the
        candidate that woke it, if any."""
        return self.next_vote_ms + self._head_start_ms

    # ------------------------------------------------------------------ read-only views

    @property
    def taking_leadership(self) -> bool:
        """isTakingLeadership(): a TAKE_LEADERSHIP for the current term is in progress."""
        return self.term_to_take_leadership == self.term

    def view(self, ledger: LedgerEnd = EMPTY_LEDGER) -> ElectorView:
        """The snapshot the decision functions read (what DLedger reads under the lock)."""
        return ElectorView(self.self_id, self.group, self._member_set, self.term,
                           self.voted_for, self.leader_id, ledger.index, ledger.term,
                           self.taking_leadership)

    def snapshot(self) -> RoleChanged:
        """Current (role, term, leader), e.g. to publish the initial state at startup."""
        return RoleChanged(self.role, self.term, self.leader_id)

    def next_deadline(self, now_ms: int) -> int:
        """When `tick` must run next (never earlier than now)."""
        due: list[int] = []
        if self._vote_round is not None:
            due.append(self._vote_round.deadline_ms)
        if self._hb_round is not None:
            due.append(self._hb_round.deadline_ms)
        if self.role == Role.LEADER:
            last = self.last_send_heartbeat_ms
            due.append(now_ms if last is None else last + self.cfg.heartbeat_interval_ms)
        elif self.role == Role.FOLLOWER:
            due.append(follower_deadline(self.last_leader_heartbeat_ms, self.cfg))
        elif self._vote_round is None:
            due.append(self._vote_due_ms())
        return max(now_ms, min(due))

    # ------------------------------------------------------------------ inputs

    def tick(self, now_ms: int, ledger: LedgerEnd = EMPTY_LEDGER) -> Step:
        """maintainState(): end overdue rounds, then run the current role's step."""
        self._expire_rounds(now_ms, force=False)
        self._maintain(now_ms, ledger)
        return self._finish(now_ms)

    def on_round_timeout(self, now_ms: int, ledger: LedgerEnd = EMPTY_LEDGER) -> Step:
        """End the in-flight rounds now with what was received (caller-tracked deadline)."""
        self._expire_rounds(now_ms, force=True)
        self._maintain(now_ms, ledger)
        return self._finish(now_ms)

    def request_heartbeat(self, now_ms: int, token: object = None) -> Step:
        """Confirm leadership now (C4, linearizable reads): start a heartbeat round at once.

        The handler parks a linearizable GET that arrived at t and serves it once the block
        shows `last_quorum_heartbeat_ms >= t` in the same term, i.e. once a round that
        *started* after t reached a quorum. If a round is already in flight it is not cut
        short (its answers would be lost, and under a steady stream of confirmations no round
        would ever complete): the next round starts the moment it ends, so every request that
        arrived meanwhile is confirmed by that one round. Not leader: nothing happens (the
        handler sees the role change and answers NOT_LEADER).

        With a `token`, the round that confirms this request also emits
        `LeadershipConfirmed(token, ...)`: the handler then serves its parked reads at once
        rather than on its next look at the block (a 5 ms poll: 4.7 of a 6 ms read)."""
        if self.role == Role.LEADER:
            if token is not None:
                self._add_confirm_waiter(token, now_ms)
            if self._hb_round is None:
                self._start_heartbeat_round(now_ms)
            else:
                self._beat_requested = True
        return self._finish(now_ms)

    def _add_confirm_waiter(self, token: object, now_ms: int) -> None:
        """Remember that `token` wants to hear of a quorum round starting at or after now. A
        request is redundant when the same token already waits for a round that has not
        started yet (with no round in flight, the next one starts now): that round answers
        both. So one token holds at most two entries, however many reads arrive."""
        in_flight = self._hb_round.started_ms if self._hb_round is not None else None
        for t, asked in self._confirm_waiters:
            if t == token and (in_flight is None or asked > in_flight):
                return
        self._confirm_waiters.append((token, now_ms))
        del self._confirm_waiters[:-MAX_CONFIRM_WAITERS]

    def _release_confirm_waiters(self, round_started_ms: int) -> None:
        """A quorum round that started at `round_started_ms`: answer every token that asked at
        or before then (one LeadershipConfirmed per token), keep the later ones."""
        keep: list[tuple[object, int]] = []
        told: list[object] = []
        for t, asked in self._confirm_waiters:
            if asked > round_started_ms:
                keep.append((t, asked))
            elif t not in told:
                told.append(t)
        self._confirm_waiters = keep
        self._out.confirms += [LeadershipConfirmed(t, round_started_ms) for t in told]

    def on_vote_request(self, req: VoteRequest, ledger: LedgerEnd, now_ms: int,
                        token: object = None) -> Step:
        """handleVote(request, false). Execute the Persist effect before the Reply."""
        if not ledger.voting and (ledger.vote_floor is None or not vote_floor_met(
                req.ledger_end_term, req.ledger_end_index, ledger.vote_floor)):
            # No vote and no term adoption: UNKNOWN is "no valid answer" to the candidate, so a
            # round that needed this node retries in its term instead of inflating terms. A
            # member catching up after a lost disk answers a candidate holding everything it
            # could have stored as any voter does (node/core/lost_state.py).
            self._out.replies.append(Reply(VoteResponse(
                int(ResponseCode.SUCCESS), self.group, self.term, self.leader_id or "",
                VoteResult.UNKNOWN, ledger.term, ledger.index, req.request_id), token))
            return self._finish(now_ms)
        d: VoteDecision = decide_vote(self.view(ledger), req)
        if d.candidate_term is not None:
            # changeRoleToCandidate(request.term) + needIncreaseTermImmediately, applied now.
            # The candidate revotes the moment its round ends (REVOTE_IMMEDIATELY), and on a
            # loaded machine that round can take most of its timeout: this node leaves it that
            # long before standing in the term itself. Otherwise it may vote for itself first,
            # and a candidate whose log is as good as any (a transfer target) loses to the very
            # member it woke up (docs/election.md "Decisions and deviations from DLedger").
            self._change_role_to_candidate(d.candidate_term)
            self._increase_term_now(now_ms, head_start_ms=self.cfg.vote_round_timeout_ms)
        if d.grant_to is not None:
            self.voted_for = d.grant_to  # memberState.setCurrVoteFor -> Persist effect
        self._out.replies.append(Reply(VoteResponse(
            int(d.code), self.group, d.reply_term, self.leader_id or "", d.result,
            ledger.term, ledger.index, req.request_id), token))
        return self._finish(now_ms)

    def on_heartbeat_request(self, req: HeartbeatRequest, now_ms: int,
                             token: object = None) -> Step:
        """handleHeartBeat(request)."""
        # view.peers holds the --peers members too (`_member_set`): a node whose configuration
        # is stale still follows the group's leader
        d: HeartbeatDecision = decide_heartbeat(self.view(EMPTY_LEDGER), req, now_ms)
        if d.action is HeartbeatAction.REFRESH:
            self.last_leader_heartbeat_ms = now_ms
        elif d.action is HeartbeatAction.BECOME_FOLLOWER:
            assert d.term is not None and d.leader_id is not None
            self._change_role_to_follower(d.term, d.leader_id, now_ms)
        elif d.action is HeartbeatAction.BECOME_CANDIDATE:
            assert d.term is not None
            self._change_role_to_candidate(d.term)
            self._increase_term_now(now_ms)
        self._out.replies.append(Reply(HeartbeatResponse(
            int(d.code), self.group, d.reply_term, self.leader_id or "", req.request_id), token))
        return self._finish(now_ms)

    def on_take_leadership(self, req: TakeLeadershipRequest, now_ms: int,
                           token: object = None, ledger: LedgerEnd = EMPTY_LEDGER) -> Step:
        """handleTakeLeadership: start an election in term+1 at once (leadership transfer).

        The reply is deferred until the outcome is known (TakeLeadershipTask.check): SUCCESS
        when this node becomes leader in that term, TAKE_LEADERSHIP_FAILED if it ends up a
        follower, EXPIRED_TERM if the group moved past that term. A node whose store is not
        writable refuses at once (TAKE_LEADERSHIP_FAILED): it could not lead, and entering
        term + 1 without standing would only depose the current leader.
        """
        code = None
        if req.group != self.group:
            code = ResponseCode.UNKNOWN_GROUP
        elif req.remote_id != self.self_id or req.leader_id not in self._member_set:
            code = ResponseCode.UNKNOWN_MEMBER
        elif req.leader_id == self.self_id:
            code = ResponseCode.UNEXPECTED_MEMBER
        elif req.term != self.term:
            code = ResponseCode.INCONSISTENT_TERM  # "[BUG] currTerm != request.term"
        elif not ledger.writable or not ledger.voting or not self.stands:
            code = ResponseCode.TAKE_LEADERSHIP_FAILED
        if code is not None:
            self._out.replies.append(Reply(TakeLeadershipResponse(
                int(code), self.group, self.term, self.leader_id or "", req.request_id), token))
            return self._finish(now_ms)
        if self._pending_take is not None:  # superseded: answer the older one now
            self._reply_take(ResponseCode.TAKE_LEADERSHIP_FAILED, self.term)
        target = req.term + 1
        self.term_to_take_leadership = target
        self._pending_take = _PendingTake(token, req.request_id)
        self._change_role_to_candidate(target)
        self._increase_term_now(now_ms)
        return self._finish(now_ms)

    def on_response(self, resp: VoteResponse | HeartbeatResponse | ErrorResponse,
                    now_ms: int) -> Step:
        """A peer answered one of our Send effects (matched by request id)."""
        # #325, generalized: ANY higher term in an answer of this group, whatever round it
        # belongs to, is entered at once (Persist first, vote cleared); a leader steps down.
        if (resp.term > self.term and isinstance(resp, (VoteResponse, HeartbeatResponse))
                and resp.group == self.group and resp.code in _TERM_BEARING_CODES):
            self._enter_higher_term(resp.term, now_ms)
        entry = self._inflight.pop(resp.request_id, None)
        if entry is not None:
            rnd, peer = entry
            if isinstance(rnd, _HeartbeatRound):
                self.peers_alive[peer] = resp.code != ResponseCode.NETWORK_ERROR
                if rnd is self._hb_round and peer in self._voter_set:  # a learner's answer counts for nothing
                    rnd.tally.add(resp.code, resp.term)
                    if rnd.tally.done(self._n):
                        self._finish_heartbeat_round(now_ms)
            elif rnd is self._vote_round:
                ahead = False
                if isinstance(resp, VoteResponse):
                    result = resp.vote_result
                    ahead = log_ahead(peer, (resp.ledger_end_term, resp.ledger_end_index),
                                      self.self_id, (rnd.ledger.term, rnd.ledger.index),
                                      self.members)
                else:
                    result = VoteResult.UNKNOWN
                rnd.tally.add(result, resp.term, ahead)
                if rnd.tally.done(self._n):
                    self._finish_vote_round(now_ms)
        return self._finish(now_ms)

    # DLedger names, for readers coming from the Java source.
    on_vote_response = on_response
    on_heartbeat_response = on_response

    def on_peer_unreachable(self, request_id: int, now_ms: int) -> Step:
        """A Send could not be delivered (or the transport gave up): count it as no answer."""
        entry = self._inflight.pop(request_id, None)
        if entry is not None:
            rnd, peer = entry
            if peer in self._voter_set:  # a learner's silence counts for nothing
                rnd.tally.add(None)
            if isinstance(rnd, _HeartbeatRound):
                self.peers_alive[peer] = False  # peersLiveTable.put(id, FALSE)
                if rnd is self._hb_round and rnd.tally.done(self._n):
                    self._finish_heartbeat_round(now_ms)
            elif rnd is self._vote_round and rnd.tally.done(self._n):
                self._finish_vote_round(now_ms)
        return self._finish(now_ms)

    def handle(self, msg: Message, now_ms: int, ledger: LedgerEnd = EMPTY_LEDGER,
               token: object = None) -> Step:
        """Dispatch any decoded elector-port message; anything else gets UNSUPPORTED."""
        if isinstance(msg, VoteRequest):
            return self.on_vote_request(msg, ledger, now_ms, token)
        if isinstance(msg, HeartbeatRequest):
            return self.on_heartbeat_request(msg, now_ms, token)
        if isinstance(msg, TakeLeadershipRequest):
            return self.on_take_leadership(msg, now_ms, token, ledger)
        if isinstance(msg, (VoteResponse, HeartbeatResponse, ErrorResponse)):
            return self.on_response(msg, now_ms)
        self._out.replies.append(Reply(ErrorResponse(
            int(ResponseCode.UNSUPPORTED), self.group, self.term, self.leader_id or "",
            f"{type(msg).__name__} is not served on the elector port", int(msg.TYPE),
            msg.request_id), token))
        return self._finish(now_ms)

    # ------------------------------------------------------------------ maintain (per role)

    def _maintain(self, now_ms: int, ledger: LedgerEnd) -> None:
        # A role change inside one step (follower times out -> candidate votes at once, a
        # single-node candidate wins -> leader beats) is run through in the same tick.
        for _ in range(3):
            before = self.role
            if self.role == Role.LEADER:
                self._maintain_as_leader(now_ms, ledger)
            elif self.role == Role.FOLLOWER:
                self._maintain_as_follower(now_ms)
            else:
                self._maintain_as_candidate(now_ms, ledger)
            if self.role == before:
                break

    def _maintain_as_leader(self, now_ms: int, ledger: LedgerEnd) -> None:
        if not ledger.writable or not ledger.voting:
            # C5: a leader whose handler cannot write would answer but never commit; step down
            # so that a member that can write takes over.
            self._step_down(now_ms)
            return
        if (self.configuration is not None and not self.stands
                and leader_steps_down(self.self_id, self.configuration, ledger.committed)):
            # It removed itself, and that configuration committed (on the new voters alone):
            # its work is done; the voters elect one of themselves (docs/membership.md).
            self._step_down(now_ms)
            return
        last = self.last_send_heartbeat_ms
        if last is not None and now_ms - last < self.cfg.heartbeat_interval_ms:
            return
        if self._hb_round is not None:  # its interval is over: parse what arrived
            self._finish_heartbeat_round(now_ms)
            if self.role != Role.LEADER:
                return
        self._start_heartbeat_round(now_ms)

    def _start_heartbeat_round(self, now_ms: int) -> None:
        self.last_send_heartbeat_ms = now_ms
        self._beat_requested = False
        # A leader that is not a voter of its newest configuration (it removed itself) does not
        # count itself: its lease needs a majority of the voters without it.
        tally = HeartbeatTally(self.term) if self.stands else HeartbeatTally(self.term, 0, 0)
        rnd = _HeartbeatRound(self.term, tally, now_ms + self.cfg.heartbeat_interval_ms, now_ms)
        self._hb_round = rnd
        for peer in self.beat_to:
            rid = self._rid(rnd, peer)
            self._out.sends.append(Send(peer, HeartbeatRequest(
                self.group, peer, self.self_id, self.term, rid)))
        if rnd.tally.done(self._n):  # one-node group
            self._finish_heartbeat_round(now_ms)

    def _maintain_as_follower(self, now_ms: int) -> None:
        if follower_timed_out(now_ms, self.last_leader_heartbeat_ms, self.cfg):
            self._change_role_to_candidate(self.term)  # same term; the vote decides the rest

    def _maintain_as_candidate(self, now_ms: int, ledger: LedgerEnd) -> None:
        if self._vote_round is not None or now_ms < self._vote_due_ms():
            return
        if not ledger.writable or not ledger.voting or not self._may_stand(ledger):
            # Not a voter of its newest configuration (a learner, removed): does not stand.
            # C5: could not write a NOOP if elected (or must not vote, not even for itself):
            # look again after another vote interval
            # (re-arming the timer also keeps the caller from spinning on a past deadline).
            self.next_vote_ms = next_time_to_request_vote(now_ms, 0, self.cfg, self.rng)
            return
        if self.last_parse == ParseResult.WAIT_TO_VOTE_NEXT or self.voted_for == LOST_VOTE:
            # A vote it cannot name (its term/vote state was lost: node/core/lost_state.py) may
            # have been for itself, and then it may have led this term: it stands only in a
            # later one. Standing again in it, the voters that elected it before grant the same
            # candidate again (the simulator's lost-disk fault, seed 11,709: one node led one
            # term twice).
            self._next_term()
            self.last_parse = ParseResult.WAIT_TO_REVOTE
        self._start_vote_round(now_ms, ledger)

    def _start_vote_round(self, now_ms: int, ledger: LedgerEnd) -> None:
        """voteForQuorumResponses: vote for myself (through handleVote, self=true), ask peers."""
        term = self.term
        d = decide_vote(self.view(ledger), VoteRequest(
            self.group, self.self_id, self.self_id, term, ledger.term, ledger.index), is_self=True)
        if d.grant_to is not None:
            self.voted_for = d.grant_to  # persisted (Persist effect) before the Sends go out
        rnd = _VoteRound(term, VoteTally(term), now_ms, now_ms + self.cfg.vote_round_timeout_ms,
                         ledger)
        if self.stands:  # a removed member standing (`_may_stand`) counts only the voters
            rnd.tally.add(d.result, d.reply_term)
        self._vote_round = rnd
        for peer in self.others:
            rid = self._rid(rnd, peer)
            self._out.sends.append(Send(peer, VoteRequest(
                self.group, peer, self.self_id, term, ledger.term, ledger.index, rid)))
        if rnd.tally.done(self._n):
            self._finish_vote_round(now_ms)

    # ------------------------------------------------------------------ rounds

    def _expire_rounds(self, now_ms: int, force: bool) -> None:
        if self._vote_round is not None and (force or now_ms >= self._vote_round.deadline_ms):
            self._finish_vote_round(now_ms)
        if self._hb_round is not None and (force or now_ms >= self._hb_round.deadline_ms):
            self._finish_heartbeat_round(now_ms)

    def _finish_vote_round(self, now_ms: int) -> None:
        rnd, self._vote_round = self._vote_round, None
        if rnd is None or self.role != Role.CANDIDATE or self.term != rnd.term:
            return  # abandoned: we moved on (follower, or a new term) while it was in flight
        self.last_vote_cost_ms = now_ms - rnd.started_ms
        p: VoteParse = parse_vote(rnd.tally, self._n, now_ms, self.last_vote_cost_ms, self.cfg,
                                  self.rng, self.taking_leadership, fast_ok=not self._fast_used)
        self.last_parse = p.result
        if p.fast:
            self._fast_used = True
        if p.next_time_ms is not None:
            self.next_vote_ms = p.next_time_ms
        t = rnd.tally
        self.last_vote_round = VoteRoundRecord(
            rnd.term, p.result, t.accepted_num, t.valid_num, t.bigger_ledger_num,
            t.not_ready_term_num, t.already_has_leader, self.last_vote_cost_ms,
            None if p.next_time_ms is None else p.next_time_ms - now_ms)
        if p.candidate_term is not None:
            self._change_role_to_candidate(p.candidate_term)
        if p.result == ParseResult.PASSED and rnd.term <= self._stale_term:
            # Its voter set changed in this term: a round in it is a pre-vote only (it found
            # nobody following a leader, so nobody is disturbed); it wins in the next term.
            self.last_parse = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_vote_ms = now_ms
            return
        if p.result == ParseResult.PASSED:
            self._change_role_to_leader(rnd.term, rnd.started_ms)

    def _finish_heartbeat_round(self, now_ms: int) -> None:
        rnd, self._hb_round = self._hb_round, None
        if rnd is None or self.role != Role.LEADER or self.term != rnd.term:
            return
        p: HeartbeatParse = parse_heartbeats(rnd.tally, self._n, now_ms,
                                             self.last_succ_heartbeat_ms, self.cfg)
        o = p.outcome
        if o is HeartbeatOutcome.QUORUM:
            # The round's START (lease.py): its receivers reset their timers after it began.
            self.last_succ_heartbeat_ms = max(self.last_succ_heartbeat_ms, rnd.started_ms)
            self._release_confirm_waiters(rnd.started_ms)
        elif o is HeartbeatOutcome.RESEND_NOW:
            self.last_send_heartbeat_ms = None
        elif o is HeartbeatOutcome.STEP_DOWN_HIGHER_TERM:
            assert p.term is not None
            self._enter_higher_term(p.term, now_ms)
            return
        elif o is not HeartbeatOutcome.NO_QUORUM_YET:
            self._step_down(now_ms)
            return
        if self._beat_requested:
            self.last_send_heartbeat_ms = None  # a confirmation is waiting: next round now

    def _rid(self, rnd: _VoteRound | _HeartbeatRound, peer: str) -> int:
        rid = self._next_rid
        self._next_rid += 1
        if len(self._inflight) > 8 * self._n:
            # Bound memory: forget requests of finished rounds that never got an answer.
            live = (self._vote_round, self._hb_round, rnd)
            self._inflight = {k: v for k, v in self._inflight.items() if v[0] in live}
        self._inflight[rid] = (rnd, peer)
        return rid

    # ------------------------------------------------------------------ MemberState changes

    def _next_term(self) -> None:
        """MemberState.nextTerm(): jump to knownMaxTermInGroup if ahead, else +1; clear vote."""
        assert self.role == Role.CANDIDATE
        self.term = self.known_max_term if self.known_max_term > self.term else self.term + 1
        self.voted_for = None
        self._vote_round = None  # a round of the old term can no longer count

    def _increase_term_now(self, now_ms: int, head_start_ms: int = 0) -> None:
        """maintainAsCandidate's needIncreaseTermImmediately branch: enter the new term now,
        then wait a (randomized) vote interval, plus `head_start_ms` owed to the candidate that
        woke this node (`_vote_due_ms`), before asking for votes ourselves."""
        if self.role != Role.CANDIDATE:
            return
        self._next_term()
        self.last_parse = ParseResult.WAIT_TO_REVOTE
        self.next_vote_ms = next_time_to_request_vote(
            now_ms, self.last_vote_cost_ms, self.cfg, self.rng, self.taking_leadership)
        self._head_start_ms = head_start_ms  # after the timer: setting it clears any head start

    def _enter_higher_term(self, term: int, now_ms: int) -> None:
        """A member is in `term` > mine: enter it at once, durably (Persist, vote cleared),
        as candidate with a fresh vote timer. A leader deposed this way must not campaign again
        in its old term, where its old voters would accept it again (docs/contracts.md C18)."""
        if term <= self.term:
            return
        self._change_role_to_candidate(term)
        self._increase_term_now(now_ms)

    def _step_down(self, now_ms: int) -> None:
        """A leader gives up leadership in its own term (lease over, inconsistent leader, store
        not writable). Its next campaign is in a new term (WAIT_TO_VOTE_NEXT) after a vote
        interval: never lead twice in one term, and give a member that can lead a head start."""
        self._change_role_to_candidate(self.term)
        self.last_parse = ParseResult.WAIT_TO_VOTE_NEXT
        self.next_vote_ms = next_time_to_request_vote(now_ms, 0, self.cfg, self.rng,
                                                      self.taking_leadership)

    def _change_role_to_candidate(self, term: int) -> None:
        """changeRoleToCandidate(term): only records the term as known; nextTerm enters it."""
        if term < self.term:
            return  # "skip to be candidate in term"
        if term > self.known_max_term:
            self.known_max_term = term
        self.role = Role.CANDIDATE
        self.leader_id = None
        self._hb_round = None
        self._check_take_leadership(term, Role.CANDIDATE)

    def _change_role_to_leader(self, term: int, round_started_ms: int) -> None:
        if self.term != term:
            return  # "skip to be the leader in term"
        self.role = Role.LEADER
        self._head_start_ms = 0
        self.leader_id = self.self_id
        self.last_send_heartbeat_ms = None  # lastSendHeartBeatTime = -1: beat at once
        # The election itself was a quorum contact; like a heartbeat round it counts from its
        # start (lease.py).
        self.last_succ_heartbeat_ms = round_started_ms
        self._beat_requested = False
        self._fast_used = False
        self.peers_alive.clear()
        self._vote_round = None
        self._check_take_leadership(term, Role.LEADER)

    def _change_role_to_follower(self, term: int, leader_id: str, now_ms: int) -> None:
        self.last_parse = ParseResult.WAIT_TO_REVOTE
        self._head_start_ms = 0
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.last_leader_heartbeat_ms = now_ms
        self._fast_used = False
        self._vote_round = None
        self._hb_round = None
        self._check_take_leadership(term, Role.FOLLOWER)

    def _check_take_leadership(self, term: int, role: Role) -> None:
        """TakeLeadershipTask.check: answer a pending TAKE_LEADERSHIP once the outcome is known."""
        target = self.term_to_take_leadership
        if target == -1 or self._pending_take is None:
            return
        if term > target:
            code = ResponseCode.EXPIRED_TERM
        elif term == target:
            if role == Role.LEADER:
                code = ResponseCode.SUCCESS
            elif role == Role.FOLLOWER:
                code = ResponseCode.TAKE_LEADERSHIP_FAILED
            else:
                return  # still campaigning
        else:
            # "may receive a heartbeat before the term increase and become follower"
            code = (ResponseCode.TAKE_LEADERSHIP_FAILED if role == Role.FOLLOWER
                    else ResponseCode.INTERNAL_ERROR)
        self._reply_take(code, term)

    def _reply_take(self, code: ResponseCode, term: int) -> None:
        p = self._pending_take
        assert p is not None
        self._out.replies.append(Reply(TakeLeadershipResponse(
            int(code), self.group, term, self.leader_id or "", p.request_id), p.token))
        self._pending_take = None
        self.term_to_take_leadership = -1

    # ------------------------------------------------------------------ output

    def _finish(self, now_ms: int) -> Step:
        effects: list[Effect] = []
        state = (self.term, self.voted_for)
        if state != self._persisted:
            self._persisted = state
            effects.append(Persist(*state))
        published = (self.role, self.term, self.leader_id)
        if published != self._published:
            self._published = published
            effects.append(RoleChanged(*published))
        if self.role != Role.LEADER:
            self._confirm_waiters.clear()  # the handler answers NOT_LEADER on the role change
        out, self._out = self._out, _Outbox()
        effects += out.sends
        effects += out.replies
        effects += out.confirms
        return Step(effects, self.next_deadline(now_ms))


__all__ = [
    "EMPTY_LEDGER",
    "Effect",
    "ElectionConfig",
    "ElectorCore",
    "ElectorView",
    "HeartbeatAction",
    "HeartbeatDecision",
    "HeartbeatOutcome",
    "HeartbeatParse",
    "HeartbeatTally",
    "LedgerEnd",
    "LeadershipConfirmed",
    "Persist",
    "Reply",
    "RoleChanged",
    "Send",
    "Step",
    "VoteDecision",
    "VoteParse",
    "VoteRoundRecord",
    "VoteTally",
    "decide_heartbeat",
    "decide_vote",
    "follower_timed_out",
    "is_quorum",
    "next_time_to_request_vote",
    "parse_heartbeats",
    "parse_vote",
]
