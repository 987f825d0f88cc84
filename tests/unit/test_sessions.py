"""The leader's session table (node/core/sessions.py): what a retried append is answered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.sessions import (
    NO_SESSION,
    SEQ_MASK,
    SessionTable,
    Verdict,
    seq_add,
    seq_after,
    session_id,
)


def test_serial_arithmetic_orders_across_the_wrap():
    assert seq_after(SEQ_MASK, 0) == 1
    assert seq_after(0, SEQ_MASK) == -1
    assert seq_after(5, 5) == 0
    assert seq_add(SEQ_MASK, 2) == 1


def test_session_ids_carry_the_term_and_a_counter():
    assert session_id(3, 1) == (3 << 16) | 1
    assert session_id(0x1_0003, 7) == session_id(3, 7)  # the term modulo 2**16
    with pytest.raises(ValueError):
        session_id(1, 0)
    with pytest.raises(ValueError):
        session_id(1, 0x1_0000)


def test_a_session_this_table_opened_starts_at_seq_1_and_an_unknown_one_is_expired():
    t = SessionTable()
    t.open(9)
    assert t.decide(9, 1).verdict is Verdict.APPEND
    assert t.decide(9, 2).verdict is Verdict.GAP  # nothing of it written: seq 1 is missing
    assert t.decide(9, 0).verdict is Verdict.OVERLAP  # no seq 0: a malformed stamp
    assert t.decide(10, 2).verdict is Verdict.EXPIRED  # not opened here
    assert t.decide(NO_SESSION, 77).verdict is Verdict.APPEND  # no session: never deduplicated
    assert t.decide(8, 1).verdict is Verdict.EXPIRED  # not opened here: its seq 1 may be in the log


def test_an_evicted_session_is_expired_at_seq_1_never_started_again():
    """The start invariant: once an entry of a session was recorded, losing the session from
    the table (eviction) must not make its seq 1 look new (it would be written twice)."""
    t = SessionTable(max_sessions=2)
    for sid in (1, 2, 3):
        t.open(sid)
        assert t.decide(sid, 1).verdict is Verdict.APPEND
        t.record(sid, 1, 10 * sid)
    assert 1 not in t  # the least recently appending was evicted
    assert t.decide(1, 1).verdict is Verdict.EXPIRED
    assert t.decide(3, 1).verdict is Verdict.DUPLICATE


def test_a_rebuild_forgets_the_sessions_opened_before_it():
    """A rebuilt table belongs to a new owner (a restarted handler, a new term), which handed
    out none of the ids opened before: their seq 1 may be in the log beyond the scan."""
    t = SessionTable()
    t.open(7)
    t.rebuild([(0, 5, 1)])
    assert t.decide(7, 1).verdict is Verdict.EXPIRED
    assert t.decide(5, 1).verdict is Verdict.DUPLICATE


def test_opened_but_unwritten_ids_are_bounded_and_the_oldest_expire():
    t = SessionTable(max_sessions=3)
    for sid in range(1, 6):
        t.open(sid)
    assert [t.decide(sid, 1).verdict for sid in range(1, 6)] == [Verdict.EXPIRED] * 2 + [Verdict.APPEND] * 3


def test_a_retried_single_append_is_answered_with_its_index():
    t = SessionTable()
    t.record(9, 1, 100)
    t.record(9, 2, 105)
    d = t.decide(9, 1)
    assert (d.verdict, d.index) == (Verdict.DUPLICATE, 100)
    assert t.decide(9, 2).index == 105
    assert t.decide(9, 3).verdict is Verdict.APPEND


def test_a_retried_batch_is_answered_with_its_first_index_and_a_straddling_one_is_refused():
    t = SessionTable()
    t.record(9, 1, 10, count=5)  # seqs 1..5 at 10..14
    t.record(9, 6, 20, count=3)  # seqs 6..8 at 20..22
    assert (t.decide(9, 1, 5).verdict, t.decide(9, 1, 5).index) == (Verdict.DUPLICATE, 10)
    assert t.decide(9, 6, 3).index == 20
    assert t.decide(9, 4, 4).verdict is Verdict.TOO_OLD  # spans two runs: not one request's
    d = t.decide(9, 7, 4)
    assert (d.verdict, d.last_seq) == (Verdict.OVERLAP, 8)


def test_a_gap_names_the_last_seq_the_leader_holds():
    t = SessionTable()
    t.record(9, 1, 10, count=3)
    d = t.decide(9, 6)
    assert (d.verdict, d.last_seq) == (Verdict.GAP, 3)


def test_runs_of_one_session_merge_and_the_window_keeps_the_newest_seqs():
    t = SessionTable(window=4)
    for k in range(10):
        t.record(9, 1 + k, 100 + 2 * k)  # interleaved with another session: no merging
    assert t.decide(9, 10).index == 118
    assert t.decide(9, 7).index == 112
    d = t.decide(9, 2)
    assert (d.verdict, d.last_seq) == (Verdict.TOO_OLD, 10)


def test_sessions_beyond_the_bound_are_evicted_least_recently_appended_first():
    t = SessionTable(max_sessions=2)
    t.record(1, 1, 10)
    t.record(2, 1, 11)
    t.record(1, 2, 12)  # session 1 appended last: 2 is now the oldest
    t.record(3, 1, 13)
    assert 2 not in t and 1 in t and 3 in t
    assert t.decide(2, 2).verdict is Verdict.EXPIRED


def test_sequences_wrap_around():
    t = SessionTable()
    t.record(9, SEQ_MASK - 1, 50, count=2)  # seqs 2**32-2, 2**32-1
    t.record(9, 0, 52, count=2)  # and on across the wrap: 0, 1 (merged into one run)
    assert t.last_seq(9) == 1
    assert t.decide(9, SEQ_MASK, 3).index == 51
    assert t.decide(9, 2).verdict is Verdict.APPEND


def test_rebuild_from_a_log_tail_matches_recording_as_the_leader_wrote():
    stamps = [(10, 9, 1), (11, 9, 2), (12, 0, 0), (13, 4, 1), (14, 9, 3), (15, 4, 2), (16, 4, 3)]
    led, rebuilt = SessionTable(), SessionTable()
    for index, session, seq in stamps:
        led.record(session, seq, index)
    rebuilt.record(77, 1, 1)  # forgotten by rebuild
    rebuilt.rebuild(stamps)
    assert 77 not in rebuilt
    for session, seq, count in [(9, 1, 1), (9, 3, 1), (4, 2, 2), (4, 1, 3), (9, 4, 1), (4, 9, 1)]:
        assert rebuilt.decide(session, seq, count) == led.decide(session, seq, count)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.booleans()), max_size=60),
       window=st.integers(1, 12))
def test_every_retry_is_recognised_or_refused_never_written_twice(ops, window):
    """Several clients append (batches of 1-4) and now and then retry one of their earlier
    requests. The oracle is the log itself: every (session, seq) -> index written so far.
    A retry is answered with the index of its first entry, or TOO_OLD once outside the
    window; a new request is APPENDed; nothing is ever written twice."""
    t = SessionTable(window=window)
    for session in (1, 2, 3):
        t.open(session)
    written: dict[tuple[int, int], int] = {}
    sent: dict[int, list[tuple[int, int]]] = {}  # session -> requests (first seq, count)
    next_seq = {1: 1, 2: 1, 3: 1}
    end = 0
    for session, count, retry in ops:
        if retry and sent.get(session):
            first, n = sent[session][(count * 7) % len(sent[session])]
        else:
            first, n = next_seq[session], count
        d = t.decide(session, first, n)
        if d.verdict is Verdict.APPEND:
            assert (session, first) not in written and first == next_seq[session]
            for k in range(n):
                written[(session, first + k)] = end + 1 + k
            t.record(session, first, end + 1, n)
            end += n
            next_seq[session] = first + n
            sent.setdefault(session, []).append((first, n))
        else:
            assert (session, first) in written  # only retries are not appended
            assert d.verdict in (Verdict.DUPLICATE, Verdict.TOO_OLD)
            if d.verdict is Verdict.DUPLICATE:
                assert d.index == written[(session, first)]
            else:
                assert next_seq[session] - 1 - first >= window - n  # only outside the window
