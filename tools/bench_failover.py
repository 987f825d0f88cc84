"""Failover and idle-cost measurements on a local group (figures for docs/performance.md).

    python -m tools.bench_failover [--nodes 3] [--kills 20] [--idle-seconds 10] [--json]

Failover: SIGKILL the leader (its whole process group, like a machine crash), then poll the
survivors' METADATA every 10 ms until one of them is LEADER in a higher term and the others
follow it; the time from the kill to that moment is one sample. The killed node is restarted
and the group re-stabilises before the next kill.

Idle cost: CPU time (utime + stime from /proc) of every process of every node over a window
with no client traffic, as a percentage of one core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tools.local_group import LocalGroup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("server_args", nargs="*", help="extra `dledger server` options (after --)")
    args = ap.parse_args()
    g = LocalGroup(args.nodes, args.server_args).start()
    try:
        g.wait_leader()
        time.sleep(2)  # let start-up settle before measuring the idle cost
        c0, t0 = g.cpu_seconds(), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_pct = (g.cpu_seconds() - c0) / (time.monotonic() - t0) * 100
        samples = []
        for _ in range(args.kills):
            lead, term = g.wait_leader()
            others = [x for x in g.ids if x != lead]
            t = time.monotonic()
            g.kill(lead)
            while True:
                got = g.leader(others)
                if got and got[1] > term:
                    break
                time.sleep(0.01)
            samples.append(time.monotonic() - t)
            g.start(lead)
            g.wait_leader()
        res = {"nodes": args.nodes, "kills": len(samples), "failover_median_s": statistics.median(samples),
               "failover_max_s": max(samples), "failover_min_s": min(samples),
               "idle_cpu_percent_of_one_core": idle_pct, "samples_s": samples}
        if args.json:
            print(json.dumps(res))
        else:
            print(f"idle: {idle_pct:.2f}% of one core for {args.nodes} nodes (all processes)")
            print(f"failover over {len(samples)} leader SIGKILLs: median {res['failover_median_s']:.3f} s, "
                  f"min {res['failover_min_s']:.3f} s, max {res['failover_max_s']:.3f} s")
    finally:
        g.close()


if __name__ == "__main__":
    main()
