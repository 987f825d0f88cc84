"""`python -m tools.bench.start` (docs/performance.md "Start time") measures a real group's start:
every phase it reports comes from the nodes' own log lines, in launch order."""

import json
import subprocess
import sys
from itertools import pairwise

from cluster import ROOT

from tools.bench.start import PHASES


def test_start_bench_reports_every_phase_in_order():
    r = subprocess.run([sys.executable, "-m", "tools.bench.start", "--runs", "1", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(ln) for ln in r.stdout.splitlines()]
    med = row["median_s_from_launch"]
    assert list(med) == list(PHASES), med  # each phase found in the logs
    times = [med[k] for k in PHASES]
    assert times[0] > 0 and all(a <= b for a, b in pairwise(times)), med
    assert row["cpu_s_to_leader"] > 0


def test_start_bench_times_dledger_cluster_as_a_user_runs_it():
    """`--cluster secure`: the documented command itself (its CLI, the keys, the servers), with
    the same phases from the combined log it prints."""
    r = subprocess.run([sys.executable, "-m", "tools.bench.start", "--cluster", "secure", "--runs", "1",
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert row["code"] == "dledger cluster (secure)"
    med = row["median_s_from_launch"]
    assert list(med) == list(PHASES), med
    times = [med[k] for k in PHASES]
    assert times[0] > 0 and all(a <= b for a, b in pairwise(times)), med


def test_restart_bench_measures_a_follower_with_a_log():
    """`python -m tools.bench.restart` (docs/performance.md "Restart") on a small log: the group
    it builds elects a leader and the follower rejoins after each restart (it stopped with "no
    agreed leader" once a node with a log and no term file waited for the others' terms)."""
    r = subprocess.run([sys.executable, "-m", "tools.bench.restart", "--sizes", "0.01", "--restarts", "1",
                        "--timeout", "60", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert rows and rows[0]["entries"] > 0, r.stdout
    med = rows[0]["median"]
    assert 0 < med["to_metadata"] <= med["rejoined"], rows
