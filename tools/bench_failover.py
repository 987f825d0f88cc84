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
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from ipc import protocol as P
from ipc.codes import Role
from node.ports import free_port_pairs

CLK_TCK = os.sysconf("SC_CLK_TCK")


class LocalGroup:
    def __init__(self, n: int, extra: list[str]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dledger-bench-"))
        self.ports = free_port_pairs(n)
        self.ids = [f"n{i}" for i in range(n)]
        self.peers = ";".join(f"{i}-127.0.0.1:{p}" for i, p in zip(self.ids, self.ports, strict=True))
        self.extra = extra
        self.procs: dict[str, subprocess.Popen] = {}
        self.ctx = zmq.Context()

    def start(self, nid: str) -> None:
        log = open(self.root / f"{nid}.log", "ab")  # noqa: SIM115 - handed to the child
        self.procs[nid] = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "server", "--id", nid, "--peers", self.peers,
             "--store-dir", str(self.root / nid), "--data-file-size", str(64 << 20),
             "--index-file-size", str(8 << 20), *self.extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()

    def kill(self, nid: str) -> None:
        os.killpg(self.procs[nid].pid, signal.SIGKILL)
        self.procs[nid].wait()

    def meta(self, nid: str, timeout_ms: int = 200) -> P.MetadataResponse | None:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        try:
            s.connect(f"tcp://127.0.0.1:{self.ports[self.ids.index(nid)]}")
            s.send(P.encode(P.MetadataRequest("default", nid, request_id=1)))
            if s.poll(timeout_ms):
                m = P.decode(s.recv())
                return m if isinstance(m, P.MetadataResponse) else None
            return None
        finally:
            s.close()

    def leader(self, among: list[str]) -> tuple[str, int] | None:
        views = [self.meta(x) for x in among]
        if any(v is None for v in views):
            return None
        leaders = [v for v in views if v.role == Role.LEADER]
        if len(leaders) == 1 and all(v.leader_id == leaders[0].self_id and v.term == leaders[0].term
                                     for v in views):
            return leaders[0].self_id, leaders[0].term
        return None

    def wait_leader(self, among: list[str], timeout: float = 30) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.leader(among)
            if got:
                return got
            time.sleep(0.01)
        raise RuntimeError("no leader")

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.procs.values():
            for pid in _tree(p.pid):
                try:
                    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(f[11]) + int(f[12])) / CLK_TCK
                except (OSError, IndexError):
                    pass
        return total

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.root, ignore_errors=True)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("server_args", nargs="*", help="extra `dledger server` options (after --)")
    args = ap.parse_args()
    g = LocalGroup(args.nodes, args.server_args)
    try:
        for nid in g.ids:
            g.start(nid)
        g.wait_leader(g.ids)
        time.sleep(2)  # let start-up settle before measuring the idle cost
        c0, t0 = g.cpu_seconds(), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_pct = (g.cpu_seconds() - c0) / (time.monotonic() - t0) * 100
        samples = []
        for _ in range(args.kills):
            lead, term = g.wait_leader(g.ids)
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
            g.wait_leader(g.ids)
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
