"""The chaos history check (tools/chaos/history.py) on crafted histories: a clean one passes,
and each kind of violation it promises to find is found."""

from tools.chaos.faults import KINDS, Schedule
from tools.chaos.history import Append, History, LogEntry, ReadEntry, Replica, check
from tools.chaos.workload import body_of


def _clean():
    """Two writers, five acknowledged appends, a NOOP; three identical replicas."""
    h = History()
    log = [LogEntry(0, 1, "NOOP", b"")]
    for i, (w, s) in enumerate([("w0", 0), ("w1", 0), ("w0", 1), ("w1", 1), ("w0", 2)], start=1):
        b = body_of(w, s, 32)
        h.invoked(Append(w, s, b, t_invoke=i, t_done=i + 0.5, index=i, term=1))
        log.append(LogEntry(i, 1, "NORMAL", b))
    h.claim(1, "n0")
    h.read([ReadEntry(3.0, 2, 1, "NORMAL", log[2].body)])
    reps = {n: Replica(n, 5, list(log)) for n in ("n0", "n1", "n2")}
    return h, reps, log


def _kinds(verdict):
    return sorted({line.split(":")[0] for line in verdict.violations})


def test_a_clean_history_passes_with_its_counts():
    h, reps, _ = _clean()
    v = check(h, reps)
    assert v.ok, v.violations
    assert v.stats["acknowledged"] == 5 and v.stats["committed_end"] == 5 and v.stats["reads"] == 1


def test_a_lost_acknowledged_append_is_found():
    h, reps, log = _clean()
    for r in reps.values():
        r.entries = r.entries[:4]  # index 4 and 5 gone on every replica
        r.committed_index = 3
    assert _kinds(check(h, reps)) == ["lost"]


def test_an_acknowledged_append_at_another_index_is_lost():
    h, reps, _ = _clean()
    h.appends[0].index = 2  # acknowledged at 2, but 2 holds another body
    assert "lost" in _kinds(check(h, reps))


def test_a_body_committed_twice_is_a_duplicate():
    h, reps, log = _clean()
    for r in reps.values():
        r.entries.append(LogEntry(6, 1, "NORMAL", log[1].body))
        r.committed_index = 6
    assert _kinds(check(h, reps)) == ["duplicate"]


def test_divergent_committed_prefixes_are_found_but_an_uncommitted_tail_is_not():
    h, reps, _ = _clean()
    reps["n2"].entries[3] = LogEntry(3, 2, "NORMAL", b"other")
    assert "divergence" in _kinds(check(h, reps))
    h, reps, _ = _clean()
    reps["n2"].entries.append(LogEntry(6, 2, "NORMAL", b"uncommitted"))  # beyond its committed 5
    assert check(h, reps).ok


def test_a_definite_failure_that_was_committed_is_found_an_indeterminate_one_is_not():
    h, reps, log = _clean()
    op = h.appends[4]
    op.index = op.term = None
    op.error, op.indeterminate = "TIMEOUT", True
    assert check(h, reps).ok
    op.error, op.indeterminate = "DISK_FULL", False
    assert _kinds(check(h, reps)) == ["failed-but-committed"]


def test_order_and_unwritten_bodies_and_two_leaders_and_bad_reads():
    h, reps, log = _clean()
    # w0#2 committed before w0#1: swap their entries (and their acknowledgements) everywhere.
    for r in reps.values():
        e3, e5 = r.entries[3], r.entries[5]
        r.entries[3], r.entries[5] = LogEntry(3, 1, "NORMAL", e5.body), LogEntry(5, 1, "NORMAL", e3.body)
    h.appends[2].index, h.appends[4].index = 5, 3
    assert _kinds(check(h, reps)) == ["order"]  # the read of index 2 still matches
    h, reps, log = _clean()
    for r in reps.values():
        r.entries.append(LogEntry(6, 1, "NORMAL", b"nobody wrote this"))
        r.committed_index = 6
    h.claim(1, "n1")
    h.read([ReadEntry(4.0, 9, 1, "NORMAL", b"x")])
    assert _kinds(check(h, reps, {2: {"n0", "n2"}})) == ["read", "two-leaders", "unwritten"]


def test_a_corrupt_body_in_a_committed_prefix_is_found():
    h, reps, log = _clean()
    e = reps["n1"].entries[2]
    reps["n1"].entries[2] = LogEntry(e.index, e.term, e.type, e.body, crc_ok=False)
    assert _kinds(check(h, reps)) == ["corrupt"]


def test_the_schedule_is_a_function_of_the_seed():
    a = [Schedule(7, list(KINDS)).next() for _ in range(1)]
    s1, s2 = Schedule(7, list(KINDS)), Schedule(7, list(KINDS))
    first, second = [s1.next() for _ in range(50)], [s2.next() for _ in range(50)]
    assert first == second and first[0] == a[0]
    assert {f.kind for f in first} == set(KINDS)
    assert all(f.duration == 0 for f in first if f.kind == "role-kill")
    assert [f.kind for f in first] != [f.kind for f in (Schedule(8, list(KINDS)).next() for _ in range(50))]


def test_entries_every_replica_deleted_are_counted_not_lost_and_others_are_still_compared():
    """--compact: each replica holds a different suffix. What one still holds is compared; what
    all deleted is counted as compacted_unchecked; a gap above that is still a loss."""
    h, reps, log = _clean()
    reps["n0"].entries = log[3:]  # n0 deleted 0..2
    reps["n1"].entries = log[2:]  # n1 still holds 2
    reps["n2"].entries = log[4:]
    v = check(h, reps)
    assert v.ok, v.violations
    assert v.stats["compacted_below"] == 2
    assert v.stats["compacted_unchecked"] == 1  # the append acknowledged at 1 (the read at 2 is held)
    reps["n1"].entries = log[3:]  # now 2 is gone everywhere: the read at 2 is unchecked too
    assert check(h, reps).stats["compacted_unchecked"] == 3
    for r in reps.values():
        r.entries = [e for e in r.entries if e.index != 4]  # a hole above what was compacted
    assert "lost" in _kinds(check(h, reps))
