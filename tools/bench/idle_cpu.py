"""Idle CPU of a local group: what an N-node group with no client costs, as % of one core.

Why a tool: the docs had three figures for this (1.5 %, 2.7-3.2 %, and 3.6-4.0 % measured by an
operator) taken with different methods at different commits. This is the one method: start a
fresh group (tools.local_group: 64 MiB / 8 MiB files, every default of `dledger server`), wait
for a leader and --settle seconds (elections and first heartbeats are not idle), then --samples
windows of --window seconds each; in each, the user+system CPU of every process of the group
(supervisors and roles, by /proc through psutil) divided by the window's wall time. Prints one
line per window, the per-role share of the last one, and a JSON summary (min, median, max).

  .venv/bin/python -m tools.bench.idle_cpu --nodes 3 --samples 5 --window 10
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict

import psutil

from tools.local_group import LocalGroup


def _role(proc: psutil.Process) -> str:
    """`supervisor`, `handler`, `elector`, `dispatcher`, ... from a process's command line."""
    cmd = " ".join(proc.cmdline())
    if "resource_tracker" in cmd:
        return "resource_tracker"
    m = re.search(r"node\.roles\.(\w+)", cmd)
    return m.group(1) if m else "supervisor"


def _cpu_by_role(group: LocalGroup) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for pid in group.pids():
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            out[_role(p)] += t.user + t.system
        except psutil.Error:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.idle_cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3, help="group size (default 3)")
    ap.add_argument("--samples", type=int, default=5, help="measurement windows (default 5)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window (default 10)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the first leader (default 5)")
    a = ap.parse_args(argv)
    percents: list[float] = []
    with LocalGroup(a.nodes).start() as group:
        group.wait_leader(timeout=120)
        time.sleep(a.settle)
        last: dict[str, float] = {}
        for i in range(a.samples):
            before, t0 = _cpu_by_role(group), time.monotonic()
            time.sleep(a.window)
            after, wall = _cpu_by_role(group), time.monotonic() - t0
            last = {r: (after[r] - before.get(r, 0.0)) / wall * 100 for r in after}
            pct = sum(last.values())
            percents.append(pct)
            print(f"window {i + 1}: {pct:.2f} % of one core ({a.nodes} nodes, all processes)", flush=True)
        print("last window by role: " + ", ".join(f"{r} {v:.2f} %" for r, v in
                                                   sorted(last.items(), key=lambda x: -x[1])))
    print(json.dumps({"nodes": a.nodes, "window_s": a.window, "min": round(min(percents), 2),
                      "median": round(statistics.median(percents), 2), "max": round(max(percents), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
