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


def test_held_fetches_are_answered_in_rounds_spaced_by_their_cost(tmp_path: Path) -> None:
    """While the log grows, readers at the end get one round per commit, and the next round
    comes only after (1 - share) / share times the last round's duration, however many commits
    come meanwhile; a request between rounds waits for the next, even one that could be filled
    (a reader catching up is on the budget too while there are writes to protect)."""
    from node.roles.handling import fetches as F

    clock = Clock()
    h, wire, state = follower(tmp_path, clock, committed=0)
    ticks = iter(x / 1000 for x in range(0, 100_000, 2))  # every timer read: +2 ms
    h.fetches.timer = lambda: next(ticks)
    h.tick()
    h.store.append_leader(b"growing", 3)  # the log grows: the budget applies
    for rid in range(10):
        fetch(h, rid, 1, wait_ms=5000)
    h.store.set_committed_index(1)
    h.tick()  # one round: 2 ms by the fake timer, plus 2 ms per request held before it
    assert all(indexes(wire.answer(rid)) == [1] for rid in range(10))
    spacing = (1 - F.FETCH_SHARE) / F.FETCH_SHARE
    nbytes = sum(len(wire.answer(rid).entries) for rid in range(10))
    cost_s = (10 * 2 + 2) / 1000 + 10 * F.REQUEST_OVERHEAD_S + nbytes * F.BYTE_COST_S
    assert abs(h.fetches.next_round_ms - (clock.now + cost_s * 1000 * spacing)) < 1e-6
    for rid in range(10, 20):  # they ask again at once for 2.., and 2 commits in the same ms
        fetch(h, rid, 2, wait_ms=5000)
    h.store.set_committed_index(2)
    h.tick()
    assert all(wire.answer(rid) is None for rid in range(10, 20)), "a round before the budget allows"
    assert h.next_wait_ms() <= cost_s * 1000 * spacing + 1  # the loop wakes for the round, no polling
    fetch(h, 99, 0, wait_ms=5000, max_entries=2)  # could be filled: still waits for the round
    assert wire.answer(99) is None
    clock.now = int(h.fetches.next_round_ms) + 1
    h.tick()
    assert all(indexes(wire.answer(rid)) == [2] for rid in range(10, 20))
    assert indexes(wire.answer(99)) == [0, 1]


def test_without_writes_there_is_no_budget(tmp_path: Path) -> None:
    """A log that is not growing has no append path to protect: a reader catching up on
    history, or many readers, are answered at once, round after round."""
    from node.roles.handling.fetches import BUSY_WINDOW_MS

    clock = Clock()
    h, wire, _ = follower(tmp_path, clock, committed=3)
    h.fetches.timer = iter(x / 1000 for x in range(0, 10_000, 50)).__next__  # 50 ms a round
    h.tick()
    clock.now += BUSY_WINDOW_MS  # the log has not moved since
    for rid in range(5):
        fetch(h, rid, rid % 4, wait_ms=5000, max_entries=1)
        assert indexes(wire.answer(rid)) == [rid % 4], "waited for a budget with no writes to protect"
