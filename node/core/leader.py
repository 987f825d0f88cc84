"""The leader's rules as data: the mirror of `node.core.follower.FollowerCore`.

`LeaderCore` decides what a leader's handler does with a client request; the handler process
only executes it (store writes under the member lock, replies, publishing). Shape: *input +
one member snapshot + time → decision*:

* every decision reads ONE member snapshot (`view`: role, term, the last quorum heartbeat, the
  transferee), read once by the handler for this request, and the time the handler read from
  its clock. No decision mixes two reads of the block (another role writes it between them);
* nothing here does I/O: no socket, no store, no clock. What a decision needs from outside
  comes in as plain values (the committed index) or, where asking is costly and only some
  paths ask, as a callable (`DiskFull`: whether the disk is full, measured at most once a
  second by the handler);
* the core owns the leader's book-keeping that is pure data: the term it leads and its NOOP's
  index, the NOOP retry backoff, the pending-reply table (`PendingTable`), the client session
  table (`SessionTable`) and the session-id counter.

The rules, in the order the handler applies them to an append (a single APPEND, a BATCH, or
one APPEND of a MULTI frame):

1. leadership: this handler wrote the NOOP of the term the view names, the lease holds and no
   damaged entry is waiting to be cut (else NOT_LEADER); no transfer under way (else
   LEADER_TRANSFERRING); a batch has bodies (else REQUEST_WITH_EMPTY_BODYS);
2. the session check (`SessionTable.decide`): a resend of an entry the leader holds is
   answered with its index (`Duplicate`), GAP / OVERLAP / TOO_OLD / EXPIRED get their
   SESSION_* codes, and an unknown session's seq 1 is written only if this table handed the
   id out (the start invariant, docs/client.md);
3. capacity, only for what will be written: the pending table is full (LEADER_PENDING_FULL),
   the disk is full (DISK_FULL). After the session check on purpose: a resend the leader
   already holds needs no room, and refusing it with a definite code would tell its client
   "not stored" about an entry that is. A GAP is refused for capacity first when there is
   no room (nothing of it is stored either way, and a pipelined writer on a full disk learns
   the reason at once instead of after a resend);
4. admit: the handler writes it.

Appends do not wait for the term's NOOP to commit (it is written before anything else, and
commits with or before them); reads do: the committed index is a valid read index only once
the NOOP of the term is committed (it carries every earlier term's entries).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.lease import holds_lease
from node.core.pending import PendingTable
from node.core.sessions import (
    MAX_SESSION_COUNTER,
    SessionTable,
    Verdict,
    seq_add,
    seq_after,
    session_id,
)

NO_SLOT = -1  # node.block.shared_state.NO_SLOT: no transferee (kept here: the core imports no I/O module)
NOOP_RETRY_MIN_MS = 50
NOOP_RETRY_MAX_MS = 1000
SESSION_ID_BLOCK = 256  # session ids reserved (recorded by the handler) at a time

DiskFull = Callable[[int], bool]
"""`disk_full(now)`: whether the store's disk is over its full ratio (the handler measures it
at most once a second; asked only by an append that would be written)."""


class MemberSnapshot(Protocol):
    """What the core reads of one member snapshot (node.block.shared_state.MemberView has it)."""

    role: Role
    current_term: int
    transferee_slot: int
    last_quorum_heartbeat_ms: int


# ---- decisions -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Admit:
    """Write it."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer with an error: `code`, `reason` (the handler adds term and leader)."""

    code: RC
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A resend of entries the log already holds from index `first` on: answer with where they
    are (`place_duplicate` says when), write nothing."""

    first: int


@dataclass(frozen=True, slots=True)
class Repeat:
    """A stamp the same MULTI frame already admitted: decided after the frame's writes
    (`decide_repeat`), as the resend it is — never written twice."""


ADMIT = Admit()
REPEAT = Repeat()
Admission = Admit | Refuse | Duplicate | Repeat


class Placement(enum.Enum):
    """Where a recognised resend's answer goes (`place_duplicate`)."""

    COMPLETE = "complete"  # its entries are committed: answer now
    REGISTER = "register"  # not yet: register it as a pending reply, answered at commit
    PENDING_FULL = "pending-full"  # not yet, and no room: LEADER_PENDING_FULL (retryable)


class ReadPath(enum.Enum):
    """What to do with a linearizable read that may be served (`read_path`, `parked_read`)."""

    SERVE = "serve"  # answer now at the committed index
    EARLY = "early"  # send a query to the applier now, hold its answer until confirmed
    PARK = "park"  # wait for a quorum round that started after it arrived
    WAIT = "wait"  # parked: keep waiting
    NOT_LEADER = "not-leader"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class SessionGranted:
    """`open_session`: hand out `session`."""

    session: int


@dataclass(frozen=True, slots=True)
class ReserveIds:
    """`open_session`: record (durably, before handing any out) that ids up to counter `upto`
    of this term may be in use, then call `reserved(upto)` and ask again."""

    upto: int


SessionStep = SessionGranted | ReserveIds | Refuse


class LeaderCore:
    """One handler's leader side. `lease`: the lease length (node.core.lease.lease_ms);
    `read_timeout_ms`: how long a read waits for leadership to be confirmed; `read_lease`:
    serve linearizable reads under the lease alone (option `read_lease`)."""

    def __init__(self, lease: int, read_timeout_ms: int, read_lease: bool, max_pending: int,
                 max_sessions: int, session_window: int) -> None:
        self.lease = lease
        self.read_timeout_ms = read_timeout_ms
        self.read_lease = read_lease
        self.max_sessions = max_sessions
        self.session_window = session_window
        self.leader_term = -1  # the term whose NOOP this handler wrote (it leads that term)
        self.noop_index = -1
        self.noop_retry_ms = 0  # a failed NOOP is not retried before this time
        self.noop_backoff_ms = 0
        self.damaged = False  # a damaged entry waits to be cut: lead nothing until then
        self.pending = PendingTable(max_pending)
        self.sessions = SessionTable(max_sessions, session_window)
        self.session_counter = 0  # session ids opened in leader_term
        self.session_reserved = 0  # ids up to this one are recorded as handed out

    # ---- leadership ----------------------------------------------------------------------------
    def holds(self, view: MemberSnapshot, now: int) -> bool:
        """The view says LEADER and its lease holds (node/core/lease.py)."""
        return holds_lease(view.role, view.last_quorum_heartbeat_ms, now, self.lease)

    def leading(self, view: MemberSnapshot, now: int) -> bool:
        """Act as leader only while the view says LEADER of the term whose NOOP this handler
        wrote and the lease holds: a paused or partitioned elector must not leave the handler
        serving on the role flag alone, which another leader may already have made stale."""
        return view.current_term == self.leader_term and not self.damaged and self.holds(view, now)

    def still_leads(self, view: MemberSnapshot) -> bool:
        """The view still names this handler's term as LEADER: nothing to change."""
        return view.role == Role.LEADER and view.current_term == self.leader_term

    def may_take(self, view: MemberSnapshot, now: int) -> bool:
        """Write the view's term's NOOP now: it says LEADER with a lease, and a failed NOOP's
        retry time has come."""
        return view.role == Role.LEADER and now >= self.noop_retry_ms and self.holds(view, now)

    def noop_written(self, term: int, index: int) -> None:
        """The NOOP of `term` is at `index`: lead that term from now on."""
        self.noop_backoff_ms = 0
        self.noop_retry_ms = 0
        self.leader_term = term
        self.noop_index = index

    def noop_failed(self, now: int) -> int:
        """The NOOP could not be written: back off (doubling, NOOP_RETRY_MIN_MS ..
        NOOP_RETRY_MAX_MS) so a full or failing disk is not hammered in a hot loop. Returns
        the backoff."""
        self.noop_backoff_ms = min(max(2 * self.noop_backoff_ms, NOOP_RETRY_MIN_MS), NOOP_RETRY_MAX_MS)
        self.noop_retry_ms = now + self.noop_backoff_ms
        return self.noop_backoff_ms

    def step_down(self) -> None:
        """Leadership lost (the caller failed its pending replies and parked reads first)."""
        self.leader_term = -1
        self.noop_index = -1

    # ---- appends -------------------------------------------------------------------------------
    def refuse_leadership(self, view: MemberSnapshot, now: int) -> Refuse | None:
        """The first checks of an append: may this node answer it at all?"""
        if not self.leading(view, now):
            return Refuse(RC.NOT_LEADER)
        if view.transferee_slot != NO_SLOT:
            return Refuse(RC.LEADER_TRANSFERRING)
        return None

    def refuse_capacity(self, n: int, now: int, disk_full: DiskFull) -> Refuse | None:
        """Is there room to write `n` entries? Asked only of an append that will be written,
        after the session check (module docstring, rule 3)."""
        if self.pending.full(n):
            return Refuse(RC.LEADER_PENDING_FULL)
        if disk_full(now):
            return Refuse(RC.DISK_FULL)
        return None

    def session_check(self, session: int, seq: int, n: int, now: int, disk_full: DiskFull) -> Admission:
        """The session rule for `n` entries of `session` from `seq` (rule 2): ADMIT when they
        are new and must be written, `Duplicate` for a resend, else a SESSION_* refusal naming
        the session's last seq (a GAP with no room: the capacity refusal)."""
        d = self.sessions.decide(session, seq, n)
        if d.verdict is Verdict.APPEND:
            return ADMIT
        if d.verdict is Verdict.DUPLICATE:
            return Duplicate(d.index)
        if d.verdict is Verdict.GAP and (refused := self.refuse_capacity(n, now, disk_full)) is not None:
            return refused
        if d.verdict is Verdict.EXPIRED:
            return Refuse(RC.SESSION_EXPIRED, f"session {session:#x} unknown to this leader")
        code = {Verdict.GAP: RC.SESSION_SEQ_GAP, Verdict.OVERLAP: RC.SESSION_SEQ_INVALID,
                Verdict.TOO_OLD: RC.SESSION_SEQ_TOO_OLD}[d.verdict]
        return Refuse(code, f"session {session:#x}: seq {seq} x {n}, last seq {d.last_seq}")

    def admit(self, view: MemberSnapshot, now: int, session: int, seq: int, n: int, disk_full: DiskFull,
              *, batch: bool = False) -> Admission:
        """A single APPEND (`n` = 1) or a BATCH of `n` bodies, stamped (`session`, `seq`) or
        not (session 0): rules 1-4 of the module docstring, in that order."""
        refused = self.refuse_leadership(view, now)
        if refused is not None:
            return refused
        if batch and n == 0:
            return Refuse(RC.REQUEST_WITH_EMPTY_BODYS)
        if session:
            d = self.session_check(session, seq, n, now, disk_full)
            if not isinstance(d, Admit):
                return d
        return self.refuse_capacity(n, now, disk_full) or ADMIT

    def admit_in_frame(self, span: dict[int, tuple[int, int]], session: int, seq: int, now: int,
                       disk_full: DiskFull) -> Admission:
        """The session rule for one single APPEND of a MULTI frame (leadership already
        checked for the frame; capacity is asked for all admitted ones together after).

        The table learns a request only once it is written, after the whole frame is decided,
        so within the frame each session's admitted seqs are tracked in `span` (session ->
        (first seq admitted in this frame, next seq)), which the caller creates empty per
        frame: the next one (seq + 1) is admitted, one past it is a GAP, one the frame already
        admitted (a client sending one stamp twice) is a `Repeat`, one before the frame's
        first is decided by the table (a resend) or refused as out of order."""
        if not session:
            return ADMIT
        got = span.get(session)
        if got is None:
            d = self.session_check(session, seq, 1, now, disk_full)
            if isinstance(d, Admit):
                span[session] = (seq, seq_add(seq, 1))
            return d
        first, nxt = got
        if seq == nxt:
            span[session] = (first, seq_add(nxt, 1))
            return ADMIT
        if seq_after(nxt, seq) > 0:
            return Refuse(RC.SESSION_SEQ_GAP, f"session {session:#x}: seq {seq}, last seq {seq_add(nxt, -1)}")
        if seq_after(first, seq) >= 0:
            return REPEAT
        d = self.session_check(session, seq, 1, now, disk_full)
        if isinstance(d, Admit):
            return Refuse(RC.SESSION_SEQ_INVALID, f"session {session:#x}: seq {seq} out of order in one request")
        return d

    def decide_repeat(self, session: int, seq: int, now: int, disk_full: DiskFull) -> Admission:
        """A `Repeat` of a frame, after the frame's writes (the table knows them now): the
        resend's answer; a stamp still new (its first occurrence was refused) is refused."""
        d = self.session_check(session, seq, 1, now, disk_full)
        if isinstance(d, Admit):
            return Refuse(RC.SESSION_SEQ_INVALID,
                          f"session {session:#x}: seq {seq} twice in one request and not stored")
        return d

    def place_duplicate(self, last: int, n: int, committed: int) -> Placement:
        """A recognised resend of `n` entries ending at `last` is answered as its first attempt
        would have been: once they are committed."""
        if last <= committed:
            return Placement.COMPLETE
        if self.pending.full(n):
            return Placement.PENDING_FULL
        return Placement.REGISTER

    # ---- reads ---------------------------------------------------------------------------------
    def lease_read_ok(self, view: MemberSnapshot, now: int, committed: int) -> bool:
        """A lease read (option `read_lease`, off by default): no other leader can exist while
        the lease from the last quorum round holds, so the committed index now is a valid read
        index, provided this term's NOOP is committed and no leadership transfer is under way
        (its target may be elected within our lease). Assumes bounded clock drift."""
        return (self.read_lease and view.role == Role.LEADER and view.current_term == self.leader_term
                and view.transferee_slot == NO_SLOT and committed >= self.noop_index
                and self.holds(view, now))

    def read_path(self, view: MemberSnapshot, now: int, committed: int, query: bool) -> ReadPath:
        """A linearizable read arriving at a leader (`leading` checked by the caller): SERVE
        under a lease read; a state-machine query goes to the applier at once (EARLY) when
        the term's NOOP is committed (before, the committed index may miss an earlier
        leader's entries); anything else is PARKed until a quorum round that started after
        it arrived confirms this leader."""
        if self.lease_read_ok(view, now, committed):
            return ReadPath.SERVE
        if query and self.leader_term == view.current_term and committed >= self.noop_index:
            return ReadPath.EARLY
        return ReadPath.PARK

    def parked_read(self, term: int, arrived_ms: int, deadline_ms: int, view: MemberSnapshot, now: int,
                    committed: int) -> ReadPath:
        """A parked read of `term`: SERVE once the view shows LEADER of its term with a quorum
        round that *started* at or after it arrived, and this term's NOOP is committed (the
        committed index is then at least the one at arrival); NOT_LEADER when the role or
        term changed; TIMEOUT past its deadline; else WAIT."""
        if view.role != Role.LEADER or view.current_term != term or self.leader_term != term:
            return ReadPath.NOT_LEADER
        if view.last_quorum_heartbeat_ms >= arrived_ms and committed >= self.noop_index:
            return ReadPath.SERVE
        if now >= deadline_ms:
            return ReadPath.TIMEOUT
        return ReadPath.WAIT

    def leading_term(self, view: MemberSnapshot) -> int | None:
        """The term the view confirms this handler leads (for reads sent to the applier
        early, node/core/reads.py), or None."""
        return view.current_term if self.still_leads(view) else None

    # ---- client sessions -----------------------------------------------------------------------
    def start_sessions(self, table: SessionTable | None, handed_out: int) -> None:
        """A new leadership's sessions: `table` rebuilt from the log's tail (None: the rebuild
        failed, start empty: resends then get SESSION_EXPIRED, which is indeterminate for the
        client), and the id counter recorded for this term so far (`handed_out`, 0 for a new
        term): a restarted handler continues after it, never handing an id out twice."""
        self.sessions = table if table is not None else SessionTable(self.max_sessions, self.session_window)
        self.session_counter = self.session_reserved = handed_out

    def open_session(self) -> SessionStep:
        """The next session id: (term mod 2**16, counter), unique among this leader's (only one
        leader opens sessions in a term) and skipping ids its table still holds. Ids must be
        recorded as handed out before they are (`ReserveIds`; the caller records them and
        calls `reserved`, which goes on from there): a restarted handler of the same term
        starts from what was recorded. Past MAX_SESSION_COUNTER ids in one term:
        SESSION_LIMIT until the next election."""
        return self._allocate(may_reserve=True)

    def reserved(self, upto: int) -> SessionStep:
        """Ids up to counter `upto` are recorded as handed out (after `ReserveIds`): go on
        allocating (the next id is taken without asking to reserve again)."""
        self.session_reserved = upto
        return self._allocate(may_reserve=False)

    def _allocate(self, may_reserve: bool) -> SessionStep:
        while True:
            if may_reserve and self.session_counter >= self.session_reserved:
                return ReserveIds(min(self.session_counter + SESSION_ID_BLOCK, MAX_SESSION_COUNTER))
            may_reserve = True
            self.session_counter += 1
            if self.session_counter > MAX_SESSION_COUNTER:
                return Refuse(RC.SESSION_LIMIT, f"{MAX_SESSION_COUNTER} sessions opened in term "
                                                f"{self.leader_term}: retry after the next election")
            sid = session_id(self.leader_term, self.session_counter)
            if not self.sessions.holds(sid):
                self.sessions.open(sid)
                return SessionGranted(sid)


__all__ = [
    "ADMIT", "REPEAT", "Admission", "Admit", "DiskFull", "Duplicate", "LeaderCore", "Placement", "ReadPath",
    "Refuse", "Repeat", "ReserveIds", "SessionGranted", "SessionStep",
]
