"""The leader's rules (node/core/leader.py), row by row: (member snapshot, session table,
capacity, request) → decision, driving the real `LeaderCore` (docs/client.md "The start
invariant" for the session rows)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block import shared_state
from node.block.shared_state import NO_SLOT, MemberView
from node.core.leader import (
    ADMIT,
    NOOP_RETRY_MAX_MS,
    NOOP_RETRY_MIN_MS,
    REPEAT,
    SESSION_ID_BLOCK,
    Duplicate,
    LeaderCore,
    Placement,
    ReadPath,
    Refuse,
    ReserveIds,
    SessionGranted,
)
from node.core.pending import Pending
from node.core.sessions import MAX_SESSION_COUNTER, session_id

NOW = 100_000
LEASE = 450
TERM = 3
S = session_id(TERM, 1)  # wrote seqs 1..3 at indices 10..12
OPENED = session_id(TERM, 2)  # handed out by this table, nothing written yet
UNKNOWN = session_id(TERM, 9)  # of this term, but not handed out by this table
MAX_PENDING = 10


def view(role: Role = Role.LEADER, term: int = TERM, quorum_ms: int = NOW - 10,
         transferee: int = NO_SLOT) -> MemberView:
    """A real member snapshot as the block gives it (slot 0 leads)."""
    return MemberView(role, term, 0, 0, transferee, 1, quorum_ms, quorum_ms)


@dataclass(frozen=True)
class Setup:
    """The core's state for one row: the term it leads, pending entries, the disk, damage."""

    leader_term: int = TERM
    pending: int = 0
    disk_full: bool = False
    damaged: bool = False
    window: int = 4096


def core_for(setup: Setup) -> LeaderCore:
    c = LeaderCore(LEASE, 900, read_lease=False, max_pending=MAX_PENDING, max_sessions=100,
                   session_window=setup.window)
    if setup.leader_term >= 0:
        c.noop_written(setup.leader_term, 9)
    c.damaged = setup.damaged
    c.sessions.record(S, 1, 10, 3)
    c.sessions.open(OPENED)
    if setup.window < 4096:  # a second run (seq 4 at index 20): a small window drops the first
        c.sessions.record(S, 4, 20)
    for k in range(setup.pending):
        c.pending.register(TERM, 100 + k, Pending(b"c", k, 100 + k, None, 0, NOW + 1000))
    return c


class DiskProbe:
    """The handler's disk probe: records whether the core asked it."""

    def __init__(self, full: bool) -> None:
        self.full, self.asked = full, 0

    def __call__(self, now: int) -> bool:
        assert now == NOW
        self.asked += 1
        return self.full


def matches(got: object, expected: object) -> bool:
    """Equal, or (a refusal written without a reason) the same code."""
    if isinstance(expected, Refuse) and not expected.reason and isinstance(got, Refuse):
        return got.code == expected.code
    return got == expected


FULL = Setup(pending=MAX_PENDING)
DISK = Setup(disk_full=True)
LAPSED = NOW - LEASE


@pytest.mark.parametrize("v, setup, session, seq, n, batch, expected", [
    # leadership first: nothing else is looked at
    (view(Role.FOLLOWER), Setup(), 0, 0, 1, False, Refuse(RC.NOT_LEADER)),
    (view(term=4), Setup(), 0, 0, 1, False, Refuse(RC.NOT_LEADER)),  # the block moved to a new term
    (view(), Setup(leader_term=-1), 0, 0, 1, False, Refuse(RC.NOT_LEADER)),  # NOOP not written yet
    (view(quorum_ms=LAPSED), Setup(), 0, 0, 1, False, Refuse(RC.NOT_LEADER)),  # the lease lapsed
    (view(quorum_ms=LAPSED + 1), Setup(), 0, 0, 1, False, ADMIT),  # ... 1 ms before it does
    (view(), Setup(damaged=True), 0, 0, 1, False, Refuse(RC.NOT_LEADER)),
    (view(Role.FOLLOWER), DISK, S, 2, 1, False, Refuse(RC.NOT_LEADER)),  # even a resend
    (view(transferee=1), Setup(), 0, 0, 1, False, Refuse(RC.LEADER_TRANSFERRING)),
    (view(), Setup(), 0, 0, 0, True, Refuse(RC.REQUEST_WITH_EMPTY_BODYS)),
    # no session: capacity, then admit
    (view(), Setup(), 0, 0, 1, False, ADMIT),
    (view(), Setup(pending=MAX_PENDING - 3), 0, 0, 3, True, ADMIT),
    (view(), Setup(pending=MAX_PENDING - 2), 0, 0, 3, True, Refuse(RC.LEADER_PENDING_FULL)),
    (view(), FULL, 0, 0, 1, False, Refuse(RC.LEADER_PENDING_FULL)),
    (view(), DISK, 0, 0, 1, False, Refuse(RC.DISK_FULL)),
    # the session check comes BEFORE capacity: a resend the leader holds needs no room
    (view(), Setup(), S, 2, 1, False, Duplicate(11)),
    (view(), DISK, S, 2, 1, False, Duplicate(11)),
    (view(), FULL, S, 1, 3, True, Duplicate(10)),
    (view(), Setup(), S, 4, 1, False, ADMIT),  # the next seq
    (view(), DISK, S, 4, 1, False, Refuse(RC.DISK_FULL)),  # new, so it needs room
    (view(), Setup(), S, 6, 1, False, Refuse(RC.SESSION_SEQ_GAP, f"session {S:#x}: seq 6 x 1, last seq 3")),
    (view(), DISK, S, 6, 1, False, Refuse(RC.DISK_FULL)),  # a GAP with no room: the capacity refusal
    (view(), Setup(), S, 3, 2, True, Refuse(RC.SESSION_SEQ_INVALID, f"session {S:#x}: seq 3 x 2, last seq 3")),
    (view(), Setup(window=1), S, 1, 1, False,
     Refuse(RC.SESSION_SEQ_TOO_OLD, f"session {S:#x}: seq 1 x 1, last seq 4")),
    # the start invariant: an unknown session's seq 1 is written only if this table opened it
    (view(), Setup(), OPENED, 1, 1, False, ADMIT),
    (view(), Setup(), OPENED, 2, 1, False, Refuse(RC.SESSION_SEQ_GAP, f"session {OPENED:#x}: seq 2 x 1, last seq 0")),
    (view(), Setup(), UNKNOWN, 1, 1, False, Refuse(RC.SESSION_EXPIRED, f"session {UNKNOWN:#x} unknown to this leader")),
    (view(), DISK, UNKNOWN, 1, 1, False, Refuse(RC.SESSION_EXPIRED, f"session {UNKNOWN:#x} unknown to this leader")),
], ids=lambda x: None)
def test_admission_order(v, setup, session, seq, n, batch, expected):  # noqa: ANN001
    c = core_for(setup)
    probe = DiskProbe(setup.disk_full)
    got = c.admit(v, NOW, session, seq, n, probe, batch=batch)
    assert matches(got, expected), got
    if isinstance(got, Duplicate) or (isinstance(got, Refuse) and got.code in (
            RC.NOT_LEADER, RC.LEADER_TRANSFERRING, RC.SESSION_EXPIRED, RC.SESSION_SEQ_INVALID)):
        assert probe.asked == 0  # the disk is measured only for what might be written


def test_the_core_keeps_the_blocks_no_slot():
    assert NO_SLOT == shared_state.NO_SLOT == -1


# ---- one MULTI frame of single appends ---------------------------------------------------------
@pytest.mark.parametrize("stamps, setup, expected", [
    # a client's pipelined run: the frame tracks what it admitted (the table learns after)
    ([(S, 4), (S, 5), (S, 6)], Setup(), [ADMIT, ADMIT, ADMIT]),
    ([(0, 0), (S, 4), (0, 0)], Setup(), [ADMIT, ADMIT, ADMIT]),
    ([(S, 4), (S, 6)], Setup(), [ADMIT, Refuse(RC.SESSION_SEQ_GAP, f"session {S:#x}: seq 6, last seq 4")]),
    # one stamp twice: the second is a repeat, decided after the writes
    ([(S, 4), (S, 5), (S, 4)], Setup(), [ADMIT, ADMIT, REPEAT]),
    # before the frame's first: a resend (the table knows it) or out of order
    ([(S, 4), (S, 2)], Setup(), [ADMIT, Duplicate(11)]),
    ([(OPENED, 2), (OPENED, 1)], Setup(), [Refuse(RC.SESSION_SEQ_GAP), ADMIT]),
    ([(S, 4), (S, 5), (S, 3)], Setup(), [ADMIT, ADMIT, Duplicate(12)]),
    ([(UNKNOWN, 1), (UNKNOWN, 2)], Setup(), [Refuse(RC.SESSION_EXPIRED), Refuse(RC.SESSION_EXPIRED)]),
    ([(S, 2), (S, 3)], DISK, [Duplicate(11), Duplicate(12)]),  # resends need no room
], ids=lambda x: None)
def test_frame_admission(stamps, setup, expected):  # noqa: ANN001
    c = core_for(setup)
    span: dict[int, tuple[int, int]] = {}
    got = [c.admit_in_frame(span, session, seq, NOW, DiskProbe(setup.disk_full)) for session, seq in stamps]
    assert len(got) == len(expected) and all(matches(g, e) for g, e in zip(got, expected, strict=True)), got


def test_a_repeat_is_the_resend_of_what_the_frame_wrote_or_refused_if_not_written():
    c = core_for(Setup())
    span: dict[int, tuple[int, int]] = {}
    assert [c.admit_in_frame(span, S, q, NOW, DiskProbe(False)) for q in (4, 4)] == [ADMIT, REPEAT]
    assert c.decide_repeat(S, 4, NOW, DiskProbe(False)) == Refuse(
        RC.SESSION_SEQ_INVALID, f"session {S:#x}: seq 4 twice in one request and not stored")
    c.sessions.record(S, 4, 13)  # the frame's write of seq 4 landed
    assert c.decide_repeat(S, 4, NOW, DiskProbe(False)) == Duplicate(13)


@pytest.mark.parametrize("last, n, pending, committed, expected", [
    (12, 1, 0, 12, Placement.COMPLETE),
    (12, 3, MAX_PENDING, 20, Placement.COMPLETE),  # committed: no room needed
    (12, 1, 0, 11, Placement.REGISTER),
    (12, 1, MAX_PENDING, 11, Placement.PENDING_FULL),
    (12, 3, MAX_PENDING - 3, 11, Placement.REGISTER),
])
def test_a_resend_is_answered_as_its_first_attempt_would_be(last, n, pending, committed, expected):  # noqa: ANN001
    assert core_for(Setup(pending=pending)).place_duplicate(last, n, committed) == expected


# ---- reads ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("read_lease, v, noop_committed, query, expected", [
    (False, view(), True, False, ReadPath.PARK),  # a GET waits for a quorum round after it
    (False, view(), True, True, ReadPath.EARLY),  # a query goes to the applier meanwhile
    (False, view(), False, True, ReadPath.PARK),  # ... not before the term's NOOP commits
    (True, view(), True, False, ReadPath.SERVE),  # lease read
    (True, view(), False, False, ReadPath.PARK),
    (True, view(transferee=1), True, False, ReadPath.PARK),  # the transferee may win within our lease
    (True, view(quorum_ms=LAPSED), True, True, ReadPath.EARLY),
])
def test_a_linearizable_read_arriving(read_lease, v, noop_committed, query, expected):  # noqa: ANN001
    c = LeaderCore(LEASE, 900, read_lease, MAX_PENDING, 100, 4096)
    c.noop_written(TERM, 9)
    assert c.read_path(v, NOW, 9 if noop_committed else 8, query) == expected


ARRIVED, DEADLINE = NOW - 5, NOW + 50


@pytest.mark.parametrize("v, leader_term, committed, now, expected", [
    (view(quorum_ms=ARRIVED), TERM, 9, NOW, ReadPath.SERVE),  # a round that started as it arrived
    (view(quorum_ms=ARRIVED - 1), TERM, 9, NOW, ReadPath.WAIT),  # ... started before it: no proof
    (view(quorum_ms=ARRIVED), TERM, 8, NOW, ReadPath.WAIT),  # the NOOP is not committed yet
    (view(quorum_ms=ARRIVED - 1), TERM, 9, DEADLINE, ReadPath.TIMEOUT),
    (view(Role.FOLLOWER, quorum_ms=ARRIVED), TERM, 9, NOW, ReadPath.NOT_LEADER),
    (view(term=4, quorum_ms=ARRIVED), TERM, 9, NOW, ReadPath.NOT_LEADER),
    (view(quorum_ms=ARRIVED), -1, 9, NOW, ReadPath.NOT_LEADER),  # stepped down meanwhile
])
def test_a_parked_read(v, leader_term, committed, now, expected):  # noqa: ANN001
    c = core_for(Setup(leader_term=leader_term))
    assert c.parked_read(TERM, ARRIVED, DEADLINE, v, now, committed) == expected


def test_the_term_confirmed_for_early_reads():
    c = core_for(Setup())
    assert c.leading_term(view()) == TERM
    assert c.leading_term(view(quorum_ms=LAPSED)) == TERM  # confirmation is the quorum round's job
    assert c.leading_term(view(term=4)) is None
    assert c.leading_term(view(Role.CANDIDATE)) is None


# ---- leadership ---------------------------------------------------------------------------------
def test_a_failed_noop_backs_off_and_a_written_one_leads():
    c = LeaderCore(LEASE, 900, False, MAX_PENDING, 100, 4096)
    assert c.may_take(view(), NOW) and not c.still_leads(view())
    backoffs = [c.noop_failed(NOW) for _ in range(7)]
    assert backoffs == [NOOP_RETRY_MIN_MS, 100, 200, 400, 800, NOOP_RETRY_MAX_MS, NOOP_RETRY_MAX_MS]
    later = NOW + NOOP_RETRY_MAX_MS
    fresh = view(quorum_ms=later - 10)
    assert not c.may_take(fresh, later - 1) and c.may_take(fresh, later)
    assert not c.may_take(view(quorum_ms=later - LEASE), later)  # no lease, no NOOP
    c.noop_written(TERM, 9)
    assert (c.leader_term, c.noop_index, c.noop_retry_ms) == (TERM, 9, 0)
    assert c.still_leads(view()) and c.leading(view(), NOW)
    c.step_down()
    assert (c.leader_term, c.noop_index) == (-1, -1) and not c.leading(view(), NOW)


# ---- session ids --------------------------------------------------------------------------------
def test_session_ids_are_reserved_before_they_are_handed_out():
    c = LeaderCore(LEASE, 900, False, MAX_PENDING, 100, 4096)
    c.noop_written(TERM, 9)
    c.start_sessions(None, 0)
    assert c.open_session() == ReserveIds(SESSION_ID_BLOCK)
    assert c.reserved(SESSION_ID_BLOCK) == SessionGranted(session_id(TERM, 1))
    assert c.open_session() == SessionGranted(session_id(TERM, 2))
    assert c.sessions.decide(session_id(TERM, 2), 1, 1).verdict.name == "APPEND"  # the start invariant


def test_a_restarted_handler_continues_after_the_recorded_ids_and_skips_held_ones():
    c = LeaderCore(LEASE, 900, False, MAX_PENDING, 100, 4096)
    c.noop_written(TERM, 9)
    c.start_sessions(None, SESSION_ID_BLOCK)  # an earlier handler of this term recorded a block
    assert c.open_session() == ReserveIds(2 * SESSION_ID_BLOCK)
    c.sessions.record(session_id(TERM, SESSION_ID_BLOCK + 1), 1, 50)  # an id its table still holds
    assert c.reserved(2 * SESSION_ID_BLOCK) == SessionGranted(session_id(TERM, SESSION_ID_BLOCK + 2))


def test_a_term_runs_out_of_session_ids():
    c = LeaderCore(LEASE, 900, False, MAX_PENDING, 100, 4096)
    c.noop_written(TERM, 9)
    c.start_sessions(None, MAX_SESSION_COUNTER - 1)
    assert c.open_session() == ReserveIds(MAX_SESSION_COUNTER)
    assert c.reserved(MAX_SESSION_COUNTER) == SessionGranted(session_id(TERM, MAX_SESSION_COUNTER))
    assert c.open_session() == ReserveIds(MAX_SESSION_COUNTER)  # recorded again, then refused
    got = c.reserved(MAX_SESSION_COUNTER)
    assert isinstance(got, Refuse) and got.code == RC.SESSION_LIMIT
