"""Reads of the KV store on real processes (docs/statemachine.md "Reads"): puts answered at commit
and read back at once, follower reads through a read index from the leader, pipelined gets, and
lease reads (`--read-lease true`). Correctness only: no test here asserts on speed."""

import os
import signal

import pytest
from cluster import wait_for

from ipc.client import DLedgerClient, DLedgerError, KVClient
from ipc.codes import ResponseCode as RC


def kv_client(c, **kw) -> KVClient:
    return KVClient(c.peers, group=c.group, timeout=kw.pop("timeout", 10.0), **kw)


def followers(c, leader: str) -> list[str]:
    return [n for n in c.nodes if n != leader]


def test_every_acknowledged_put_is_seen_by_the_next_get_on_the_leader_and_on_each_follower(make_cluster):
    """A put is answered at commit, before any state machine applied it; a get right after it
    — from the leader or from a follower that asks the leader for a read index — must still
    see it, at its revision (its index)."""
    c = make_cluster(3, state_machine="kv")
    lead = c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        for i in range(40):
            key, value = b"k%02d" % (i % 7), b"v%d" % i
            rev = kv.put(key, value)
            where = [None, *followers(c, lead)][i % 3]
            got = kv.get(key, read_from=where)
            assert (got.value, got.revision) == (value, rev), f"read from {where or 'the leader'}"
        assert kv.cas(b"k00", b"v35", b"swapped") is True  # cas still waits for its result
        assert kv.get(b"k00", read_from=followers(c, lead)[0]).value == b"swapped"


def test_pipelined_gets_on_one_client_match_the_puts(make_cluster):
    c = make_cluster(3, state_machine="kv")
    c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        revs = {b"p%03d" % i: kv.put(b"p%03d" % i, b"x%d" % i) for i in range(100)}
        futs = {k: kv.get_async(k) for k in revs}
        for k, f in futs.items():
            got = f.result(15)
            assert (got.value, got.revision) == (b"x%d" % int(k[1:]), revs[k])
        absent = kv.get_async(b"never")
        assert absent.result(15) is None


def test_lease_reads_see_every_acknowledged_write(make_cluster):
    c = make_cluster(3, state_machine="kv", read_lease="true")
    lead = c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        rev0 = kv.put(b"lease", b"start")
        for node in [None, *followers(c, lead)]:  # appliers start last (staged start): until then
            wait_for(lambda n=node: kv.get(b"lease", read_from=n).revision >= rev0, 30,  # LEADER_PENDING_FULL
                     "every node's applier to take reads")
        for i in range(30):
            rev = kv.put(b"lease", b"%d" % i)
            got = kv.get(b"lease", read_from=[None, *followers(c, lead)][i % 3])
            assert (got.value, got.revision) == (b"%d" % i, rev)
    with DLedgerClient(c.peers, group=c.group, timeout=10.0) as cl:
        r = cl.append(b"\x7fnot a kv command")
        assert cl.get(r.index, linearizable=True).index == r.index


def test_a_follower_read_waits_for_its_own_state_machine_to_catch_up(make_cluster):
    """A follower whose applier is stopped (SIGSTOP) has not applied the newest put: it must
    not answer from its stale state (the read times out), and once the applier runs again
    the same read is answered with the newest value."""
    c = make_cluster(3, state_machine="kv")
    lead = c.wait_leader(timeout=15)
    f = followers(c, lead)[0]
    applier = c.nodes[f].role_pids()["applier"]
    with kv_client(c) as kv:
        kv.put(b"slow", b"before")
        wait_for(lambda: kv.get(b"slow", read_from=f).value == b"before", 15, "the follower has it")
        os.kill(applier, signal.SIGSTOP)
        try:
            rev = kv.put(b"slow", b"after")
            with pytest.raises(DLedgerError) as ei:
                kv.get(b"slow", timeout=1.0, read_from=f)  # never b"before"
            assert ei.value.code == RC.TIMEOUT
        finally:
            os.kill(applier, signal.SIGCONT)
        got = kv.get(b"slow", read_from=f)
        assert (got.value, got.revision) == (b"after", rev)
