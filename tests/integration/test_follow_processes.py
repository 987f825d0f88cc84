"""Following the log on real processes (docs/client.md "Following the log"): FETCH from any
member, long polls that end at commit, a follow that sees every committed entry exactly once
through a leader SIGKILL and a follower restart, the start-below-begin error, and the idle cost.
Correctness only, except the idle test, which bounds CPU by a count of seconds, not a rate."""

import threading
import time

import pytest
from cluster import process_cpu_seconds, wait_for

from ipc import protocol as P
from ipc.client import ClientClosedError, DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC


def client(c, **kw) -> DLedgerClient:
    return DLedgerClient(c.peers, group=c.group, timeout=kw.pop("timeout", 10.0), **kw)


def test_every_member_answers_a_fetch_and_only_with_committed_entries(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    with client(c) as dc:
        rs = dc.append_batch([b"e%d" % i for i in range(20)])
        last = rs[-1].index
        for node in c.nodes:
            def caught_up(n=node):
                got = dc.fetch(0, read_from=n, max_entries=100)
                return got if got.entries and got.entries[-1].index >= last else None
            got = wait_for(caught_up, 20, f"{node} to have committed index {last}")
            assert got.node == node
            assert [e.index for e in got.entries] == list(range(len(got.entries)))
            assert got.committed_index >= last
            bodies = [e.body for e in got.entries if e.type == "NORMAL"]
            assert bodies[:20] == [b"e%d" % i for i in range(20)]
        # Past the committed end with no wait: an empty answer, at once.
        got = dc.fetch(last + 1, read_from=next(iter(c.nodes)))
        assert got.entries == [] and got.committed_index == last


def test_a_held_fetch_is_answered_when_its_entry_commits(make_cluster):
    """The long poll: a FETCH past the end is held by the member, and answered by the commit of
    the entry it asks for, long before its wait ends."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    follower = next(n for n in c.nodes if n != lead)
    with client(c) as dc:
        end = dc.append(b"first").index
        wait_for(lambda: dc.fetch(end, read_from=follower).entries, 20, "the follower to commit")
        got: list = []
        t = threading.Thread(target=lambda: got.append(dc.fetch(end + 1, read_from=follower, wait_ms=30_000)))
        t0 = time.monotonic()
        t.start()
        time.sleep(0.3)  # let the FETCH reach the member and be held there
        assert not got, "answered before anything was appended"
        r = dc.append(b"second")
        t.join(25)
        assert got and [e.body for e in got[0].entries] == [b"second"]
        assert got[0].entries[0].index == r.index
        assert time.monotonic() - t0 < 25, "held for its whole wait instead of until the commit"


def test_bad_fetch_arguments_are_refused_clearly(make_cluster):
    c = make_cluster(1)
    c.wait_leader(timeout=15)
    n0 = next(iter(c.nodes))
    resp = c.request(n0, P.FetchRequest(c.group, n0, -1, 10, 1000, 0), timeout=5)
    assert isinstance(resp, P.ErrorResponse) and resp.code == RC.UNEXPECTED_ARGUMENT
    resp = c.request(n0, P.FetchRequest(c.group, n0, 0, 0, 1000, 0), timeout=5)
    assert isinstance(resp, P.ErrorResponse) and resp.code == RC.UNEXPECTED_ARGUMENT
    with client(c) as dc:
        with pytest.raises(DLedgerError) as e:
            dc.fetch(-3)
        assert e.value.code == RC.UNEXPECTED_ARGUMENT
        with pytest.raises(DLedgerError) as e:
            dc.follow("newest")
        assert e.value.code == RC.UNEXPECTED_ARGUMENT


def test_follow_sees_every_committed_entry_once_through_a_leader_kill_and_a_follower_restart(make_cluster):
    """A reader follows a log that grows while the leader is SIGKILLed and a follower restarts:
    it receives every committed entry exactly once, in index order. Bounded by counts: the
    writer appends a fixed number of entries, the reader reads up to the last one committed."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    c.wait_converged()
    seen: list = []
    errors: list[BaseException] = []
    rc = client(c)  # closed below: that ends the reader's follow, wherever it waits

    def reader() -> None:
        try:
            for e in rc.follow(0, wait_ms=500):
                seen.append(e)
        except ClientClosedError:
            return
        except BaseException as ex:  # noqa: BLE001 - reported by the test
            errors.append(ex)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    acked: dict[int, bytes] = {}
    with client(c, timeout=30.0) as wc:
        def write(k: int) -> None:
            for i in range(k, k + 50):
                r = wc.append(b"w%04d" % i)
                acked[r.index] = b"w%04d" % i
        write(0)
        c.nodes[lead].kill()
        write(50)
        new_lead = c.wait_leader(timeout=30, among=[n for n in c.nodes if n != lead])
        c.nodes[lead].start()
        other = next(n for n in c.nodes if n not in (lead, new_lead))
        c.nodes[other].stop()
        write(100)
        c.nodes[other].start()
        write(150)
        last = max(acked)
    try:
        wait_for(lambda: errors or (seen and seen[-1].index >= last), 60, f"the reader to reach index {last}")
    finally:
        rc.close()
        t.join(30)
    assert not t.is_alive(), "the follow did not end when its client closed"
    assert not errors, errors
    idx = [e.index for e in seen]
    assert idx == list(range(idx[0], idx[0] + len(idx))), "a gap or a repeat"
    assert idx[0] == 0
    bodies = {e.index: e.body for e in seen}
    for i, b in acked.items():
        assert bodies[i] == b, f"entry {i}"
    assert sum(1 for e in seen if e.type == "NORMAL") >= len(acked)


def test_follow_below_the_log_begin_is_the_documented_error(make_cluster):
    """Retention moved every member's begin past index 0: a follow from 0 raises
    INDEX_LESS_THAN_LOCAL_BEGIN, and 'earliest' starts at the begin."""
    c = make_cluster(3, file_reserved_hours=0, disk_space_ratio_to_clean=0.0001,
                     data_file_size=1 << 20, max_body_size=64 << 10)
    c.wait_leader(timeout=15)
    with client(c, timeout=30.0) as dc:
        for _ in range(30):
            dc.append_batch([bytes(1000)] * 100)  # ~3 MB: 3 data files of 1 MiB
        wait_for(lambda: all(n.alive and n.ledger_begin_index > 0 for n in dc.metadata().nodes), 30,
                 "retention to move every member's begin")
        with pytest.raises(DLedgerError) as e:
            next(iter(dc.follow(0)))
        assert e.value.code == RC.INDEX_LESS_THAN_LOCAL_BEGIN
        first = next(iter(dc.follow("earliest")))
        assert first.index == max(0, min(n.ledger_begin_index for n in dc.metadata().nodes))


def test_an_idle_follow_costs_the_member_no_cpu_beyond_its_wait(make_cluster):
    """Ten readers wait on a follower of an idle group for 40 wait periods: the member's handler
    spends well under a second of CPU on them (each answer is one empty reply per wait)."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    follower = next(n for n in c.nodes if n != lead)
    handler = c.nodes[follower].role_pids()["handler"]
    with client(c) as dc:
        end = dc.append(b"x").index
        wait_for(lambda: dc.fetch(end, read_from=follower).entries, 20, "the follower to commit")
        before = process_cpu_seconds(handler)
        stop = threading.Event()

        def idle_reader() -> None:
            with client(c) as rc:
                for _ in range(4):
                    if stop.is_set():
                        return
                    rc.fetch(end + 1, read_from=follower, wait_ms=100)

        ts = [threading.Thread(target=idle_reader) for _ in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        stop.set()
        spent = process_cpu_seconds(handler) - before
    assert spent < 1.0, f"the handler spent {spent:.2f} s of CPU on 40 idle long polls"
