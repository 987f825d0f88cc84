"""The client's session (exactly-once appends): it opens one, stamps every append with
consecutive seqs, resends an unanswered append under the same stamp, and the leader (here a
fake node deciding with the real `node.core.sessions.SessionTable`) answers the resend with the
original index."""

from __future__ import annotations

import time

import pytest

from ipc import protocol as P
from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from node.core.sessions import SessionTable, Verdict
from node.store import codec
from tests.unit.test_client import GROUP, FakeCluster

pytest.importorskip("zmq")


class SessionLeader:
    """Scripts a FakeCluster's leader to speak sessions, deciding with the real table."""

    def __init__(self, cluster: FakeCluster, swallow_first: int = 0) -> None:
        self.cluster = cluster
        self.table = SessionTable()
        self.opened = 0
        self.swallow = swallow_first  # answers of the first N appends lost (written, not answered)
        self.stamps: list[tuple[int, int, int]] = []  # (session, seq, count) as received
        for node in cluster.nodes.values():
            node.script = self.script

    def refuse_once(self, seq: int, code: int) -> None:
        """Answer `code` to the first append stamped `seq`, storing nothing."""
        pending = [True]

        def script(node, msg):  # noqa: ANN001, ANN202
            if (isinstance(msg, P.AppendRequest) and node.id == self.cluster.leader
                    and msg.seq == seq and pending[0]):
                pending[0] = False
                return [self.cluster.error(msg, code)]
            return self.script(node, msg)

        for node in self.cluster.nodes.values():
            node.script = script

    def first_session_answers(self, answers: dict[int, list[int | None]]) -> None:
        """Answer the first session's appends stamped with a seq in `answers` with the next code
        of its list (None: no answer at all), storing nothing; then as usual."""
        first: list[int] = []

        def script(node, msg):  # noqa: ANN001, ANN202
            if isinstance(msg, P.AppendRequest) and node.id == self.cluster.leader:
                if not first:
                    first.append(msg.session)
                todo = answers.get(msg.seq) if msg.session == first[0] else None
                if todo:
                    code = todo.pop(0)
                    return [] if code is None else [self.cluster.error(msg, code)]
            return self.script(node, msg)

        for node in self.cluster.nodes.values():
            node.script = script

    def script(self, node, msg):  # noqa: ANN001, ANN201
        c = self.cluster
        if node.id != c.leader or not isinstance(msg, (P.OpenSessionRequest, P.AppendRequest,
                                                       P.BatchAppendRequest)):
            return None
        if isinstance(msg, P.OpenSessionRequest):
            self.opened += 1
            self.table.open(0x10000 + self.opened)
            return [P.OpenSessionResponse(RC.SUCCESS, GROUP, c.term, node.id, 0x10000 + self.opened,
                                          msg.request_id)]
        batch = isinstance(msg, P.BatchAppendRequest)
        bodies = list(msg.bodies) if batch else [msg.body]
        seq = msg.first_seq if batch else msg.seq
        self.stamps.append((msg.session, seq, len(bodies)))
        d = self.table.decide(msg.session, seq, len(bodies))
        if d.verdict is Verdict.DUPLICATE:
            first = d.index
        elif d.verdict is Verdict.APPEND:
            first = c.store(bytes(bodies[0]))[0]
            for b in bodies[1:]:
                c.store(bytes(b))
            self.table.record(msg.session, seq, first, len(bodies))
        else:
            return [c.error(msg, RC.SESSION_SEQ_GAP)]
        if self.swallow > 0:
            self.swallow -= 1
            return []  # written (or found), but the answer never comes (the leader died, say)
        if batch:
            return [P.BatchAppendResponse(RC.SUCCESS, GROUP, c.term, node.id, first,
                                          list(range(len(bodies))), msg.request_id)]
        return [P.AppendResponse(RC.SUCCESS, GROUP, c.term, node.id, first, 0, msg.request_id)]


@pytest.fixture
def fake():
    c = FakeCluster(["n0", "n1", "n2"])
    try:
        yield c
    finally:
        c.stop()


def test_one_session_consecutive_seqs_for_singles_and_batches(fake):
    leader = SessionLeader(fake)
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        assert c.append(b"a").index == 0
        assert [r.index for r in c.append_batch([b"b", b"c", b"d"])] == [1, 2, 3]
        assert c.append(b"e").index == 4
    assert leader.opened == 1
    sid = leader.stamps[0][0]
    assert leader.stamps == [(sid, 1, 1), (sid, 2, 3), (sid, 5, 1)]


def test_an_unanswered_append_is_resent_and_answered_with_its_original_index(fake):
    """The first attempt is written but its answer is lost: after the attempt timeout the
    client resends the same stamp, and gets the index the first attempt was written at."""
    leader = SessionLeader(fake, swallow_first=1)
    with DLedgerClient(fake.peers, GROUP, timeout=5.0, attempt_timeout=0.3) as c:
        r = c.append(b"once")
        assert r.index == 0
        assert c.append(b"next").index == 1
    assert len(fake.entries) == 2  # written once, though sent twice
    assert [s[:2] for s in leader.stamps[:2]] == [leader.stamps[0][:2]] * 2


def test_a_group_without_sessions_gets_plain_appends(fake):
    """A node that does not know OPEN_SESSION answers UNSUPPORTED: the client appends
    without a stamp, as before."""
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        assert c.append(b"x").index == 0
        assert c.append(b"y").index == 1
    appends = [m for m in fake.nodes["n0"].received if isinstance(m, P.AppendRequest)]
    assert [m.session for m in appends] == [0, 0]


def test_a_session_the_leader_forgot_is_replaced_for_a_write_never_possibly_stored(fake):
    leader = SessionLeader(fake)
    leader.refuse_once(1, RC.SESSION_EXPIRED)
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        assert c.append(b"x").index == 0
    assert leader.opened == 2  # a new session for the refused write
    assert leader.stamps[-1][1] == 1


def test_indeterminate_only_when_the_whole_timeout_passes_without_an_answer(fake):
    """Every attempt is swallowed: the call ends, after its timeout, as indeterminate."""
    SessionLeader(fake, swallow_first=1000)
    with DLedgerClient(fake.peers, GROUP, timeout=1.0, attempt_timeout=0.2) as c:
        with pytest.raises(DLedgerError) as ei:
            c.append(b"lost?")
    assert ei.value.indeterminate
    assert len(fake.entries) == 1  # resent several times, written once


def test_a_refused_append_does_not_leave_a_hole_that_blocks_the_next_ones(fake):
    """The leader refuses seq 2 for good (DISK_FULL: not stored). Seq 3 would wait forever
    behind the hole (SESSION_SEQ_GAP); as seq 2 was the newest stamp, the client hands it
    out again instead (no hole, no new session)."""
    leader = SessionLeader(fake)
    leader.refuse_once(2, RC.DISK_FULL)
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        assert c.append(b"one").index == 0
        with pytest.raises(DLedgerError) as ei:
            c.append(b"two")
        assert ei.value.code == RC.DISK_FULL and not ei.value.indeterminate
        assert c.append(b"three").index == 1
    assert leader.opened == 1 and leader.stamps[-1][1] == 2


def test_a_refused_append_behind_later_ones_moves_them_to_a_new_session(fake):
    """Pipelined: seq 1 is refused for good while seqs 2 and 3 are on their way; they meet
    the hole (GAP) and, never possibly stored, are resent under a new session."""
    leader = SessionLeader(fake)
    leader.refuse_once(1, RC.DISK_FULL)
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        futs = [c.append_async(b"p%d" % k) for k in range(3)]
        with pytest.raises(DLedgerError):
            futs[0].result(5)
        assert sorted(f.result(5).index for f in futs[1:]) == [0, 1]
    assert leader.opened == 2
    assert len(fake.entries) == 2


def test_a_dead_leaders_dropped_connection_resends_at_once(fake):
    """n0 takes the append and dies before answering: the client sees the connection drop
    (socket monitor) and resends to the new leader at once, long before `attempt_timeout`."""
    leader = SessionLeader(fake)
    with DLedgerClient(fake.peers, GROUP, timeout=10.0, attempt_timeout=5.0) as c:
        assert c.append(b"warm").index == 0  # the session is open
        leader.swallow = 1
        t0 = time.monotonic()
        fut = c.append_async(b"in flight")
        fake.nodes["n0"].wait_for(lambda n: n.count(P.AppendRequest) >= 2)
        fake.leader = "n1"
        fake.nodes["n0"].stop()
        assert fut.result(10).index == 1  # written once by n0, found again via n1
        assert time.monotonic() - t0 < 2.5
    assert len(fake.entries) == 2


def test_writes_moved_to_a_new_session_keep_their_place_before_later_ones(fake):
    """Order across retries (Kafka's idempotent producer keeps it; so do we). Pipelined: seq 1
    is refused for good, seq 2 meets the hole at once (GAP), seq 3 is told LEADER_PENDING_FULL
    twice and meets the hole only on its third attempt. A write submitted after the refusal
    must not overtake seq 3: the client waits until every write of the abandoned session is
    resolved, restamps them in their order, and only then stamps the new one."""
    leader = SessionLeader(fake)
    leader.first_session_answers({1: [RC.DISK_FULL], 3: [RC.LEADER_PENDING_FULL, RC.LEADER_PENDING_FULL]})
    with DLedgerClient(fake.peers, GROUP, timeout=5.0, attempt_timeout=0.3) as c:
        futs = [c.append_async(b"p%d" % k) for k in range(3)]
        with pytest.raises(DLedgerError) as ei:
            futs[0].result(5)
        assert ei.value.code == RC.DISK_FULL
        late = c.append_async(b"late")
        got = [f.result(5).index for f in (futs[1], futs[2], late)]
    assert got == [0, 1, 2], got
    assert [bytes(codec.decode_entry(e).body) for e in fake.entries] == [b"p1", b"p2", b"late"]
    assert leader.opened == 2


def test_an_unanswered_write_behind_a_definite_hole_is_restamped_not_waited_out(fake):
    """Seq 1 is refused for good (never stored); seq 2's first attempt gets no answer, so its
    outcome looks unknown. But a leader stores seq 2 only after seq 1, which never was: seq 2
    was never stored either, and on its resend's SESSION_SEQ_GAP it moves to a new session at
    once instead of being resent until its whole timeout passes (and failing as indeterminate,
    holding every later write back meanwhile)."""
    SessionLeader(fake).first_session_answers({1: [RC.DISK_FULL], 2: [None]})  # None: no answer
    with DLedgerClient(fake.peers, GROUP, timeout=8.0, attempt_timeout=0.3) as c:
        t0 = time.monotonic()
        futs = [c.append_async(b"p%d" % k) for k in range(2)]
        with pytest.raises(DLedgerError):
            futs[0].result(10)
        assert futs[1].result(10).index == 0
        assert time.monotonic() - t0 < 4.0  # not its 8 s timeout
        assert c.append(b"later").index == 1
    assert [bytes(codec.decode_entry(e).body) for e in fake.entries] == [b"p1", b"later"]


def test_writes_waiting_on_a_gap_follow_their_predecessor_at_once(fake):
    """Seq 1's first attempt is lost (nothing stored, no answer); seqs 2..40 arrive and meet
    the gap. Once seq 1 is resent and stored, each waiting write must go right after the one
    before it succeeds, not at its own backed-off retry time: retried on their own (up to
    200 ms each, in random order) a chain of 40 took seconds, and after a leader's handler
    was killed a writer's appends timed out behind such a convoy for 10 s (chaos seed 11)."""
    SessionLeader(fake).first_session_answers({1: [None]})
    with DLedgerClient(fake.peers, GROUP, timeout=10.0, attempt_timeout=0.5) as c:
        t0 = time.monotonic()
        futs = [c.append_async(b"g%02d" % k) for k in range(40)]
        got = [f.result(10).index for f in futs]
        took = time.monotonic() - t0
    assert got == list(range(40))
    assert took < 0.5 + 0.6, f"{took:.2f} s: the writes behind the gap waited out their own backoffs"


@pytest.mark.parametrize("code", [RC.DISK_FULL, RC.INTERNAL_ERROR, RC.SESSION_SEQ_TOO_OLD])
def test_a_refused_resend_of_a_possibly_stored_write_is_indeterminate(fake, code):
    """The first attempt's answer is lost (it may be stored); the resend is refused with a
    code that speaks only for itself. Before the fix DISK_FULL and INTERNAL_ERROR surfaced as
    definite failures (a caller that retries one would store the write twice) and TOO_OLD as
    a plain DLedgerError."""
    leader = SessionLeader(fake)
    leader.first_session_answers({1: [None, int(code)]})
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        with pytest.raises(DLedgerError) as ei:
            c.append(b"maybe")
    assert ei.value.code == code and ei.value.indeterminate


def test_a_definite_refusal_of_a_first_attempt_stays_definite(fake):
    """Only a write that may have been stored turns indeterminate: a first attempt refused
    DISK_FULL is definitely not in the log."""
    leader = SessionLeader(fake)
    leader.first_session_answers({1: [RC.DISK_FULL]})
    with DLedgerClient(fake.peers, GROUP, timeout=3.0, attempt_timeout=0.3) as c:
        with pytest.raises(DLedgerError) as ei:
            c.append(b"refused")
    assert ei.value.code == RC.DISK_FULL and not ei.value.indeterminate
