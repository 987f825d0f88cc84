"""`dledger bench` runs against a local group it starts and stops itself, reports what
CONTRACT promises, and verifies what it wrote (speed is not asserted: benchmarks report it)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_local_group_json_verified_and_plotted(tmp_path):
    png = tmp_path / "bench.png"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "3", "--count", "3000",
                        "--batch", "10", "--concurrency", "4", "--warmup", "0", "--size", "200",
                        "--verify-sample", "200", "--json", "--plot", str(png)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    for key in ("entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "errors", "config", "samples"):
        assert key in res, key
    assert res["errors"] == 0 and res["entries"] >= 3000
    assert res["verified"] == {"checked": 200, "mismatched": 0}
    assert res["leader"]["before"] == res["leader"]["after"]
    assert png.stat().st_size > 10_000
    assert not list(Path("/dev/shm").glob("dl_*")), "the bench left a node's shared block behind"


def test_bench_counts_failures_and_stays_small_when_every_append_fails():
    """A group that refuses every append (DISK_FULL: the disk is "full" above 1% use) makes
    the bench fail fast at the request rate: it must count the errors by kind, exit 1, and
    not hold on to what it sent (it once grew by 350 MB/s here)."""
    r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--local", "1", "--duration", "3",
                        "--warmup", "0", "--batch", "64", "--concurrency", "32", "--json",
                        "--server-arg=--disk-full-ratio=0.0001"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["errors"] > 1000 and res["error_kinds"] == ["DISK_FULL"] and res["entries"] == 0
    assert res["client_max_rss_mb"] < 400, res["client_max_rss_mb"]
    assert not list(Path("/dev/shm").glob("dl_*")), "the bench left a node's shared block behind"
