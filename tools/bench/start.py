"""Start time of a brand-new local group, to its first agreed leader (docs/performance.md "Start time").

    python -m tools.bench.start [--nodes 3] [--runs 5] [--code-dir DIR ...] [--json]
    python -m tools.bench.start --cluster secure|plain [--runs 5]   # `dledger cluster` itself

Each run starts a fresh group of `--nodes` `dledger server` processes at once (LocalGroup,
empty stores) and polls every node's METADATA until they all name one leader in one term:
"to leader" is launch -> that moment, as a client sees it. The time is then broken down from
the nodes' logs (JSON lines, wall clock): each node's phase times, their median over the nodes
(but "elected" is the leader's "became LEADER" line, and "seen" the group's), then the
median over the runs:

  launch -> supervisor  "node starting" (interpreter, CLI and supervisor imports, lock, block)
  -> handler serving    "serving on" (handler started, imported, store recovered, bound)
  -> elector up         the elector's first line (its start and imports, after the handler beat)
  -> elector ready      "elector ready" (the group's term learned from the other members)
  -> elected            the leader's "became LEADER" (the first vote timer + the vote round)
  -> all know           the last node's "became LEADER"/"became FOLLOWER ... leader=" line
  -> seen               the agreed leader seen by this tool (its own polling)

and the CPU (user + system) of every live process of the group at that moment: on 2 cores
with 3 nodes starting at once the start is CPU-bound, so this is what a quiet machine's
start time follows.

`--code-dir DIR` (repeatable; `.` is this checkout) runs the servers from another checkout
(e.g. `git archive` of an older commit unpacked in DIR), in turn, for an A/B in one sitting.
Every server is stopped and its stores removed after each run, also on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from ipc.client import DLedgerClient
from node.host.interpreter import child_env, module_command
from tools.local_group import LocalGroup, cpu_seconds, process_tree

PHASES = ("supervisor", "serving", "elector_up", "elector_ready", "elected", "all_know", "seen")


def _node_events(log: Path) -> dict[str, float]:
    """Wall-clock times of one node's start-up lines (the first of each)."""
    return _events(log.read_text(errors="replace").splitlines())


def _events(lines: list[str]) -> dict[str, float]:
    """Wall-clock times of the first of each start-up line among one node's JSON log lines."""
    out: dict[str, float] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        ts = datetime.fromisoformat(rec["ts"]).timestamp()
        msg, role = rec.get("msg", ""), str(rec.get("role", ""))
        marks = (("supervisor", "node starting" in msg),
                 ("serving", "serving on" in msg),
                 ("elector_up", role.startswith("elector")),
                 ("elector_ready", "elector ready" in msg),
                 ("elected", "became LEADER" in msg),
                 ("knows", "became LEADER" in msg or ("became FOLLOWER" in msg and "leader=" in msg)))
        for key, hit in marks:
            if hit and key not in out:
                out[key] = ts
    return out


def start_once(nodes: int, code: str | None, timeout: float) -> dict[str, float]:
    """One fresh group: seconds from launch to each phase (medians over the nodes, but
    "elected" and "seen" are the group's)."""
    g = LocalGroup(nodes, extra_args=["--log-format", "json"])
    g.cwd = code
    try:
        t0_wall, t0 = time.time(), time.monotonic()
        g.start()
        g.wait_leader(timeout=timeout)
        seen = time.monotonic() - t0
        cpu = g.cpu_seconds()  # of every process of the group, to get there
        events = [_node_events(g.root / f"{x}.log") for x in g.ids]
    finally:
        g.close()
    return _phases(events, t0_wall, seen, cpu)


def cluster_once(nodes: int, secure: bool, timeout: float) -> dict[str, float]:
    """One `dledger cluster --nodes N` as a user runs it (secure unless `secure` is False): the
    same phases, from launch of the command, the CLI's own start included. "seen" is this tool's
    client (polling every member with 50 ms attempts) finding one leader named by all."""
    cmd = [*module_command("tools.cli"), "cluster", "--nodes", str(nodes), "--log-format", "json"]
    if not secure:
        cmd.append("--insecure")
    lines: list[str] = []
    t0_wall, t0 = time.time(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=child_env())
    try:
        assert proc.stdout is not None
        peers = proc.stdout.readline().strip()
        key = proc.stdout.readline().split("key-file:", 1)[1].strip() if secure else None
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        client = DLedgerClient(peers, key_file=key, timeout=timeout, attempt_timeout=0.05)
        try:
            while True:
                m = client.metadata()
                if m.leader_id and all(n.alive and n.leader == m.leader_id for n in m.nodes):
                    break
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"no agreed leader within {timeout} s")
        finally:
            client.close()
        seen = time.monotonic() - t0
        cpu = cpu_seconds(process_tree(proc.pid))  # the CLI and every node below it
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    reader.join(timeout=10)
    by_node: dict[str, list[str]] = {}
    for line in lines:
        try:
            by_node.setdefault(json.loads(line).get("node", "?"), []).append(line)
        except ValueError:
            continue
    return _phases([_events(v) for k, v in sorted(by_node.items()) if k != "?"], t0_wall, seen, cpu)


def _phases(events: list[dict[str, float]], t0_wall: float, seen: float,
            cpu: float) -> dict[str, float]:
    """Each phase's time from launch: medians over the nodes, but "elected" is the first
    leader's, "all_know" the last node's, "seen" and "cpu" the group's."""
    out: dict[str, float] = {}
    for key in PHASES[:-3]:
        got = [e[key] - t0_wall for e in events if key in e]
        if got:
            out[key] = statistics.median(got)
    elected = [e["elected"] - t0_wall for e in events if "elected" in e]
    if elected:
        out["elected"] = min(elected)
    knows = [e["knows"] - t0_wall for e in events if "knows" in e]
    if len(knows) == len(events):
        out["all_know"] = max(knows)
    out["seen"] = seen
    out["cpu"] = cpu
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.start",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="fresh groups started per version")
    ap.add_argument("--code-dir", action="append", default=None,
                    help="run the servers from this checkout (repeatable, in turn; '.' is this one)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds one start may take")
    ap.add_argument("--json", action="store_true", help="one JSON object per version")
    ap.add_argument("--cluster", choices=("secure", "plain"), default=None,
                    help="time `dledger cluster` itself (its CLI included; secure is its default) "
                         "instead of N `dledger server` processes")
    args = ap.parse_args(argv)
    for code in args.code_dir or ["."]:
        cwd = None if code == "." else os.path.abspath(code)
        if args.cluster:
            if cwd is not None:
                ap.error("--cluster runs this checkout only")
            code = f"dledger cluster ({args.cluster})"
            samples = [cluster_once(args.nodes, args.cluster == "secure", args.timeout)
                       for _ in range(args.runs)]
        else:
            samples = [start_once(args.nodes, cwd, args.timeout) for _ in range(args.runs)]
        med = {k: round(statistics.median([s[k] for s in samples if k in s]), 3)
               for k in PHASES if any(k in s for s in samples)}
        row = {"code": code, "nodes": args.nodes, "runs": args.runs,
               "loadavg": round(os.getloadavg()[0], 2), "median_s_from_launch": med,
               "seen_s": [round(s["seen"], 3) for s in samples],
               "cpu_s_to_leader": round(statistics.median(s["cpu"] for s in samples), 2)}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{code}: load {row['loadavg']}; to leader (seen) {med['seen']:.3f} s "
                  f"(runs: {', '.join(f'{x:.2f}' for x in row['seen_s'])}); CPU of the group "
                  f"until then {row['cpu_s_to_leader']:.2f} s", flush=True)
            prev = 0.0
            for k in PHASES:
                if k in med:
                    print(f"  {k:14s} at {med[k]:.3f} s  (+{med[k] - prev:.3f})")
                    prev = med[k]
    return 0


if __name__ == "__main__":
    sys.exit(main())
