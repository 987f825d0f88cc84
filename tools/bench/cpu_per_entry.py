"""CPU seconds a local group's processes spend per entry for a fixed amount of bench work.

Why this and not entries/s: on this 2-core machine a run's throughput moves by ±30% with what
else runs, so a cost of a few percent (the metrics instrumentation, docs/metrics.md "Cost")
cannot be seen in throughput; CPU per entry for a fixed `--count` varies by ~2% between runs.

It starts a fresh 3-node group (256 MiB / 32 MiB files), waits for a leader and 2 s of idle,
runs `dledger bench --peers ... --count N` against it, and prints one JSON line: the group's
user+system CPU over the run divided by the entries, the same for the bench process (the load
generator shares the cores), and the bench's entries/s. To compare two
commits, alternate between `git archive` copies of them (`--by-role` also splits the group's
CPU by role, user and system apart, the leader's roles from the followers': where a change
moved the cost, and which stage saturates at a peak):

  PYTHONPATH=TREE .venv/bin/python TREE/tools/bench/cpu_per_entry.py --count 200000 --batch 1 --concurrency 256

(run from inside TREE; TREE's own bench and server are used).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import resource
import subprocess
import sys
import time

import psutil

from tools.local_group import LocalGroup, process_tree

_ROLE = re.compile(r"node\.roles\.(\w+)")


def role_times(group: LocalGroup, leader: str) -> dict[str, list[float]]:
    """User and system CPU seconds per role, "leader handler", "follower dispatcher", ... (the
    followers' and the dispatchers' summed); a process is named by the module its command
    line shows (docs/operations.md "What runs"), "supervisor" when it shows none."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for nid, proc in group.procs.items():
        side = "leader" if nid == leader else "follower"
        for pid in process_tree(proc.pid):
            try:
                p = psutil.Process(pid)
                m = _ROLE.search(" ".join(p.cmdline()))
                t = p.cpu_times()
            except psutil.Error:
                continue
            acc = out[f"{side} {m.group(1) if m else 'supervisor'}"]
            acc[0] += t.user
            acc[1] += t.system
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench/cpu_per_entry.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200_000, help="entries to append (default 200000)")
    ap.add_argument("--batch", type=int, default=1, help="entries per request (default 1)")
    ap.add_argument("--concurrency", type=int, default=256, help="requests in flight (default 256)")
    ap.add_argument("--size", type=int, default=1024, help="entry size in bytes (default 1024)")
    ap.add_argument("--by-role", action="store_true",
                    help="also the group's CPU per entry by role, user and system (key by_role)")
    a = ap.parse_args(argv)
    group = LocalGroup(3, ["--data-file-size", str(256 << 20), "--index-file-size", str(32 << 20)]).start()
    try:
        leader, _term = group.wait_leader(timeout=60)
        time.sleep(2)  # elections and first heartbeats are not the workload
        roles0 = role_times(group, leader) if a.by_role else {}
        cpu0 = group.cpu_seconds()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the group's servers are reaped later
        r = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--peers", group.peers,
                            "--count", str(a.count), "--batch", str(a.batch), "--concurrency",
                            str(a.concurrency), "--size", str(a.size), "--warmup", "0", "--json",
                            "--verify-sample", "10"], capture_output=True, text=True, check=False)
        cpu1 = group.cpu_seconds()
        roles1 = role_times(group, leader) if a.by_role else {}
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        group.close()
    if r.returncode != 0:
        print(f"bench failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    res = json.loads(r.stdout)
    bench_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    out = {"us_cpu_per_entry": (cpu1 - cpu0) / res["entries"] * 1e6,
           "bench_us_cpu_per_entry": bench_cpu / res["entries"] * 1e6,
           "entries_per_s": res["entries_per_s"], "entries": res["entries"]}
    if a.by_role:  # role -> [user, system] µs per entry (a role restarted meanwhile is left out)
        out["by_role"] = {k: [round((v[i] - roles0.get(k, [0.0, 0.0])[i]) / res["entries"] * 1e6, 3)
                              for i in (0, 1)] for k, v in sorted(roles1.items())}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
