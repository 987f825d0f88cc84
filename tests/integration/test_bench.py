"""`dledger bench` runs against a local group it starts and stops itself, reports its
documented figures (docs/performance.md), and verifies what it wrote (speed is not asserted:
benchmarks report it)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.block.shared_state import segment_name

ROOT = Path(__file__).resolve().parents[2]


def _segments() -> set[str]:
    """Our shared blocks in /dev/shm. Tests compare before and after rather than expect none:
    another group on the machine (a parallel run, a crashed earlier run) is not this bench's."""
    return {p.name for p in Path("/dev/shm").glob("dl_*")}


def _leaked(since: set[str]) -> set[str]:
    """Blocks that appeared after `since` and whose supervisor is gone: a group still running
    on the machine (another test, a bench) has not leaked its block."""
    from node.block.shared_state import _peek_supervisor_pid

    out = set()
    for name in _segments() - since:
        pid = _peek_supervisor_pid(name)
        if pid is None or not Path(f"/proc/{pid}").exists():
            out.add(name)
    return out


def test_bench_local_group_json_verified_and_plotted(tmp_path):
    png = tmp_path / "bench.png"
    before = _segments()
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "3", "--count", "3000",
                        "--batch", "10", "--concurrency", "4", "--warmup", "0", "--size", "200",
                        "--verify-sample", "200", "--json", "--plot", str(png)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    for key in ("entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "errors", "config", "samples"):
        assert key in res, key
    assert res["errors"] == 0 and res["entries"] >= 3000
    assert res["verified"] == {"checked": 200, "mismatched": 0, "deleted_by_retention": 0}
    assert res["leader"]["before"] == res["leader"]["after"]
    assert res["rss_anon_mb"]["before"] > 0 and isinstance(res["rss_anon_mb"]["samples"], list)
    assert png.stat().st_size > 10_000
    assert not _leaked(before), "the bench left a node's shared block behind"


@pytest.mark.parametrize("op, mode", [("put", "async"), ("get", "sync"), ("mixed", "sync")])
def test_bench_kv_local_group_json_verified(op, mode):
    """`--kv` starts its group with the KV store, reports ops in the log bench's shape, and
    reads back a sample of keys against the newest acknowledged put of each (gets: every
    answer is also compared with what was put)."""
    before = _segments()
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "3", "--kv", "--kv-op", op,
                        "--mode", mode, "--count", "600", "--concurrency", "4", "--keys", "200",
                        "--warmup", "0", "--size", "300", "--verify-sample", "100", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    for key in ("ops_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "errors", "ops", "config",
                "samples", "kv"):
        assert key in res, key
    assert res["errors"] == 0 and res["ops"] >= 600  # --count: threads may each start one more
    assert res["config"]["kv_op"] == op and res["kv"]["value_size"] == 300
    v = res["verified"]
    assert v["checked"] == 100 and v["mismatched"] == 0 and v["doubtful_keys"] == 0, v
    if op == "get":
        assert v["gets_compared"] == res["ops"] and v["gets_mismatched"] == 0, v
    if op == "mixed":
        assert set(res["by_op"]) == {"put", "get"}
    assert not _leaked(before), "the bench left a node's shared block behind"


def test_bench_verifies_only_what_retention_kept():
    """On a group that deletes its oldest files while the bench runs, entries deleted by
    retention are reported as such, never as mismatches, and the kept ones still verify."""
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "1", "--duration", "4",
                        "--batch", "50", "--concurrency", "8", "--warmup", "0", "--size", "1000",
                        "--json", "--server-arg=--file-reserved-hours=0",
                        "--server-arg=--disk-space-ratio-to-clean=0.0001",
                        "--server-arg=--data-file-size=1048576", "--server-arg=--max-body-size=65536"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, (r.stderr[-2000:], r.stdout[:1500])
    v = json.loads(r.stdout)["verified"]
    assert v["mismatched"] == 0 and v["deleted_by_retention"] > 0 and v["checked"] > 0, v


def test_bench_counts_failures_and_stays_small_when_every_append_fails():
    """A group that refuses every append (DISK_FULL: the disk is "full" above 1% use) makes
    the bench fail fast at the request rate: it must count the errors by kind, exit 1, and
    not hold on to what it sent (it once grew by 350 MB/s here)."""
    before = _segments()
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "1", "--duration", "3",
                        "--warmup", "0", "--batch", "64", "--concurrency", "32", "--json",
                        "--server-arg=--disk-full-ratio=0.0001"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["errors"] > 1000 and res["error_kinds"] == ["DISK_FULL"] and res["entries"] == 0
    assert res["errors_by_code"] == {"DISK_FULL": res["errors"]}
    assert res["client_max_rss_mb"] < 400, res["client_max_rss_mb"]
    assert not _leaked(before), "the bench left a node's shared block behind"


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_a_killed_bench_does_not_leave_its_local_group_running():
    """SIGKILL (or the OOM killer) gives the bench no chance to stop its group: the servers
    must notice their parent is gone, stop, and remove their shared blocks."""
    import os
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "tools.cli", "bench", "--local", "1", "--duration", "60",
                          "--warmup", "0", "--batch", "8", "--concurrency", "2", "--json"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: list[int] = []
    root = None
    try:
        # this bench's own server and block (not any new block: another group may be starting
        # on the machine meanwhile)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (servers := _children(p.pid)):
            time.sleep(0.1)
        assert servers, "the local group did not start"
        args = Path(f"/proc/{servers[0]}/cmdline").read_bytes().split(b"\0")
        store = args[args.index(b"--store-dir") + 1].decode()
        root = Path(store).parent  # the bench's temp dir
        group = args[args.index(b"--group") + 1].decode() if b"--group" in args else "default"
        block = Path("/dev/shm", segment_name(group, args[args.index(b"--id") + 1].decode(), store))
        while time.monotonic() < deadline and not block.exists():
            time.sleep(0.1)
        assert block.exists(), "the local group did not start"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (any(Path(f"/proc/{s}").exists() for s in servers)
                                               or block.exists()):
            time.sleep(0.1)
        assert not [s for s in servers if Path(f"/proc/{s}").exists()], "servers outlived the bench"
        assert not block.exists(), "a shared block outlived the bench"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for sig in (signal.SIGTERM, signal.SIGKILL):  # TERM first: the supervisor removes its block
            for s in servers:
                try:
                    os.killpg(s, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(Path(f"/proc/{s}").exists() for s in servers):
                time.sleep(0.1)
        if root is not None and root.name.startswith("dledger-local-"):
            shutil.rmtree(root, ignore_errors=True)  # a killed bench cannot remove its own


def test_bench_without_json_shows_each_phase_on_stderr_and_one_result_line():
    """Off a terminal, the live view is plain lines: every phase announced (a bench is never
    silent for long), figures once a second, and stdout holds only the result line."""
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "3", "--duration", "2.5",
                        "--warmup", "0.5", "--batch", "4", "--concurrency", "4", "--size", "100",
                        "--verify-sample", "50"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    phases = [line.split()[0] for line in r.stderr.splitlines() if line.endswith("...")]
    assert phases == ["start-up", "warmup", "read-back"], r.stderr
    assert any(line.startswith("measuring") and "entries/s" in line for line in r.stderr.splitlines()), r.stderr
    out = r.stdout.strip().splitlines()
    assert len(out) == 1 and "entries/s" in out[0] and "verified 50/50" in out[0], r.stdout
