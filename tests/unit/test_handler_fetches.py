"""FETCH through the real Handler (node/roles/handling/fetches.py): any role answers with
committed entries only, a request past the committed end is held until the entry commits or
its wait ends, a member that knows no leader holds nothing, a start below the log's begin is
INDEX_LESS_THAN_LOCAL_BEGIN, and readers held at one index share one read of the log."""

from __future__ import annotations

from pathlib import Path

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.store import codec
from tests.unit.test_replication_roles import (
    Clock,
    FakeState,
    commit_all,
    leader_handler,
    make_handler,
    member,
    store_of,
)


def fetch(h, rid: int, index: int, wait_ms: int = 0, max_entries: int = 100) -> None:  # noqa: ANN001
    h.handle_frame(b"r%d" % rid, P.encode(P.FetchRequest("g", "n1", index, max_entries, 1 << 20, wait_ms, rid)))


def indexes(msg: P.FetchResponse) -> list[int]:
    return [e.index for _o, e in codec.iter_entries(msg.entries)]


def follower(tmp_path: Path, clock: Clock, committed: int, leader: int = 0):  # noqa: ANN201
    state = FakeState()
    state.member = member(Role.FOLLOWER, 3, leader)
    store = store_of([1, 2, 3, 3])
    store.set_committed_index(committed)
    h, wire = make_handler(tmp_path, "n1", state, clock, store=store)
    return h, wire, state


def test_a_follower_answers_with_its_committed_entries_only(tmp_path: Path) -> None:
    h, wire, _ = follower(tmp_path, Clock(), committed=1)
    fetch(h, 1, 0)
    got = wire.answer(1)
    assert got.code == RC.SUCCESS and indexes(got) == [0, 1]  # 2 and 3 are not committed here
    assert (got.begin_index, got.committed_index, got.leader_id) == (0, 1, "n0")
    fetch(h, 2, 2)  # nothing committed from 2, no wait: empty at once
    got = wire.answer(2)
    assert got.code == RC.SUCCESS and indexes(got) == []


def test_a_held_fetch_is_answered_at_commit_and_readers_at_one_index_share_the_read(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)  # entries 0, 1 and the NOOP 2, none committed
    fetch(h, 1, 0, wait_ms=5000)
    fetch(h, 2, 0, wait_ms=5000)
    h.tick()
    assert wire.answer(1) is None and wire.answer(2) is None
    reads = []
    real = h.store.get_raw
    h.store.get_raw = lambda *a: reads.append(a) or real(*a)
    commit_all(h, state)
    h.tick()
    a, b = wire.answer(1), wire.answer(2)
    assert indexes(a) == indexes(b) == [0, 1, 2]
    assert len(reads) == 1, "two readers at one index read the log twice"


def test_a_held_fetch_ends_empty_at_its_wait(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, _ = follower(tmp_path, clock, committed=3)
    fetch(h, 1, 4, wait_ms=200)
    h.tick()
    assert wire.answer(1) is None
    assert h.next_wait_ms() <= 200  # the loop wakes for the deadline, no polling
    clock.now += 200
    h.tick()
    got = wire.answer(1)
    assert got.code == RC.SUCCESS and indexes(got) == [] and got.committed_index == 3


def test_a_member_that_knows_no_leader_holds_no_fetch(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = follower(tmp_path, clock, committed=3)
    fetch(h, 1, 4, wait_ms=5000)
    h.tick()
    assert wire.answer(1) is None
    state.member = member(Role.CANDIDATE, 4, -1)  # the leader is gone: the index cannot move
    h.tick()
    got = wire.answer(1)
    assert got.code == RC.SUCCESS and indexes(got) == [] and got.leader_id == ""
    fetch(h, 2, 4, wait_ms=5000)  # and a new one is answered at once
    got = wire.answer(2)
    assert got is not None and got.leader_id == ""


def test_a_fetch_below_the_log_begin_or_with_bad_arguments_is_refused(tmp_path: Path) -> None:
    h, wire, _ = follower(tmp_path, Clock(), committed=3)
    h.store.ledger_begin_index = 2  # as after retention
    fetch(h, 1, 1)
    got = wire.answer(1)
    assert got.code == RC.INDEX_LESS_THAN_LOCAL_BEGIN and "begins at 2" in got.reason
    fetch(h, 2, 0, max_entries=0)
    assert wire.answer(2).code == RC.UNEXPECTED_ARGUMENT
