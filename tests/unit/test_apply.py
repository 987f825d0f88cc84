"""The state-machine plumbing as data: the applier's decisions (node/core/apply.py), the
handler's result cache (node/core/results.py), the in-node frames (node/wiring/channels.py), and the
real Handler answering appends with their results and forwarding reads at a read index."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.apply import (
    ParkedQuery,
    ReplayGap,
    compaction_floor,
    due_queries,
    next_run,
    replay_start,
    snapshot_due,
)
from node.core.results import EVICTED, AwaitingResults, ResultCache
from node.core.retention import DataFile, RetentionPolicy, plan_retention
from node.wiring import channels
from tests.unit.test_replication_roles import Clock, commit_all, leader_handler, member


def test_replay_starts_after_the_snapshot_and_needs_the_log_from_there():
    assert replay_start(-1, -1, -1) == 0  # empty log, no snapshot
    assert replay_start(-1, 0, 10) == 0
    assert replay_start(99, 50, 200) == 100  # the log overlaps the snapshot: fine
    assert replay_start(99, 100, 200) == 100
    with pytest.raises(ReplayGap, match="begins at index 101, but the state machine needs the entries from 100"):
        replay_start(99, 101, 200)
    with pytest.raises(ReplayGap, match="no snapshot"):
        replay_start(-1, 5, 9)


def test_runs_snapshots_reads_and_the_compaction_floor():
    assert next_run(5, 5) is None and next_run(7, 5) is None
    assert next_run(-1, 3) == (0, 3)
    assert next_run(10, 5000, 1024) == (11, 1034)
    assert not snapshot_due(99, -1, 101) and snapshot_due(100, -1, 101)
    assert snapshot_due(300, 200, 100) and not snapshot_due(299, 200, 100)
    q = [ParkedQuery(1, 5, b"a", b"h"), ParkedQuery(2, 9, b"b", b"h")]
    ready, wait = due_queries(q, 7)
    assert [x.tag for x in ready] == [1] and [x.tag for x in wait] == [2]
    assert compaction_floor(-1) == -1 and compaction_floor(42) == 42


def test_retention_never_deletes_past_the_newest_snapshot_even_when_forced():
    files = [DataFile(0, 99, 0.0), DataFile(100, 199, 0.0), DataFile(200, 299, 0.0)]
    pol = RetentionPolicy(0, 0.5, 0.9, max_files=5)
    free = plan_retention(files, now_s=1e9, disk_usage_ratio=0.95, committed_index=299, peer_next_index={},
                          policy=pol)
    assert free.delete_before == 200  # no state machine: both old files go
    held = plan_retention(files, now_s=1e9, disk_usage_ratio=0.95, committed_index=299, peer_next_index={},
                          policy=pol, compaction_floor=150)
    assert (held.delete_before, held.files, held.held_by_snapshot) == (100, 1, True)
    none = plan_retention(files, now_s=1e9, disk_usage_ratio=0.95, committed_index=299, peer_next_index={},
                          policy=pol, compaction_floor=-1)
    assert none.files == 0 and none.held_by_snapshot


def test_the_result_cache_keeps_the_newest_and_knows_what_it_lost():
    c = ResultCache(max_entries=4)
    assert c.lookup(0, 0) is None  # not arrived yet
    c.put(0, [None, b"a", b"b"])
    assert c.lookup(1, 2) == [b"a", b"b"] and c.lookup(2, 3) is None
    c.put(3, [b"c", b"d"])  # 5 results, 4 kept: index 0 evicted
    assert c.lookup(0, 1) == EVICTED and c.lookup(1, 4) == [b"a", b"b", b"c", b"d"]
    c.put(3, [b"X"])  # a repeat (a restarted applier replaying) changes nothing
    assert c.lookup(3, 3) == [b"c"]
    c.put(10, [b"j"])  # a gap: what lies below can never complete
    assert c.lookup(4, 4) == EVICTED and c.lookup(10, 10) == [b"j"]


def test_awaiting_replies_are_released_when_their_last_result_arrives():
    class R:
        def __init__(self, first: int) -> None:
            self.first_index = first

    a, c = AwaitingResults(), ResultCache()
    a.park(3, 5, R(4))
    a.park(3, 6, R(6))
    c.put(0, [b"%d" % i for i in range(6)])
    out = a.release(c)
    assert [(t, last, res) for t, last, _r, res in out] == [(3, 5, [b"4", b"5"])] and len(a) == 1


def test_in_node_frames_round_trip_and_reject_junk():
    f = channels.encode_results(7, [None, b"", b"xyz"])
    assert channels.decode_results(f) == (7, [None, b"", b"xyz"])
    assert channels.decode_results(f + b"!") is None and channels.decode_results(f[:-1]) is None
    q = channels.encode_query(9, 41, b"req")
    assert channels.decode_query(q) == (9, 41, b"req", channels.QueryKind.READ)
    assert channels.decode_query(b"12") is None
    r = channels.encode_query_reply(9, channels.QUERY_OK, 41, b"ans")
    assert channels.decode_query_reply(r) == (9, channels.QUERY_OK, 41, b"ans")


class FakeLink:
    def __init__(self) -> None:
        self.hints, self.queries = 0, []

    def committed_moved(self) -> None:
        self.hints += 1

    def send_query(self, frame: bytes) -> bool:
        q = channels.decode_query(frame)  # a read as (tag, read index, request); others whole
        self.queries.append(q[:3] if q is not None and q.kind == channels.QueryKind.READ else q)
        return True


def _sm_leader(tmp_path: Path):
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    return h, wire, state, clock


def test_an_append_is_answered_once_applied_with_what_apply_returned(tmp_path: Path) -> None:
    h, wire, state, _clock = _sm_leader(tmp_path)
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"one", request_id=10)))
    h.handle_frame(b"c", P.encode(P.BatchAppendRequest("g", "n1", [b"two", b"three"], request_id=11)))
    first = h.store.ledger_end_index - 2
    commit_all(h, state)
    assert wire.answer(10) is None and wire.answer(11) is None, "committed but not applied: no answer yet"
    assert h.sm_link.hints >= 1, "the applier was not told the committed index moved"
    h.on_results(channels.encode_results(0, [None] * first + [b"r1"]))
    one = wire.answer(10)
    assert (one.code, one.index, bytes(one.result)) == (RC.SUCCESS, first, b"r1") and wire.answer(11) is None
    h.on_results(channels.encode_results(first + 1, [b"r2", None]))
    two = wire.answer(11)
    assert two.first_index == first + 1 and [None if r is None else bytes(r) for r in two.results] == [b"r2", None]


def test_a_read_is_forwarded_at_once_and_answered_once_leadership_is_confirmed(tmp_path: Path) -> None:
    """The applier hop overlaps the heartbeat round (node/core/reads.py): the query goes to the
    applier when it arrives, at the committed index then, and the answer waits for a round
    that started after the read arrived."""
    h, wire, state, clock = _sm_leader(tmp_path)
    commit_all(h, state)
    clock.now += 10
    h.handle_frame(b"c", P.encode(P.QueryRequest("g", "n1", b"what", request_id=20)))
    assert len(h.sm_link.queries) == 1
    tag, read_index, request = h.sm_link.queries[0]
    assert (read_index, request) == (h.store.committed_index, b"what")
    h.on_query_reply(channels.encode_query_reply(tag, channels.QUERY_OK, read_index, b"answer"))
    h.tick()
    assert wire.answer(20) is None, "answered before a heartbeat round confirmed the leader"
    clock.now += 5
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)  # a round that began after it
    h.tick()
    got = wire.answer(20)
    assert (got.code, bytes(got.answer), got.applied_index) == (RC.SUCCESS, b"answer", read_index)


def test_a_group_without_a_state_machine_refuses_reads(tmp_path: Path) -> None:
    h, wire, _state = leader_handler(tmp_path, Clock())
    h.handle_frame(b"c", P.encode(P.QueryRequest("g", "n1", b"what", request_id=30)))
    assert wire.answer(30).code == RC.UNSUPPORTED


def test_a_reply_whose_results_never_come_is_answered_without_them_once_applied(tmp_path: Path) -> None:
    """A handler restarted after its applier sent the results of an entry (a session retry of
    it arrives): no results will come in an idle group, so once the block says the entry is
    applied and the grace has passed, the retry is answered without a result (found by the
    simulator's review: it waited for the next results for ever)."""
    h, wire, state, clock = _sm_leader(tmp_path)
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"one", request_id=50)))
    index = h.store.ledger_end_index
    commit_all(h, state)
    h.tick()
    assert wire.answer(50) is None
    state.set("applied_index", index - 1)
    clock.now += 5_000
    h.tick()
    assert wire.answer(50) is None, "answered before its entry was applied"
    state.set("applied_index", index)
    h.tick()
    assert wire.answer(50) is None, "answered before the grace for in-flight results passed"
    clock.now += 2_000
    h.tick()
    got = wire.answer(50)
    assert (got.code, got.index, got.result) == (RC.SUCCESS, index, None)
