"""DispatcherCore, one transition per test (node/core/replication.py; DLedger's EntryDispatcher;
docs/replication.md "Dispatcher"; Raft paper §5.3).

The leader's log is a fake: a list of terms, `term_at` a dict lookup, so every test states
the log it runs against. Time is an int of milliseconds passed in.
"""

from __future__ import annotations

import pytest

from ipc.codes import ResponseCode as RC
from node.core.replication import (
    Append,
    Commit,
    Compare,
    DispatcherConfig,
    DispatcherCore,
    NeedSnapshot,
    PushState,
    Truncate,
)

CFG = DispatcherConfig(max_pending=3, max_push_timeout_ms=1000, commit_interval_ms=1000,
                       commit_eager_ms=20, request_timeout_ms=1000, retry_backoff_ms=50)


class Log:
    """The leader's log as far as the dispatcher reads it: begin, end, term_at."""

    def __init__(self, terms: list[int], begin: int = 0) -> None:
        self.begin = begin if terms else -1
        self.terms = {begin + i: t for i, t in enumerate(terms)}
        self.end = begin + len(terms) - 1 if terms else -1
        self.reads: list[int] = []

    def term_at(self, i: int) -> int:
        self.reads.append(i)
        return self.terms[i]  # KeyError = the core read outside the leader's log


def act(d: DispatcherCore, log: Log, now: int, committed: int = -1):  # noqa: ANN201
    return d.next_action(now, log.begin, log.end, committed, log.term_at)


def leader(log: Log, term: int = 3, cfg: DispatcherConfig = CFG) -> DispatcherCore:
    d = DispatcherCore(cfg)
    d.become_leader(term, log.end)
    return d


def to_append(log: Log, match: int, now: int = 0, term: int = 3) -> DispatcherCore:
    """A dispatcher in APPEND with the follower matched at `match` (COMPARE → TRUNCATE done)."""
    d = leader(log, term)
    d.write_index = match + 1
    a = act(d, log, now)
    assert a == (Compare(match, log.term_at(match)) if match >= 0 else Compare(-1, -1))
    d.sent(a, now)
    assert d.on_response("COMPARE", RC.SUCCESS, now, first_index=match)
    a = act(d, log, now)
    assert a == Truncate(match + 1)
    d.sent(a, now)
    d.on_response("TRUNCATE", RC.SUCCESS, now, first_index=match + 1)
    assert d.state == PushState.APPEND and d.match_index == match
    return d


# ------------------------------------------------------------------------------------------
# IDLE → COMPARE
# ------------------------------------------------------------------------------------------
def test_new_core_is_idle_and_sends_nothing() -> None:
    d = DispatcherCore(CFG)
    assert d.state == PushState.IDLE
    assert act(d, Log([1, 1]), 0) is None


def test_become_leader_starts_compare_from_ledger_end_plus_one() -> None:
    # DLedger: a new leader's dispatcher starts in COMPARE; writeIndex =
    # ledgerEnd + 1, pending cleared.
    log = Log([1, 1, 2])
    d = to_append(log, 2)
    d.sent(Append(3, 1), 0, 3)
    assert d.pending
    d.become_leader(4, 9)  # a new term: start over
    assert d.state == PushState.COMPARE
    assert d.term == 4
    assert d.write_index == 10
    assert d.match_index == -1
    assert not d.pending
    assert d.inflight_request is None


def test_compare_with_empty_leader_log_is_minus_one_minus_one() -> None:
    # DLedger's doCompare / handleDoCompare: ledgerEndIndex == -1 → nothing to compare; the follower
    # answers (-1, -1) with SUCCESS.
    log = Log([])
    d = leader(log)
    assert act(d, log, 0) == Compare(-1, -1)
    assert log.reads == []


def test_compare_asks_about_write_index_minus_one_with_its_term() -> None:
    log = Log([1, 1, 2, 2])
    d = leader(log)
    assert act(d, log, 0) == Compare(3, 2)


def test_compare_is_not_repeated_while_one_is_in_flight() -> None:
    log = Log([1, 1])
    d = leader(log)
    assert isinstance(act(d, log, 0), Compare)
    assert act(d, log, 10) is None
    assert act(d, log, 999) is None


def test_unanswered_compare_is_asked_again_after_the_request_timeout() -> None:
    log = Log([1, 1])
    d = leader(log)
    first = act(d, log, 0)
    assert act(d, log, CFG.request_timeout_ms) == first


def test_compare_success_sets_match_and_goes_truncate() -> None:
    # DLedger's doCompare: SUCCESS → matchIndex = compareIndex, updatePeerWaterMark, TRUNCATE.
    log = Log([1, 1, 2, 2])
    d = leader(log)
    act(d, log, 0)
    moved = d.on_response("COMPARE", RC.SUCCESS, 5, index=3, end_index=3, first_index=3)
    assert moved is True  # the watermark is published: dispatcher.py writes the peer slot
    assert d.match_index == 3 == d.write_index - 1
    assert d.state == PushState.TRUNCATE


def test_compare_inconsistent_with_x_term_the_leader_lacks_jumps_to_x_index() -> None:
    # docs/replication.md "Why the fast backup differs": fast backup: xTerm != -1 → skip the
    # follower's whole xTerm run: writeIndex = xIndex. Here the leader has no entry of term 4 at
    # all.
    log = Log([1, 1, 1, 5, 5, 5])
    d = leader(log)
    assert act(d, log, 0) == Compare(5, 5)
    assert d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=7, x_term=4, x_index=3, first_index=5) is False
    assert d.state == PushState.COMPARE
    assert act(d, log, 2) == Compare(2, 1)
    assert d.write_index == 3


def test_compare_inconsistent_with_x_term_the_leader_has_continues_after_its_last() -> None:
    # Raft §5.3 (the refinement of its fast-backup optimisation; etcd: findConflictByTerm):
    # the leader also holds entries of xTerm, up to index 3, so the follower's entries of xTerm
    # up to 3 agree with ours: compare at 3, not at xIndex - 1 (which would TRUNCATE agreeing,
    # maybe committed, entries). The everyday case: the old leader of term 1 with [1 1 1 1 1 1] rejoins the new
    # leader of term 2 holding [1 1 1 1 2] (its NOOP at 4).
    log = Log([1, 1, 1, 1, 2])
    d = leader(log, term=2)
    assert act(d, log, 0) == Compare(4, 2)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=5, x_term=1, x_index=0, first_index=4)
    assert act(d, log, 2) == Compare(3, 1)
    d.on_response("COMPARE", RC.SUCCESS, 3, first_index=3)
    assert act(d, log, 4) == Truncate(4)


@pytest.mark.parametrize(("terms", "x_term", "x_index", "expected"), [
    pytest.param([1, 2, 2, 2, 2, 2, 2, 2, 2, 6], 2, 1, Compare(8, 2), id="long-run-ends-before-compared"),
    pytest.param([1, 2, 3, 3, 3, 3, 3, 6], 2, 1, Compare(1, 2), id="leader-run-shorter-than-followers"),
    pytest.param([1, 1, 3, 3, 6], 2, 2, Compare(1, 1), id="term-absent-in-between"),
    pytest.param([4, 4, 4, 6], 2, 0, Compare(-1, -1), id="all-leader-terms-above-x-term"),
])
def test_fast_backup_targets(terms: list[int], x_term: int, x_index: int, expected: Compare) -> None:
    # The follower answered: my entry at the compared index is of x_term, which starts at
    # x_index. Next compare: the leader's last entry of x_term (if any), else x_index - 1.
    log = Log(terms)
    d = leader(log, term=6)
    assert act(d, log, 0) == Compare(len(terms) - 1, 6)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=len(terms) + 3, x_term=x_term,
                  x_index=x_index, first_index=len(terms) - 1)
    assert act(d, log, 2) == expected


def test_compare_inconsistent_without_x_term_jumps_to_the_followers_end() -> None:
    # DLedger's handleDoCompare: the follower lacks preLogIndex → it returns its endIndex → writeIndex =
    # endIndex + 1.
    log = Log([1, 1, 1, 1, 1, 1])
    d = leader(log)
    act(d, log, 0)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=2, first_index=5)
    assert d.write_index == 3
    assert act(d, log, 2) == Compare(2, 1)


def test_compare_inconsistent_with_empty_follower_compares_from_the_start() -> None:
    log = Log([1, 1, 1])
    d = leader(log)
    act(d, log, 0)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=-1, first_index=2)
    assert act(d, log, 2) == Compare(-1, -1)


def test_compare_below_ledger_begin_needs_a_snapshot() -> None:
    # DLedger's doCompare: compareIndex < ledgerBeforeBegin → INSTALL_SNAPSHOT; we report it.
    log = Log([2, 2, 3], begin=10)  # entries 10..12; 0..9 deleted by retention
    d = leader(log)
    assert act(d, log, 0) == Compare(12, 3)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=4, first_index=12)
    a = act(d, log, 2)
    assert isinstance(a, NeedSnapshot) and a.index < log.begin
    assert d.inflight_request is None  # nothing is waiting for an answer


def test_compare_refused_for_another_reason_retries_after_backoff() -> None:
    # e.g. the follower has not learned the term yet (INCONSISTENT_TERM) or is no follower.
    log = Log([1, 1])
    d = leader(log)
    first = act(d, log, 0)
    d.on_response("COMPARE", RC.INCONSISTENT_TERM, 10, first_index=1)
    assert d.state == PushState.COMPARE
    assert act(d, log, 10 + CFG.retry_backoff_ms - 1) is None
    assert act(d, log, 10 + CFG.retry_backoff_ms) == first


def test_write_index_is_clamped_into_the_leaders_log() -> None:
    log = Log([1, 1, 1])
    d = leader(log)
    d.write_index = 50  # e.g. a follower that claimed a longer log
    assert act(d, log, 0) == Compare(2, 1)


# ------------------------------------------------------------------------------------------
# TRUNCATE
# ------------------------------------------------------------------------------------------
def test_truncate_is_sent_from_match_plus_one() -> None:
    # DLedger's doTruncate: truncateIndex = matchIndex + 1.
    log = Log([1, 1, 2, 2])
    d = leader(log)
    d.write_index = 2
    act(d, log, 0)
    d.on_response("COMPARE", RC.SUCCESS, 1, first_index=1)
    assert act(d, log, 2) == Truncate(2)
    assert act(d, log, 3) is None  # in flight


def test_truncate_success_goes_append_from_match_plus_one() -> None:
    log = Log([1, 1, 2, 2])
    d = leader(log)
    d.write_index = 2
    act(d, log, 0)
    d.on_response("COMPARE", RC.SUCCESS, 1, first_index=1)
    act(d, log, 2)
    assert d.on_response("TRUNCATE", RC.SUCCESS, 3, first_index=2) is False
    assert d.state == PushState.APPEND
    assert d.write_index == 2
    assert act(d, log, 4) == Append(2, 2)


def test_truncate_failure_goes_back_to_compare_after_backoff() -> None:
    log = Log([1, 1, 2, 2])
    d = leader(log)
    d.write_index = 2
    act(d, log, 0)
    d.on_response("COMPARE", RC.SUCCESS, 1, first_index=1)
    act(d, log, 2)
    d.on_response("TRUNCATE", RC.INCONSISTENT_STATE, 10, first_index=2)
    assert d.state == PushState.COMPARE
    assert act(d, log, 10 + CFG.retry_backoff_ms - 1) is None
    assert isinstance(act(d, log, 10 + CFG.retry_backoff_ms), Compare)


def test_unanswered_truncate_starts_over_with_compare() -> None:
    log = Log([1, 1, 2, 2])
    d = leader(log)
    d.write_index = 2
    act(d, log, 0)
    d.on_response("COMPARE", RC.SUCCESS, 1, first_index=1)
    act(d, log, 2)
    assert act(d, log, 2 + CFG.request_timeout_ms) == Compare(1, 1)
    assert d.state == PushState.COMPARE


# ------------------------------------------------------------------------------------------
# APPEND ⇄ COMMIT
# ------------------------------------------------------------------------------------------
def test_append_streams_from_write_index_and_respects_max_pending() -> None:
    # a pending map bounded by maxPendingSize (here 3 pushes in flight).
    log = Log([1] * 10)
    d = to_append(log, -1)
    sent = []
    for now in range(10):
        a = act(d, log, now)
        if not isinstance(a, Append):
            break
        last = min(a.first_index + 1, log.end)  # the process sends 2 entries per push
        d.sent(a, now, last)
        sent.append((a.first_index, last))
    assert sent == [(0, 1), (2, 3), (4, 5)]
    assert len(d.pending) == CFG.max_pending
    assert act(d, log, 20) is None  # full: wait for an answer
    d.on_response("APPEND", RC.SUCCESS, 21, index=1, first_index=0)
    assert act(d, log, 22) == Append(6, 4)


def test_append_max_count_covers_up_to_the_leaders_end() -> None:
    log = Log([1, 1, 1, 1, 1])
    d = to_append(log, 1)
    assert act(d, log, 0) == Append(2, 3)


def test_append_success_advances_match_and_clears_covered_pendings() -> None:
    log = Log([1] * 9)
    d = to_append(log, -1)
    for first, last in ((0, 2), (3, 5), (6, 8)):
        a = act(d, log, 0)
        assert a.first_index == first
        d.sent(a, 0, last)
    # one answer covers the first two pushes (the follower's end is 5)
    assert d.on_response("APPEND", RC.SUCCESS, 1, index=5, end_index=5, first_index=0) is True
    assert d.match_index == 5
    assert list(d.pending) == [6]
    assert d.on_response("APPEND", RC.SUCCESS, 2, index=5, end_index=5, first_index=3) is False


def test_repeated_push_keeps_waiting_for_the_original() -> None:
    # DLedger's handlePush: a duplicate first index is answered REPEATED_PUSH; the first one is still
    # queued at the follower, so keep its pending entry (and its send time).
    log = Log([1] * 6)
    d = to_append(log, -1)
    a = act(d, log, 0)
    d.sent(a, 0, 2)
    b = act(d, log, 5)
    d.sent(b, 5, 5)
    assert d.on_response("APPEND", RC.REPEATED_PUSH, 10, first_index=0) is False
    assert d.state == PushState.APPEND
    assert list(d.pending) == [0, 3]
    assert d.pending[0] == (0, 2)  # not re-timed: it still times out at 0 + timeout
    assert act(d, log, 11) is None


def test_push_timeout_resends_from_match_plus_one() -> None:
    # DLedger's doCheckAppendResponse: unanswered for maxPushTimeOutMs → writeIndex =
    # watermark + 1, resend.
    log = Log([1] * 6)
    d = to_append(log, 1)
    a = act(d, log, 0)
    d.sent(a, 0, 5)
    assert act(d, log, CFG.max_push_timeout_ms - 1) is None
    assert act(d, log, CFG.max_push_timeout_ms) == Append(2, 4)
    assert not d.pending  # the old push is forgotten; the resend is recorded by sent()


@pytest.mark.parametrize("code", [RC.INCONSISTENT_STATE, RC.INCONSISTENT_TERM, RC.NOT_FOLLOWER,
                                  RC.PUSH_REQUEST_IS_FULL, RC.INCONSISTENT_LEADER])
def test_non_success_append_goes_back_to_compare(code: RC) -> None:
    # on INCONSISTENT_STATE go COMPARE (the others also restart, after a backoff).
    log = Log([1] * 6)
    d = to_append(log, 1)
    a = act(d, log, 0)
    d.sent(a, 0, 5)
    assert d.on_response("APPEND", code, 10, first_index=2) is False
    assert d.state == PushState.COMPARE
    assert not d.pending
    assert d.match_index == 1  # a refusal never moves the watermark
    delay = 0 if code == RC.INCONSISTENT_STATE else CFG.retry_backoff_ms
    if delay:
        assert act(d, log, 10 + delay - 1) is None
    assert isinstance(act(d, log, 10 + delay), Compare)


def test_idle_commit_is_sent_eagerly_after_a_commit_advance() -> None:
    log = Log([1, 1, 1])
    d = to_append(log, 2)
    a = act(d, log, 0, committed=-1)
    assert a == Commit(-1)  # first idle commit: last_commit_ms starts far in the past
    d.sent(a, 0)
    assert act(d, log, 1, committed=-1) is None
    # the commit index moves: tell the follower within commit_eager_ms, not 1 s later
    assert act(d, log, CFG.commit_eager_ms - 1, committed=2) is None
    assert act(d, log, CFG.commit_eager_ms, committed=2) == Commit(2)


def test_idle_commit_is_repeated_once_per_commit_interval() -> None:
    log = Log([1, 1, 1])
    d = to_append(log, 2)
    d.sent(Commit(2), 0)
    assert act(d, log, CFG.commit_interval_ms - 1, committed=2) is None
    assert act(d, log, CFG.commit_interval_ms, committed=2) == Commit(2)


def test_no_commit_while_pushes_are_pending() -> None:
    # commits ride on the APPEND pushes (each carries committedIndex).
    log = Log([1, 1, 1])
    d = to_append(log, 0)
    a = act(d, log, 0, committed=0)
    d.sent(a, 0, 2)
    assert act(d, log, 500, committed=0) is None


def test_append_below_ledger_begin_needs_a_snapshot() -> None:
    log = Log([1, 1, 1], begin=5)
    d = leader(log)
    d.state = PushState.APPEND
    d.write_index = 3
    assert act(d, log, 0) == NeedSnapshot(3)


# ------------------------------------------------------------------------------------------
# step down, stale responses, deadlines
# ------------------------------------------------------------------------------------------
def test_step_down_goes_idle_and_sends_nothing() -> None:
    log = Log([1] * 4)
    d = to_append(log, 0)
    d.sent(act(d, log, 0), 0, 3)
    d.step_down()
    assert d.state == PushState.IDLE
    assert not d.pending
    assert act(d, log, 5_000, committed=3) is None
    assert d.on_response("APPEND", RC.SUCCESS, 5_001, index=3, first_index=1) is False
    assert d.match_index == 0


@pytest.mark.parametrize(("state_kind", "stale_kind"), [
    ("COMPARE", "TRUNCATE"), ("COMPARE", "APPEND"),
    ("TRUNCATE", "COMPARE"), ("TRUNCATE", "APPEND"),
    ("APPEND", "COMPARE"), ("APPEND", "TRUNCATE"), ("APPEND", "COMMIT"),
])
def test_stale_responses_of_another_kind_are_ignored(state_kind: str, stale_kind: str) -> None:
    # a response that belongs to an earlier state (a late answer) must not drive this one.
    log = Log([1, 1, 2, 2])
    d = leader(log)
    if state_kind == "COMPARE":
        act(d, log, 0)
    elif state_kind == "TRUNCATE":
        d.write_index = 2
        act(d, log, 0)
        d.on_response("COMPARE", RC.SUCCESS, 1, first_index=1)
        act(d, log, 2)
    else:
        d = to_append(log, 1)
        d.sent(act(d, log, 0), 0, 3)
    before = (d.state, d.write_index, d.match_index, dict(d.pending), d.inflight_request)
    for code in (RC.SUCCESS, RC.INCONSISTENT_STATE):
        assert d.on_response(stale_kind, code, 3, index=3, end_index=3, x_term=1, x_index=0,
                             first_index=2) is False
    assert (d.state, d.write_index, d.match_index, dict(d.pending), d.inflight_request) == before


@pytest.mark.parametrize("setup", ["idle", "compare-inflight", "backoff", "append-pending", "append-idle"])
def test_next_deadline_is_never_in_the_past(setup: str) -> None:
    log = Log([1, 1, 1])
    d = leader(log)
    now = 10_000
    if setup == "idle":
        d = DispatcherCore(CFG)
    elif setup == "compare-inflight":
        act(d, log, now - 5_000)  # long overdue
    elif setup == "backoff":
        act(d, log, now)
        d.on_response("COMPARE", RC.INCONSISTENT_TERM, now, first_index=2)
    elif setup == "append-pending":
        d = to_append(log, 0, now=now - 5_000)
        d.sent(act(d, log, now - 5_000), now - 5_000, 2)
    else:
        d = to_append(log, 2, now=now - 5_000)
    assert d.next_deadline(now, committed=2) >= now


def test_backoff_deadline_is_the_retry_time() -> None:
    log = Log([1, 1])
    d = leader(log)
    act(d, log, 0)
    d.on_response("COMPARE", RC.INCONSISTENT_TERM, 100, first_index=1)
    assert d.next_deadline(100) == 100 + CFG.retry_backoff_ms


def test_push_timeout_deadline_is_the_oldest_push_plus_timeout() -> None:
    log = Log([1] * 4)
    d = to_append(log, 0)
    d.sent(Commit(0), 40)
    d.sent(act(d, log, 40), 40, 3)
    assert d.next_deadline(50, committed=0) == 40 + CFG.max_push_timeout_ms


# ------------------------------------------------------------------------------------------
# BUGS found while writing these tests (see the report; the tests state the intended
# behaviour and fail until node/core/replication.py is fixed)
# ------------------------------------------------------------------------------------------
def test_idle_dispatcher_sleeps_until_the_next_idle_commit() -> None:
    # Once the follower knows everything, nothing is due before the next idle COMMIT: the
    # dispatcher process must not wake up (it polls until next_deadline). docs/design.md: an idle
    # 3-node cluster uses only a few percent of one core. (Was a 1 ms busy loop: the eager
    # COMMIT deadline counted even with no commit advance to announce.)
    log = Log([1, 1, 1])
    d = to_append(log, 2)
    d.sent(Commit(2), 0)
    for now in (100, 500, 999):
        assert act(d, log, now, committed=2) is None
        assert d.next_deadline(now, committed=2) == CFG.commit_interval_ms
    assert act(d, log, CFG.commit_interval_ms, committed=2) == Commit(2)


def test_eager_commit_deadline_after_a_commit_advance() -> None:
    log = Log([1, 1, 1])
    d = to_append(log, 2)
    d.sent(Commit(1), 100)
    assert d.next_deadline(105, committed=2) == 100 + CFG.commit_eager_ms


def test_bug_late_compare_answer_about_another_index_is_ignored() -> None:
    """BUG (needs reordering: chaos mode of tests/scenarios/test_replication_sim.py): a COMPARE
    answer is applied to the *current* write_index, whatever index it answered. An answer
    to an old COMPARE (its request timed out; the dispatcher moved on) that arrives during a
    later COMPARE round sets match_index = write_index - 1 for an entry the follower never
    confirmed: the watermark claims entries the follower lacks, and the quorum count with it.
    (An old INCONSISTENT_STATE answer with x_term likewise feeds the fast backup the wrong
    compared index — seen as a TRUNCATE below the follower's committed index, refused forever.)
    Over one TCP connection the answers come back in order, which hides it.
    Fix: on_response("COMPARE") ignores an answer whose first_index (the dispatcher passes the
    request's pre index) != write_index - 1; likewise "TRUNCATE" whose first_index !=
    match_index + 1."""
    log = Log([1] * 10)
    d = leader(log)
    assert act(d, log, 0) == Compare(9, 1)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=2, first_index=9)
    old = act(d, log, 2)
    assert old == Compare(2, 1)  # this request's answer will be late
    assert act(d, log, 2 + CFG.request_timeout_ms) == Compare(2, 1)  # asked again: answered
    d.on_response("COMPARE", RC.SUCCESS, 3 + CFG.request_timeout_ms, first_index=2)
    d.sent(act(d, log, 1_400), 1_400)  # TRUNCATE(3)
    d.on_response("TRUNCATE", RC.SUCCESS, 1_401, first_index=3)
    d.sent(act(d, log, 1_402), 1_402, 9)  # APPEND 3..9
    d.on_response("APPEND", RC.INCONSISTENT_STATE, 1_403, first_index=3)  # e.g. a gap check
    assert act(d, log, 1_404) == Compare(9, 1)
    # now the first Compare(2, 1)'s answer arrives: it says nothing about entry 9
    d.on_response("COMPARE", RC.SUCCESS, 1_405, first_index=2)
    assert d.match_index != 9, "watermark 9 from an answer about entry 2"


def test_bug_dispatcher_spins_while_pushes_stay_unanswered() -> None:
    """BUG (busy loop, introduced with the eager-COMMIT deadline fix): in APPEND,
    next_deadline always includes last_commit_ms + commit_interval_ms, but an idle COMMIT is
    only sent when nothing is pending. While pushes stay unanswered (the follower is down or
    partitioned: they time out and are resent, so `pending` never empties) that deadline is
    in the past from one commit interval after the last COMMIT on (or from the start, if no
    COMMIT was sent yet: last_commit_ms = -10**12): next_deadline returns `now`, and
    dispatcher.py polls every 1 ms for the whole outage.
    Intended: whenever next_action(now) is None, next_deadline(now) > now. Fix: add
    last_commit_ms + commit_interval_ms (and the eager one) only when `not self.pending`."""
    log = Log([1] * 4)
    d = to_append(log, 0)
    d.sent(Commit(0), 0)
    d.sent(act(d, log, 10), 10, 3)  # the follower dies now
    for now in range(100, 5_000, 100):
        a = act(d, log, now, committed=0)
        if a is not None:
            assert isinstance(a, Append)  # the resend after a push timeout
            d.sent(a, now, 3)
            continue
        assert d.next_deadline(now, committed=0) > now, f"at {now}: the dispatcher would spin"


def test_bug_stale_append_success_must_not_cancel_the_resend() -> None:
    """BUG (follower left behind while the group is idle): pending pushes are keyed by first
    index only. Push A = [5..7] times out and is resent as B = [5..9] (the log grew). A's late
    SUCCESS (follower end 7) pops B's pending entry, although B is not acknowledged. If B is
    lost, nothing is pending, write_index is 10 > end: no resend ever happens (only idle
    COMMITs, whose answers the core ignores) until a client writes again.
    Intended: a SUCCESS removes only the pushes it covers (last <= index); B stays pending and
    times out into a resend from match + 1."""
    log = Log([1] * 8)
    d = to_append(log, 4)
    a = act(d, log, 0)
    assert a == Append(5, 3)
    d.sent(a, 0, 7)
    log = Log([1] * 10)  # two more client entries
    t = CFG.max_push_timeout_ms
    b = act(d, log, t)
    assert b == Append(5, 5)
    d.sent(b, t, 9)
    d.on_response("APPEND", RC.SUCCESS, t + 1, index=7, end_index=7, first_index=5)  # A's answer
    assert d.match_index == 7
    assert 5 in d.pending, "B (5..9) was never acknowledged"
    # B is lost: after the push timeout the dispatcher must resend from the watermark
    assert act(d, log, 2 * t + 1, committed=7) == Append(8, 2)


def test_a_follower_that_lost_acknowledged_entries_is_compared_again_from_its_end() -> None:
    """An idle leader only sends COMMIT; a follower whose log was cut (repair from peers) or
    wiped answers it INCONSISTENT_STATE with its end, and the dispatcher compares again from
    there (before, the answer was ignored and the follower never got its entries back)."""
    log = Log([1] * 10)
    d = to_append(log, 9)
    assert act(d, log, 100, committed=9) == Commit(9)
    d.sent(Commit(9), 100)
    d.on_response("COMMIT", RC.INCONSISTENT_STATE, 100, end_index=4, first_index=9)
    assert d.state == PushState.COMPARE
    assert act(d, log, 100, committed=9) == Compare(4, 1)
    d2 = to_append(Log([1] * 10, begin=5), 9)  # the leader's retention is past the follower's end
    d2.on_response("COMMIT", RC.INCONSISTENT_STATE, 100, end_index=-1, first_index=9)
    assert isinstance(act(d2, Log([1] * 10, begin=5), 100, committed=9), NeedSnapshot)
