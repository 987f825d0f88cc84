"""tools/bench/cpu_per_entry.py --by-role names each process of a group by the role module its
command line shows, and the node by whether it leads: the split is only as good as that."""

from __future__ import annotations

import subprocess
import sys
import types

from tools.bench.cpu_per_entry import role_times

# Spends 50 ms of CPU, says so, then waits to be killed.
_BUSY = ("import time\nt = time.process_time() + 0.05\nwhile time.process_time() < t: pass\n"
         "print('spent', flush=True)\ntime.sleep(60)")


def test_processes_are_named_by_role_and_by_leader_or_follower() -> None:
    procs = {
        "n0": subprocess.Popen([sys.executable, "-c", _BUSY, "-m", "node.roles.handler"], stdout=subprocess.PIPE),
        "n1": subprocess.Popen([sys.executable, "-c", _BUSY], stdout=subprocess.PIPE),
    }
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline() == b"spent\n"
        t = role_times(types.SimpleNamespace(procs=procs), leader="n0")  # type: ignore[arg-type]
        assert set(t) == {"leader handler", "follower supervisor"}, t
        assert all(len(v) == 2 and min(v) >= 0 for v in t.values()), t
        assert sum(t["leader handler"]) >= 0.04 and sum(t["follower supervisor"]) >= 0.04, t
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
