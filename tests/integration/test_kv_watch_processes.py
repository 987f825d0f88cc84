"""KV watch on real processes (docs/statemachine.md "Watch"): changes in revision order with
previous values, from now and from a past revision, through a leader SIGKILL; the compaction
error once retention removed the log's start; and `dledger kv watch`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from cluster import ROOT, interruptible, wait_after_signal, wait_for

from ipc.client import KVClient
from ipc.kv_watch import KVCompactedError


def kv_client(c, **kw) -> KVClient:
    return KVClient(c.peers, group=c.group, timeout=kw.pop("timeout", 15.0), **kw)


def collect(it, n: int, out: list, errors: list, until: bytes | None = None) -> threading.Thread:  # noqa: ANN001
    """Collect `n` events of `it` (or up to one on key `until`) in a thread."""
    def run() -> None:
        try:
            for ev in it:
                out.append(ev)
                if len(out) >= n or ev.key == until:
                    return
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_watch_a_prefix_from_now_and_from_a_past_revision_through_a_leader_kill(make_cluster):
    c = make_cluster(3, state_machine="kv")
    lead = c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        r0 = kv.put(b"app/x", b"0")
        kv.put(b"other", b"not watched")
        live: list = []
        errors: list = []
        it = kv.watch(b"app/", prefix=True, prev_kv=True)
        t = collect(it, 1000, live, errors, until=b"app/end")
        # The watch starts when its thread first iterates: probe until it reports a change, so
        # every change below is certainly after its start.
        wait_for(lambda: live or errors or (kv.put(b"app/probe", b"p") and False), 30, "the watch to start")
        live.clear()
        # 6 changes (the failed CAS and the absent delete are none), half after the kill.
        revs = [kv.put(b"app/x", b"1"), kv.put(b"app/y", b"1")]
        assert kv.cas(b"app/x", b"nope", b"2") is False
        assert kv.delete(b"app/absent") is False
        c.nodes[lead].kill()
        revs.append(kv.put(b"app/x", b"2"))
        assert kv.delete(b"app/y") is True
        revs.append(kv.put(b"app/z", b"1"))
        assert kv.cas(b"app/x", b"2", b"3") is True
        kv.put(b"app/end", b"")
        t.join(60)
        assert not errors, errors
        live = [e for e in live if e.key not in (b"app/probe", b"app/end")]
        got = [(e.type, e.key, e.value) for e in live]
        assert got == [("PUT", b"app/x", b"1"), ("PUT", b"app/y", b"1"), ("PUT", b"app/x", b"2"),
                       ("DELETE", b"app/y", None), ("PUT", b"app/z", b"1"), ("PUT", b"app/x", b"3")]
        assert [e.revision for e in live] == sorted({e.revision for e in live})
        x3 = live[-1]
        assert x3.prev_kv is not None and x3.prev_kv.value == b"2" and x3.kv.version == x3.prev_kv.version + 1
        assert live[-3].prev_kv.value == b"1" and live[-3].kv is None

        # From a past revision: the whole history of the prefix since r0, replayed from the log.
        past: list = []
        t = collect(kv.watch(b"app/", prefix=True, start_revision=r0), 1000, past, errors, until=b"app/end")
        t.join(60)
        assert not errors, errors
        past = [e for e in past if e.key != b"app/probe"]
        assert [(e.type, e.key, e.value) for e in past][:-1] == [
            ("PUT", b"app/x", b"0"), ("PUT", b"app/x", b"1"), ("PUT", b"app/y", b"1"),
            ("PUT", b"app/x", b"2"), ("DELETE", b"app/y", None), ("PUT", b"app/z", b"1"),
            ("PUT", b"app/x", b"3")]
        assert past[0].revision == r0 and past[1].revision == revs[0]
        # One key, not the prefix: app/x only.
        one: list = []
        t = collect(kv.watch(b"app/x", start_revision=r0), 4, one, errors)
        t.join(60)
        assert [e.value for e in one] == [b"0", b"1", b"2", b"3"]


def test_a_watch_from_a_revision_retention_removed_is_the_compaction_error(make_cluster):
    c = make_cluster(3, state_machine="kv", file_reserved_hours=0, disk_space_ratio_to_clean=0.0001,
                     data_file_size=1 << 20, max_body_size=64 << 10)
    c.wait_leader(timeout=15)
    with kv_client(c, timeout=30.0) as kv:
        first = kv.put(b"k", b"v0")
        for i in range(30):
            last = kv.client.append_batch([bytes(K_PUT(b"bulk%d" % i))] * 100)[-1].index
        # A snapshot covers what its node applied, up to what it knows committed: a follower
        # learns the commit with the leader's next push, so wait for that first.
        c.wait_converged(timeout=30)
        for node in c.nodes:
            assert kv.client.take_snapshot(node)[0] >= last, node
        kv.put(b"k", b"v1")
        wait_for(lambda: all(n.alive and n.ledger_begin_index > 0 for n in kv.client.metadata().nodes), 60,
                 "retention to remove the log's start on every member")
        with pytest.raises(KVCompactedError):
            next(iter(kv.watch(b"k", start_revision=first)))
        # From now still works.
        got: list = []
        errors: list = []
        t = collect(kv.watch(b"k"), 1, got, errors)
        wait_for(lambda: got or errors or (kv.put(b"k", b"later") and False), 30, "a change seen from now")
        t.join(30)
        assert not errors and got[0].key == b"k"


def K_PUT(key: bytes) -> bytes:  # noqa: N802 - a KV command body, ~1 KB
    from ipc import kv_format as K
    return K.encode_put(key, bytes(1000))


def test_dledger_kv_watch_prints_changes_and_stops_on_ctrl_c(make_cluster):
    c = make_cluster(3, state_machine="kv")
    c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        r = kv.put(b"cfg/a", b"1")
        proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "kv", "watch", "--peers", c.peers, "cfg/",
                                 "--prefix", "--from-revision", str(r), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT),
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=interruptible)
        try:
            kv.delete(b"cfg/a")
            import json
            rows = [json.loads(proc.stdout.readline()) for _ in range(2)]
            assert [(x["type"], x["key"], x["revision"]) for x in rows][0] == ("PUT", "cfg/a", r)
            assert rows[1]["type"] == "DELETE" and rows[1]["key"] == "cfg/a"
            proc.send_signal(signal.SIGINT)
            rc, err = wait_after_signal(proc, 30, "kv watch after SIGINT")
            assert rc == 0 and b"Traceback" not in err, err[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
