"""The ack checker's rule as a decision table: `quorum_index` and `commit_index`
(node/core/replication.py; DLedger's QuorumAckChecker; docs/replication.md
"The commit rule"; Raft paper §5.3-§5.4.2 and Figure 8).

quorum index = element n//2 of the current term's watermarks sorted descending, the leader's
own ledger end being one of them; a watermark of an older term counts as -1 (ack_checker.py
"cleans" them that way). The committed index only moves forward, and only to an entry of the
current term.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.replication import (
    commit_index,
    current_term_watermarks,
    quorum_advance,
    quorum_index,
)
from node.store.codec import MAGIC_NOOP
from node.store.memory_store import MemoryStore

# ------------------------------------------------------------------------------------------
# quorum_index: the highest index stored on a majority
# ------------------------------------------------------------------------------------------
QUORUM_ROWS = [
    # (watermarks, leader's own end first; expected quorum index)
    pytest.param([], -1, id="no-members"),
    pytest.param([-1], -1, id="1-node-empty"),
    pytest.param([7], 7, id="1-node-own-end-is-the-quorum"),
    pytest.param([-1, -1, -1], -1, id="3-all-empty"),
    pytest.param([5, -1, -1], -1, id="3-leader-alone-is-no-quorum"),
    pytest.param([5, 3, -1], 3, id="3-leader-plus-one-follower"),
    pytest.param([5, -1, 3], 3, id="3-order-does-not-matter"),
    pytest.param([5, 5, -1], 5, id="3-one-follower-caught-up"),
    pytest.param([5, 3, 3], 3, id="3-tie-below-leader"),
    pytest.param([5, 5, 5], 5, id="3-all-equal"),
    pytest.param([4, 9, 7], 7, id="3-follower-ahead-of-leader-end-never-counts-alone"),
    pytest.param([9, -1, -1, -1, -1], -1, id="5-leader-alone"),
    pytest.param([9, 8, -1, -1, -1], -1, id="5-two-of-five"),
    pytest.param([9, 8, 7, -1, -1], 7, id="5-three-of-five"),
    pytest.param([3, 9, 1, 7, 5], 5, id="5-median"),
    pytest.param([4, 4, 2, 2, 2], 2, id="5-tie-two-high-three-low"),
    pytest.param([4, 4, 4, 2, 2], 4, id="5-tie-three-high"),
    pytest.param([9, 9, 9, 9, 9], 9, id="5-all-equal"),
    pytest.param([5, 3], 3, id="2-needs-both"),
    pytest.param([5, 3, 2, 1], 2, id="4-needs-three"),
]


@pytest.mark.parametrize(("marks", "expected"), QUORUM_ROWS)
def test_quorum_index_table(marks: list[int], expected: int) -> None:
    # "Ack checker": the median of the watermarks sorted descending (element size/2).
    assert quorum_index(marks) == expected


def test_quorum_index_does_not_mutate_its_input() -> None:
    marks = [1, 9, 5]
    quorum_index(marks)
    assert marks == [1, 9, 5]


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=50), min_size=1, max_size=7))
def test_quorum_index_is_the_highest_index_a_majority_stores(marks: list[int]) -> None:
    # Raft §5.3: an entry is "stored on a majority" when more than half the members hold it.
    majority = len(marks) // 2 + 1
    q = quorum_index(marks)
    assert sum(m >= q for m in marks) >= majority
    best = max((v for v in set(marks) if sum(m >= v for m in marks) >= majority), default=-1)
    assert q == best


# ------------------------------------------------------------------------------------------
# commit_index: forward only, current term only (Raft §5.4.2)
# ------------------------------------------------------------------------------------------
COMMIT_ROWS = [
    # (quorum, term_at_quorum, current_term, committed, expected)
    pytest.param(5, 3, 3, 2, 5, id="advance-to-current-term-entry"),
    pytest.param(5, 2, 3, 2, 2, id="older-term-at-quorum-not-committed-by-counting"),
    pytest.param(5, 3, 3, 5, 5, id="same-as-committed"),
    pytest.param(3, 3, 3, 5, 5, id="quorum-behind-committed-never-moves-back"),
    pytest.param(-1, -1, 3, -1, -1, id="nothing-stored-anywhere"),
    pytest.param(-1, -1, 3, 4, 4, id="quorum-minus-one-keeps-committed"),
    pytest.param(0, 1, 1, -1, 0, id="first-entry-of-the-log"),
    pytest.param(7, 4, 3, 2, 2, id="term-from-the-future-is-no-match-either"),
]


@pytest.mark.parametrize(("quorum", "term_q", "term", "committed", "expected"), COMMIT_ROWS)
def test_commit_index_table(quorum: int, term_q: int, term: int, committed: int, expected: int) -> None:
    assert commit_index(quorum, term_q, term, committed) == expected


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 30), st.integers(0, 4)), max_size=25))
def test_commit_index_never_moves_backwards(steps: list[tuple[int, int]]) -> None:
    # committedIndex only grows; a quorum that shrinks (watermarks cleaned on a term
    # change, a follower restarted) never takes it back.
    committed, term = -1, 3
    for quorum, term_q in steps:
        new = commit_index(quorum, term_q, term, committed)
        assert new >= committed
        assert new in (committed, quorum)
        committed = new


def _ack_check(store: MemoryStore, marks: list[int], term: int, committed: int) -> int:
    """What ack_checker.AckChecker.check does with the leader's store (term_at)."""
    q = quorum_index(marks)
    if q <= committed or q < 0:
        return committed
    return commit_index(q, store.term_at(q), term, committed)


def _log(terms: list[int]) -> MemoryStore:
    s = MemoryStore()
    for t in terms:
        s.append_leader(b"x", t)
    return s


def test_figure8_old_term_entry_on_a_majority_is_not_committed_by_counting() -> None:
    # Raft Figure 8 (c): S1 leads term 4 with [1, 2] (index 0 term 1, index 1 term 2); the
    # term-2 entry at index 1 reaches S2 and S3 (3 of 5), S4 holds [1], S5 holds [1, 3].
    # Counting replicas would commit index 1, but S5 could still be elected (its last term 3 >
    # 2) and overwrite it (Figure 8 (d)). So the term-4 leader must not commit it.
    s1 = _log([1, 2])
    marks = [1, 1, 1, 0, -1]  # S1's own end, S2, S3, S4, S5 (no watermark in term 4 yet)
    assert quorum_index(marks) == 1
    assert _ack_check(s1, marks, term=4, committed=0) == 0


def test_figure8_old_term_entry_commits_with_a_current_term_entry_above_it() -> None:
    # Raft Figure 8 (e): S1 appends an entry of its own term 4 at index 2 and replicates it to
    # S2 and S3: now index 2 (term 4) is on a majority and commits, and index 1 with it.
    s1 = _log([1, 2, 4])
    marks = [2, 2, 2, 0, -1]
    assert _ack_check(s1, marks, term=4, committed=0) == 2


def test_new_leaders_noop_commits_the_previous_terms_tail() -> None:
    # DLedger #305: the new leader's NOOP is the current-term entry that lets
    # earlier entries commit without waiting for a client write.
    s = _log([1, 1, 1])
    marks_before = [2, 2, -1]
    assert _ack_check(s, marks_before, term=2, committed=0) == 0  # index 2 is term 1: stuck
    s.append_leader(b"", 2, MAGIC_NOOP)  # handler._become_leader
    marks_after = [3, 3, -1]
    assert _ack_check(s, marks_after, term=2, committed=0) == 3


def test_older_term_watermarks_count_as_minus_one() -> None:
    # ack_checker.py: a follower's watermark whose match term is not the current term is -1.
    # Two stale watermarks at 9 must not form a quorum with the leader in term 5.
    term = 5
    peers = [(9, 4), (9, 4)]  # (match index, match term) of the two followers
    marks = [9] + [m if t == term else -1 for m, t in peers]
    assert quorum_index(marks) == -1


# ------------------------------------------------------------------------------------------
# quorum_advance: the whole ack checker decision (what AckChecker.check publishes)
# ------------------------------------------------------------------------------------------
def test_current_term_watermarks_use_the_own_end_and_clean_older_terms() -> None:
    assert current_term_watermarks(5, 1, 9, [(8, 5), (0, 0), (7, 4)]) == [8, 9, -1]


@pytest.mark.parametrize(("terms", "marks", "published", "expected"), [
    pytest.param([1, 2, 2], [2, 2, -1], (-1, -1), 2, id="first-advance"),
    pytest.param([1, 2, 2], [2, 2, -1], (2, 2), None, id="already-published"),
    pytest.param([1, 2, 2], [2, 1, -1], (-1, -1), 1, id="advance-to-a-current-term-entry"),
    pytest.param([1, 1, 2], [2, 1, -1], (-1, -1), None, id="figure-8-older-term-entry-never-by-counting"),
    pytest.param([1, 2, 2], [2, 2, 2], (2, 1), 2, id="an-index-of-another-term-counts-as-nothing"),
    pytest.param([1, 2, 2], [2, -1, -1], (-1, -1), None, id="no-quorum"),
])
def test_quorum_advance_table(terms: list[int], marks: list[int], published: tuple[int, int],
                              expected: int | None) -> None:
    s = _log(terms)
    assert quorum_advance(2, marks, *published, s.term_at) == expected
