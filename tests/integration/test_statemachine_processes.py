"""State machines on real processes (docs/statemachine.md): the KV store served by a 3-node group,
results of applied entries returned to the appending client, snapshots taken and restored, the
applier's crash and restart, and a user state machine that raises."""

import signal
import threading
from pathlib import Path

import pytest
from cluster import read_log, wait_for

from ipc.client import DLedgerClient, DLedgerError, KVClient, KVError
from node.statemachine.kv import KVInputError
from node.store import codec


def kv_client(c, **kw) -> KVClient:
    return KVClient(c.peers, group=c.group, timeout=kw.pop("timeout", 10.0), **kw)


def test_kv_operations_revisions_and_bad_input(make_cluster):
    c = make_cluster(3, state_machine="kv")
    c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        r1 = kv.put(b"a", b"1")
        got = kv.get(b"a")
        assert (got.value, got.revision) == (b"1", r1)
        assert kv.cas(b"a", b"nope", b"2") is False and kv.get(b"a").value == b"1"
        assert kv.cas(b"a", b"1", b"2") is True and kv.get(b"a").value == b"2"
        assert kv.cas(b"new", None, b"x") is True and kv.cas(b"new", None, b"y") is False
        for i in range(30):
            kv.put(b"p/%02d" % i, b"%d" % i)
        page = kv.scan(b"p/")
        assert [x.key for x in page] == [b"p/%02d" % i for i in range(30)]
        assert len(kv.scan(b"p/", limit=7)) == 7
        assert kv.delete(b"a") is True and kv.delete(b"a") is False and kv.get(b"a") is None
        assert kv.get(b"never") is None
        for bad, exc in (((b"", b"v"), KVInputError), ((b"k" * 5000, b"v"), KVInputError),
                         ((b"k", b"v" * (1 << 20 + 1)), KVInputError), (("str", b"v"), TypeError)):
            with pytest.raises(exc):
                kv.put(*bad)
    with DLedgerClient(c.peers, group=c.group, timeout=5.0) as plain:
        r = plain.append(b"\x7fnot a kv command")  # a malformed command: an error *result*, no change
        assert r.result is not None and r.result[0] != 0


def test_cas_counter_is_exactly_once_through_leader_kills_and_state_survives_restarts(make_cluster):
    """Four clients increment one counter with cas while the leader is killed twice: every
    successful cas is one increment (a retried cas is answered with its original result, not
    applied again), and the final value equals the number of successes."""
    c = make_cluster(3, state_machine="kv", snapshot_threshold=100)
    c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        kv.put(b"counter", b"0")
    wins = [0] * 4  # successful cas per client, read live: the kills are paced by counts, not sleeps
    errors: list[Exception] = []
    stop = threading.Event()

    def incrementer(me: int) -> None:
        with kv_client(c, timeout=20.0) as kv:
            while not stop.is_set():
                try:
                    cur = kv.get(b"counter").value
                    if kv.cas(b"counter", cur, b"%d" % (int(cur) + 1)):
                        wins[me] += 1
                except (DLedgerError, KVError) as e:
                    errors.append(e)

    def more_wins(n: int, what: str) -> None:
        # 120 increments are 120+ entries: past a snapshot (threshold 100) before each kill.
        target = sum(wins) + n
        wait_for(lambda: sum(wins) >= target or errors, 60, what)

    threads = [threading.Thread(target=incrementer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for k in range(2):
            more_wins(120, f"120 increments before kill {k + 1}")
            lead = c.wait_leader(timeout=15)
            c.nodes[lead].kill()
            c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
            c.nodes[lead].start()
        more_wins(60, "60 increments after the last restart")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:3]
    c.wait_converged(timeout=30)
    with kv_client(c) as kv:
        final = int(kv.get(b"counter").value)
    assert final == sum(wins) and final >= 300, (final, wins)
    # Snapshots were taken and a restarted node restored one.
    assert any(Path(n.store_dir, "snapshots").glob("0*-*") for n in c.nodes.values())
    assert any("restored the snapshot at index" in n.log_text() for n in c.nodes.values())


def test_a_killed_applier_is_restarted_and_rebuilds_the_same_state(make_cluster):
    c = make_cluster(3, state_machine="kv", snapshot_threshold=40)
    lead = c.wait_leader(timeout=15)
    with kv_client(c) as kv:
        for i in range(100):
            kv.put(b"k%03d" % i, b"v%d" % i)
        pid = c.nodes[lead].role_pids().get("applier")
        assert pid is not None
        import os
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: c.nodes[lead].role_pids().get("applier") not in (None, pid), 30, "the applier restarted")
        kv.put(b"after", b"crash")
        assert kv.get(b"k050").value == b"v50" and kv.get(b"after").value == b"crash"
        assert len(kv.scan(b"k")) == 100


BROKEN_SM = '''
from node.statemachine.api import StateMachine

class Poisoned(StateMachine):
    def apply(self, entries):
        out = []
        for e in entries:
            if bytes(e.body) == b"poison":
                raise RuntimeError("cannot digest this entry")
            out.append(b"ok")
        return out

    def snapshot(self, writer):
        writer.write(b"")

    def restore(self, reader):
        reader.read()
'''


def test_a_state_machine_that_raises_stops_its_applier_with_a_clear_message_and_the_log_stays(make_cluster, tmp_path):
    mod = tmp_path / "poisonsm"
    mod.mkdir()
    (mod / "__init__.py").write_text(BROKEN_SM)
    c = make_cluster(3, start=False, state_machine="poisonsm:Poisoned")
    c.env["PYTHONPATH"] = str(tmp_path)  # the user's module, importable by the nodes
    c.start()
    c.wait_leader(timeout=15)
    with DLedgerClient(c.peers, group=c.group, timeout=5.0) as cl:
        assert cl.append(b"fine").result == b"ok"
        with pytest.raises(DLedgerError):
            cl.append(b"poison", timeout=3.0)  # committed, but never applied: no answer
    # every applier fails on the same entry after each restart, so every node crash-loops and
    # stops whole, saying why (never a node that stores entries it can no longer apply)
    for n in c.nodes.values():
        wait_for(lambda n=n: not n.alive, 90, f"{n.id} stopped on its crash-looping applier")
        assert n.proc.returncode == 1
        log = n.log_text()
        assert "state machine poisonsm:Poisoned failed applying entries" in log
        assert "RuntimeError: cannot digest this entry" in log
        assert "dledger server: error: applier" in log
        # the entry is in the log, committed, exactly as written: the log is untouched
        assert [body for _i, _t, magic, body in read_log(n.store_dir)
                if magic == codec.MAGIC_NORMAL] == [b"fine", b"poison"]


def test_the_kv_command_line(make_cluster):
    import json
    import subprocess
    import sys

    c = make_cluster(3, state_machine="kv")
    c.wait_leader(timeout=15)
    root = Path(__file__).resolve().parents[2]

    def kv(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tools.cli", "kv", args[0], "--peers", c.peers, *args[1:]],
                              cwd=root, capture_output=True, text=True, timeout=60)

    put = kv("put", "greeting", "hello")
    assert put.returncode == 0 and int(put.stdout) > 0, put.stderr
    assert kv("get", "greeting").stdout == "hello\n"
    got = json.loads(kv("get", "greeting", "--json").stdout)
    assert got["value"] == "hello" and got["revision"] == int(put.stdout) and got["version"] == 1
    assert kv("cas", "greeting", "nope", "x").returncode == 1
    ok = kv("cas", "greeting", "hello", "hi")
    assert (ok.returncode, ok.stdout) == (0, "swapped\n")
    assert kv("cas", "fresh", "v", "--absent").returncode == 0
    assert [ln.split("\t")[:2] for ln in kv("scan").stdout.splitlines()] == [["fresh", "v"], ["greeting", "hi"]]
    assert kv("del", "greeting").stdout == "1\n" and kv("del", "greeting").stdout == "0\n"
    missing = kv("get", "greeting")
    assert missing.returncode == 1 and "not found" in missing.stderr
    for bad in (("put", "", "v"), ("get", "k" * 5000), ("cas", "k", "only-one")):
        r = kv(*bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_dledger_snapshot_on_every_node_and_a_restart_restores_it(make_cluster):
    import subprocess
    import sys

    c = make_cluster(3, state_machine="kv", snapshot_threshold=1_000_000)  # only on demand
    c.wait_leader(timeout=15)
    root = Path(__file__).resolve().parents[2]
    with kv_client(c) as kv:
        for i in range(25):
            kv.put(b"s%02d" % i, b"%d" % i)
    c.wait_converged(timeout=20)
    r = subprocess.run([sys.executable, "-m", "tools.cli", "snapshot", "--peers", c.peers], cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(" snapshot at index " in ln for ln in lines), lines
    index = int(lines[0].split()[4])
    assert index >= 25
    for line in lines:  # "n0 snapshot at index I term T": that snapshot is on n0's disk
        nid, _s, _a, _i, idx, _t, term = line.split()
        assert Path(c.nodes[nid].store_dir, "snapshots", f"{int(idx):020d}-{int(term):020d}").is_dir()
    victim = next(iter(c.nodes))
    c.nodes[victim].stop()
    c.nodes[victim].start()
    wait_for(lambda: "restored the snapshot at index" in c.nodes[victim].log_text(), 30, "the restart restored it")
    one = subprocess.run([sys.executable, "-m", "tools.cli", "snapshot", "--peers", c.peers, "--node", "nx"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert one.returncode == 2 and "not in --peers" in one.stderr
    with kv_client(c) as kv:
        assert kv.get(b"s24").value == b"24"


def test_dledger_snapshot_on_a_plain_log_says_unsupported(make_cluster):
    import subprocess
    import sys

    c = make_cluster(1)
    c.wait_leader(timeout=15)
    r = subprocess.run([sys.executable, "-m", "tools.cli", "snapshot", "--peers", c.peers], cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "UNSUPPORTED" in r.stdout and "no state machine" in r.stdout, r.stdout + r.stderr
