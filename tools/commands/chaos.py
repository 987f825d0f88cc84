"""Seeded fault injection against a local group, judged by a check of the recorded history.

Starts N `dledger server` processes on loopback, runs writers (one appending one at a time,
one pipelining; client sessions on) and a reader, and injects faults one at a time from a
schedule drawn from --seed: kill (SIGKILL a node, restart it later), pause (SIGSTOP/SIGCONT
a node), role-kill (SIGKILL one role process), partition (cut a node off from the others, or
from everyone; needs root: the run moves into a private network namespace; skipped with a
note otherwise). One line per fault: its kind and target, the election it caused, the write
outage and the time to recover. Then every replica's store is decoded and the history
checked: nothing acknowledged lost, nothing committed twice, identical committed prefixes,
each writer's entries in its order, nothing committed that nobody wrote, reads only of
committed entries, at most one leader per term. Exit 0 only if all of it held; exit 1 with
the seed to replay (stores and logs are kept) otherwise. docs/chaos.md has the details.

Examples:
  dledger chaos --local 3 --duration 120 --seed 7
  dledger chaos --local 3 --duration 60 --faults kill,pause --json
  dledger chaos --local 3 --faults kill --faults-count 100 --leader-share 1 --plot chaos.png
  dledger chaos --local 3 --faults-count 10 --appends-per-fault 1000 --seed 11
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import sys

from tools.cli import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", type=int, required=True, metavar="N", help="nodes in the local group (>= 3)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="seconds of fault injection (default: 120; not with --faults-count)")
    p.add_argument("--faults", default="kill,pause,role-kill,partition", metavar="LIST",
                   help="comma-separated kinds: kill, pause, role-kill, partition (default: all)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="schedule seed (default: random, printed so the run can be replayed)")
    p.add_argument("--max-faults", type=int, default=None, metavar="N",
                   help="stop after N faults even if --duration is not over (default: no limit)")
    p.add_argument("--faults-count", type=int, default=None, metavar="N",
                   help="inject exactly N faults, however long they take: the run is bounded by the count, "
                        "not by time, so it does the same on a slow machine (not with --duration or "
                        "--max-faults; default: run for --duration)")
    p.add_argument("--appends-per-fault", type=int, default=None, metavar="N",
                   help="bound the load by counts: each writer may append N before each fault (which starts "
                        "once half of them completed, so it hits appends in flight) and N more once the fault "
                        "is healed, then waits; about 2N per writer per fault on any machine (not with --kv; "
                        "default: no limit, writers append as fast as the group takes them)")
    p.add_argument("--leader-share", type=float, default=0.6, metavar="P",
                   help="share of faults aimed at the leader, 0..1 (default: 0.6)")
    p.add_argument("--max-fault-seconds", type=float, default=2.5, metavar="S",
                   help="longest a node stays down, paused or cut off (default: 2.5)")
    p.add_argument("--gap", default="1,3", metavar="MIN,MAX",
                   help="quiet seconds between faults, drawn in [MIN, MAX] (default: 1,3)")
    p.add_argument("--writers", type=int, default=1, metavar="N",
                   help="writers appending one at a time (default: 1)")
    p.add_argument("--pipelined-writers", type=int, default=1, metavar="N",
                   help="writers keeping --depth appends in flight (default: 1)")
    p.add_argument("--depth", type=int, default=16, metavar="N",
                   help="appends in flight per pipelined writer (default: 16)")
    p.add_argument("--readers", type=int, default=1, metavar="N", help="readers (default: 1)")
    p.add_argument("--size", type=int, default=64, metavar="BYTES", help="body size (default: 64)")
    p.add_argument("--kv", action="store_true",
                   help="run the group as a KV store (--state-machine kv) with KV clients doing put/get/"
                        "cas/delete, and check the recorded history for linearizability")
    p.add_argument("--compact", action="store_true",
                   help="with --kv: 64 KiB data files, a snapshot every 300 entries and retention at once, "
                        "so faulted followers fall behind the leader's log and are sent snapshots")
    p.add_argument("--kv-clients", type=int, default=4, metavar="N", help="KV clients with --kv (default: 4)")
    p.add_argument("--kv-keys", type=int, default=5, metavar="N", help="keys they share with --kv (default: 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--plot", metavar="FILE.png", help="draw throughput and fault windows over time (default: no plot)")
    p.add_argument("--keep", action="store_true", help="keep the stores and logs even if the run passes")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra `dledger server` option, e.g. --server-arg=--heartbeat-interval-ms=50 "
                        "(repeatable; default: none)")


def _options(args: argparse.Namespace):  # noqa: ANN202 - run.Options, imported lazily
    from tools.chaos.faults import KINDS
    from tools.chaos.run import Options

    if args.local < 3:
        raise CliError("--local: a chaos run needs at least 3 nodes (a group that survives one fault)", 2)
    if args.faults_count is not None:
        if args.faults_count < 1:
            raise CliError("--faults-count: must be >= 1", 2)
        if args.duration is not None or args.max_faults is not None:
            raise CliError("--faults-count: the run is bounded by the count; drop --duration/--max-faults", 2)
    duration = 120.0 if args.duration is None else args.duration
    if duration <= 0:
        raise CliError("--duration: must be > 0 seconds", 2)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise CliError(f"--faults: unknown kind(s) {', '.join(bad) or '(none given)'}; "
                       f"choose from {', '.join(KINDS)}", 2)
    if args.max_faults is not None and args.max_faults < 1:
        raise CliError("--max-faults: must be >= 1", 2)
    if not 0 <= args.leader_share <= 1:
        raise CliError("--leader-share: must be in [0, 1]", 2)
    if not 0.05 <= args.max_fault_seconds <= 60:
        raise CliError("--max-fault-seconds: must be in [0.05, 60]", 2)
    try:
        lo, hi = (float(x) for x in args.gap.split(","))
    except ValueError:
        raise CliError("--gap: expected MIN,MAX in seconds, e.g. 1,3", 2) from None
    if not 0 <= lo <= hi:
        raise CliError("--gap: need 0 <= MIN <= MAX", 2)
    for name in ("writers", "pipelined_writers", "readers"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')}: must be >= 0", 2)
    if args.writers + args.pipelined_writers < 1:
        raise CliError("--writers/--pipelined-writers: at least one writer is needed", 2)
    if args.depth < 1 or args.size < 24:
        raise CliError("--depth must be >= 1 and --size >= 24 bytes", 2)
    if args.kv and (args.kv_clients < 1 or args.kv_keys < 1):
        raise CliError("--kv-clients and --kv-keys must be >= 1", 2)
    if args.appends_per_fault is not None and (args.appends_per_fault < 2 or args.kv):
        raise CliError("--appends-per-fault: must be >= 2, and applies to log writers (not --kv)", 2)
    if args.compact and not args.kv:
        raise CliError("--compact needs --kv: without a state machine there is no snapshot to install", 2)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big") % 1_000_000
    return Options(nodes=args.local, duration=duration, max_faults=args.max_faults, faults=kinds,
                   faults_count=args.faults_count, appends_per_fault=args.appends_per_fault,
                   seed=seed, sequential_writers=args.writers, pipelined_writers=args.pipelined_writers,
                   depth=args.depth, readers=args.readers, size=args.size, leader_share=args.leader_share,
                   max_duration=min(args.max_fault_seconds, 60), min_gap=lo, max_gap=hi,
                   server_args=list(args.server_arg), keep=args.keep, kv=args.kv,
                   kv_clients=args.kv_clients, kv_keys=args.kv_keys, compact=args.compact)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    from tools.chaos.run import ChaosRun

    opts = _options(args)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'dledger[bench]'") from None
    signal.signal(signal.SIGTERM, _exit_on_signal)  # the run's finally stops every node
    emit = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    span = f"{opts.faults_count} faults" if opts.faults_count else f"{opts.duration:g} s of faults"
    emit(f"dledger chaos: {opts.nodes} nodes, {span} ({', '.join(opts.faults)}), seed {opts.seed}")
    report = ChaosRun(opts, emit).run()
    if args.plot:
        from tools.chaos.plot import draw
        draw(report, args.plot)
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        for note in report.notes:
            print(f"note: {note}")
        print(summary(report, args))
    return 0 if report.ok else 1


def replay_command(argv: list[str], seed: int) -> str:
    """The command line that replays this run's schedule: the same options, this seed."""
    out, skip = ["dledger"], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--seed":
            skip = True
            continue
        if not a.startswith("--seed="):
            out.append(a)
    return shlex.join([*out, "--seed", str(seed)])


def summary(report, args: argparse.Namespace) -> str:  # noqa: ANN001 - run.Report
    s = report.verdict.stats
    els = [f.election_s for f in report.faults if f.election_s is not None]
    outs = [f.write_outage_s for f in report.faults if f.write_outage_s is not None]
    lines = []
    if els:
        lines.append(f"elections: {len(els)}, p50 {statistics.median(els):.2f} s, max {max(els):.2f} s")
    if outs:
        lines.append(f"write outage per fault: p50 {statistics.median(outs):.2f} s, max {max(outs):.2f} s")
    if report.options.kv:
        facts = (f"{len(report.faults)} faults; {s.get('kv_operations', 0):,} KV operations "
                 f"({s.get('kv_indeterminate', 0)} indeterminate) on {s.get('kv_keys_checked', 0)} keys; "
                 f"committed log up to index {s['committed_end']:,} on {report.options.nodes} replicas; "
                 f"{s['terms_with_leader']} terms with a leader"
                 + (f"; {s.get('installs', 0)} snapshot installs" if report.options.compact else ""))
        promise = "linearizable, identical committed prefixes, one leader per term"
    else:
        facts = (f"{len(report.faults)} faults; {s['acknowledged']:,} appends acknowledged, "
                 f"{s['indeterminate']} indeterminate ({s['indeterminate_committed']} of them committed), "
                 f"{s['failed_definitely']} failed; committed log up to index {s['committed_end']:,} on "
                 f"{report.options.nodes} replicas; {s['reads']:,} entries read; "
                 f"{s['terms_with_leader']} terms with a leader")
        promise = ("no acknowledged append lost, none committed twice, identical committed prefixes, "
                   "every writer's order kept, one leader per term")
    if report.ok:
        lines.append(f"verdict: OK: {facts}; {promise}")
    else:
        lines.append(f"verdict: FAILED: {len(report.verdict.violations)} violation line(s); {facts}")
        lines += [f"  {v}" for v in report.verdict.violations]
        lines.append(f"replay: {replay_command(sys.argv[1:], report.options.seed)}")
        if report.store_root:
            lines.append(f"stores and logs kept in {report.store_root}")
    return "\n".join(lines)
