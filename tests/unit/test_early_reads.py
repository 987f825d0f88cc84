"""node/core/reads.py: answers of reads sent to the applier before leadership is confirmed are
held until a quorum round that started after the read arrived lands (docs/performance.md
proposal 3)."""

from node.core.reads import EarlyReads


def test_an_answer_is_held_until_a_round_that_started_after_the_read_lands():
    t = EarlyReads()
    t.add(1, arrived_ms=100, term=3, deadline_ms=900)
    assert t.hold(1, "a1") is True
    assert t.settle(3, quorum_ms=99, now_ms=120) == ([], [])  # a round from before the read
    assert t.settle(3, quorum_ms=100, now_ms=121) == (["a1"], [])
    assert len(t) == 0 and t.hold(1, "late") is False  # gone: a second answer is not held


def test_a_read_confirmed_before_its_answer_leaves_the_table_and_its_answer_goes_out_at_once():
    t = EarlyReads()
    t.add(1, 100, 3, 900)
    assert t.settle(3, 150, 160) == ([], [])
    assert len(t) == 0
    assert t.hold(1, "a1") is False  # the handler answers it at once


def test_a_lost_term_fails_every_read_and_an_unconfirmed_one_times_out():
    t = EarlyReads()
    t.add(1, 100, 3, 900)
    t.add(2, 200, 3, 300)
    t.hold(1, "a1")
    assert t.settle(3, 99, 300) == ([], [(2, "TIMEOUT")])  # 1 is not confirmed, 2 waited too long
    assert t.settle(None, 500, 301) == ([], [(1, "NOT_LEADER")])  # a held answer is never released
    t.add(3, 400, 3, 900)
    assert t.settle(4, 500, 401) == ([], [(3, "NOT_LEADER")])  # leading another term
    t.add(4, 400, 3, 900)
    assert t.fail_all() == [4] and len(t) == 0
