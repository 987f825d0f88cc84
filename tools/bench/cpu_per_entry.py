"""CPU seconds a local group's processes spend per entry for a fixed amount of bench work.

Why this and not entries/s: on this 2-core machine a run's throughput moves by ±30% with what
else runs, so a cost of a few percent (the metrics instrumentation, docs/metrics.md "Cost")
cannot be seen in throughput; CPU per entry for a fixed `--count` varies by ~2% between runs.

It starts a fresh 3-node group (256 MiB / 32 MiB files), waits for a leader and 2 s of idle,
runs `dledger bench --peers ... --count N` against it, and prints one JSON line: the group's
user+system CPU over the run divided by the entries, the same for the bench process (the load
generator shares the cores), and the bench's entries/s. To compare two
commits, alternate between `git archive` copies of them:

  PYTHONPATH=TREE .venv/bin/python TREE/tools/bench/cpu_per_entry.py --count 200000 --batch 1 --concurrency 256

(run from inside TREE; TREE's own bench and server are used).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from tools.local_group import LocalGroup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench/cpu_per_entry.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200_000, help="entries to append (default 200000)")
    ap.add_argument("--batch", type=int, default=1, help="entries per request (default 1)")
    ap.add_argument("--concurrency", type=int, default=256, help="requests in flight (default 256)")
    ap.add_argument("--size", type=int, default=1024, help="entry size in bytes (default 1024)")
    a = ap.parse_args(argv)
    group = LocalGroup(3, ["--data-file-size", str(256 << 20), "--index-file-size", str(32 << 20)]).start()
    try:
        group.wait_leader(timeout=60)
        time.sleep(2)  # elections and first heartbeats are not the workload
        cpu0 = group.cpu_seconds()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the group's servers are reaped later
        r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--peers", group.peers,
                            "--count", str(a.count), "--batch", str(a.batch), "--concurrency",
                            str(a.concurrency), "--size", str(a.size), "--warmup", "0", "--json",
                            "--verify-sample", "10"], capture_output=True, text=True, check=False)
        cpu1 = group.cpu_seconds()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        group.close()
    if r.returncode != 0:
        print(f"bench failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    res = json.loads(r.stdout)
    bench_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    print(json.dumps({"us_cpu_per_entry": (cpu1 - cpu0) / res["entries"] * 1e6,
                      "bench_us_cpu_per_entry": bench_cpu / res["entries"] * 1e6,
                      "entries_per_s": res["entries_per_s"], "entries": res["entries"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
