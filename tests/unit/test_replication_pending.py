"""The leader's pending-reply table (node/core/pending.py; DLedger's
pendingAppendResponsesByTerm): register, complete on commit, expire, fail on term change,
and the entry-counting bound behind LEADER_PENDING_FULL."""

from __future__ import annotations

from node.core.pending import Pending, PendingTable


def p(first: int, n: int = 1, deadline: int = 100) -> Pending:
    return Pending(b"c", first, first, list(range(n)) if n > 1 else None, 0, deadline)


def keys(due: list) -> list[tuple[int, int]]:
    return [(t, last) for t, last, _p in due]


def test_complete_answers_exactly_what_the_committed_index_covers() -> None:
    t = PendingTable(100)
    t.register(2, 0, p(0))
    t.register(2, 3, p(1, 3))  # a batch of 1..3
    t.register(2, 4, p(4))
    assert keys(t.complete(2)) == [(2, 0)]  # the batch's last entry (3) is not committed
    assert keys(t.complete(3)) == [(2, 3)]
    assert t.entries == 1 and len(t) == 1
    assert keys(t.complete(9)) == [(2, 4)]
    assert t.entries == 0


def test_expire_answers_only_what_passed_its_deadline_in_order() -> None:
    t = PendingTable(100)
    t.register(2, 0, p(0, deadline=10))
    t.register(2, 1, p(1, deadline=20))
    assert t.next_deadline() == 10
    assert keys(t.expire(9)) == []
    assert keys(t.expire(10)) == [(2, 0)]
    assert t.next_deadline() == 20


def test_fail_all_empties_the_table() -> None:
    t = PendingTable(100)
    t.register(2, 0, p(0))
    t.register(2, 2, p(1, 2))
    assert keys(t.fail_all()) == [(2, 0), (2, 2)]
    assert (len(t), t.entries, t.next_deadline()) == (0, 0, None)


def test_full_counts_entries_not_requests() -> None:
    t = PendingTable(4)
    t.register(2, 2, p(0, 3))
    assert not t.full(1)
    assert t.full(2)
    t.complete(2)
    assert not t.full(4)
