"""Failover and idle-cost measurements on a local group (figures for docs/performance.md).

    python -m tools.bench.failover [--nodes 3] [--kills 20] [--idle-seconds 10] [--writer]
                                   [--json] [--quiet] [-- server options...]

Failover: SIGKILL the leader (its whole process group, like a machine crash), then poll the
survivors' METADATA every 10 ms until one of them is LEADER in a higher term and the others
follow it; the time from the kill to that moment is one sample ("election"). The killed node
is restarted and the group re-stabilises before the next kill.

``--writer``: a sequential writer thread (one DLedgerClient, 128-byte bodies, ``append`` one
at a time) runs during the kills. Per kill it also records the "write outage": kill -> the
first acknowledged append whose entry is in a term above the killed leader's (i.e. written by
the new leader). That includes the client's own retry/timeout behaviour.

Per kill a breakdown from the survivors' elector logs is printed (``--quiet`` hides it): for
each survivor, when (ms after the kill) it noticed the leader was silent, each vote round
(term, outcome, tally, cost, the wait before the next round) and when it became leader or
follower. That shows *why* an election took as long as it did.

Idle cost: CPU time (utime + stime from /proc) of every process of every node over a window
with no client traffic, as a percentage of one core.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import threading
import time
from pathlib import Path

from tools.local_group import LocalGroup

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (\S+) elector\[\d+\] \S+: (.*)$")
_EVENTS = re.compile(r"leader silent for|vote round|became|heartbeat gap")


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    """p50 / p90 / max / min of a list of seconds (empty -> {})."""
    if not xs:
        return {}
    return {"p50": statistics.median(xs), "p90": pct(xs, 90), "max": max(xs), "min": min(xs)}


def elector_events(root: Path, nodes: list[str], t0_wall: float, t1_wall: float) -> list[str]:
    """Election-relevant elector log lines of `nodes` between two wall-clock times, each as
    '+<ms after t0> <node>: <message>', in time order. The logs' timestamps have ms resolution
    and use the local time zone (logging's asctime)."""
    out: list[tuple[float, str]] = []
    for n in nodes:
        try:
            text = (root / f"{n}.log").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = _LINE.match(line)
            if not m or not _EVENTS.search(m.group(3)):
                continue
            ts = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t0_wall - 0.001 <= ts <= t1_wall + 0.05:
                msg = m.group(3)
                if msg.startswith(m.group(2) + " "):
                    msg = msg[len(m.group(2)) + 1:]
                out.append((ts, f"+{(ts - t0_wall) * 1000:5.0f} ms {m.group(2)}: {msg}"))
    return [s for _, s in sorted(out)]


class Writer(threading.Thread):
    """Sequential appends of 128-byte bodies; keeps (ack monotonic time, entry term)."""

    def __init__(self, peers: str, group: str, key_file: str | os.PathLike[str] | None = None) -> None:
        super().__init__(name="bench-writer", daemon=True)
        from ipc.client import DLedgerClient  # only this tool's writer needs the client
        self.client = DLedgerClient(peers, group, key_file=key_file)
        self.stop = threading.Event()
        self.acks: list[tuple[float, int]] = []
        self.errors = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        from ipc.client import DLedgerError
        body = os.urandom(128)
        while not self.stop.is_set():
            try:
                r = self.client.append(body)
            except DLedgerError:
                self.errors += 1
                continue
            with self.lock:
                self.acks.append((time.monotonic(), r.term))

    def first_ack_after(self, t: float, above_term: int, deadline: float) -> float | None:
        """Monotonic time of the first ack after `t` in a term > `above_term` (wait until
        `deadline` for it), else None."""
        while True:
            with self.lock:
                found = [at for at, term in self.acks[-500:] if at > t and term > above_term]
            if found:
                return min(found)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        self.client.close()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.failover", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--writer", action="store_true", help="run a sequential 128-byte writer")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no per-kill breakdown")
    ap.add_argument("server_args", nargs="*", help="extra `dledger server` options (after --)")
    args = ap.parse_args()
    # SIGTERM runs the finally below (servers stopped, the killed node's segment removed).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    g = LocalGroup(args.nodes, args.server_args).start()
    w: Writer | None = None
    try:
        g.wait_leader()
        time.sleep(2)  # let start-up settle before measuring the idle cost
        c0, t0 = g.cpu_seconds(), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_pct = (g.cpu_seconds() - c0) / (time.monotonic() - t0) * 100
        if args.writer:
            w = Writer(g.peers, g.group)
            w.start()
            time.sleep(1)
        samples, outages, kills = [], [], []
        for k in range(args.kills):
            lead, term = g.wait_leader()
            if w is not None:  # the writer must be running in this term before the kill
                w.first_ack_after(time.monotonic(), term - 1, time.monotonic() + 10)
                time.sleep(0.2)
            others = [x for x in g.ids if x != lead]
            t, t_wall = time.monotonic(), time.time()
            g.kill(lead)
            while True:
                got = g.leader(others)
                if got and got[1] > term:
                    break
                time.sleep(0.01)
            el = time.monotonic() - t
            samples.append(el)
            rec = {"kill": k + 1, "killed": lead, "term": term, "new_leader": got[0],
                   "new_term": got[1], "election_s": el}
            if w is not None:
                ack = w.first_ack_after(t, term, t + 30)
                rec["write_outage_s"] = None if ack is None else ack - t
                if ack is not None:
                    outages.append(ack - t)
            rec["events"] = elector_events(g.root, others, t_wall, t_wall + el)
            kills.append(rec)
            if not args.json and not args.quiet:
                wo = rec.get("write_outage_s")
                print(f"kill {k + 1}: {lead} (term {term}) -> {got[0]} term {got[1]}: election "
                      f"{el * 1000:.0f} ms" + (f", write outage {wo * 1000:.0f} ms" if wo else ""))
                for line in rec["events"]:
                    print("    " + line)
            g.start(lead)
            g.wait_leader()
        res = {"nodes": args.nodes, "kills": len(samples), "writer": args.writer,
               "server_args": args.server_args,
               "election_s": summary(samples), "write_outage_s": summary(outages),
               "failover_median_s": statistics.median(samples),
               "failover_max_s": max(samples), "failover_min_s": min(samples),
               "idle_cpu_percent_of_one_core": idle_pct,
               "writer_errors": w.errors if w else None, "samples_s": samples,
               "per_kill": kills}
        if args.json:
            print(json.dumps(res))
        else:
            e = res["election_s"]
            print(f"idle: {idle_pct:.2f}% of one core for {args.nodes} nodes (all processes)")
            print(f"election over {len(samples)} leader SIGKILLs: p50 {e['p50']:.3f} s, "
                  f"p90 {e['p90']:.3f} s, max {e['max']:.3f} s, min {e['min']:.3f} s")
            if w is not None and outages:
                o = res["write_outage_s"]
                print(f"write outage ({len(outages)} kills, writer errors {w.errors}): "
                      f"p50 {o['p50']:.3f} s, p90 {o['p90']:.3f} s, max {o['max']:.3f} s")
    finally:
        if w is not None:
            w.close()
        g.close()
        # A node SIGKILLed and not restarted yet (interrupted run) leaves its shared-memory
        # segment; the names are deterministic, so remove ours.
        from node.block.shared_state import segment_name
        for x in g.ids:
            Path("/dev/shm", segment_name(g.group, x, g.root / x)).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
