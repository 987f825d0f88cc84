"""Run the deterministic group simulator over many seeds (docs/testing.md).

    python -m tools.simulate --seeds 1000 [--first 0] [--nodes 3|5] [--store memory|segment]
                             [--faults drop,delay,dup,reorder,partition,crash,role-crash,truncate,clock]
                             [--steps 2500] [--jobs 2] [--mutate NAME] [--sessions]
                             [--state-machine [kv|chain]] [--no-installs]
    python -m tools.simulate --seed 1234 ...        # replay one seed, print its trace

Every seed runs a whole group (the real role classes, one process, virtual time) through a
fault phase of `--steps` scheduler steps, then heals everything and requires convergence. A
failing seed prints the invariant that broke and the last events before it; `--seed S` with
the same options replays it exactly. Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

from tools.sim.world import ALL_FAULTS, OPT_IN_FAULTS, Result, SimConfig, _tmp_root, run_seed


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run (from --first)")
    ap.add_argument("--first", type=int, default=0, help="first seed of the range")
    ap.add_argument("--seed", type=int, default=None, help="run only this seed and print its trace")
    ap.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    ap.add_argument("--faults", default=",".join(ALL_FAULTS),
                    help=f"comma-separated subset of {','.join(ALL_FAULTS)} (or 'none'), plus the opt-in "
                         f"{','.join(OPT_IN_FAULTS)} (the session faults turn --sessions on)")
    ap.add_argument("--steps", type=int, default=SimConfig.steps, help="scheduler steps of the fault phase")
    ap.add_argument("--store", choices=("memory", "segment"), default="memory")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--mutate", default="", help="apply known-bad mutations (tools/sim/mutations.py)")
    ap.add_argument("--trace-len", type=int, default=60, help="events shown before a failure")
    ap.add_argument("--keep-going", action="store_true", help="run every seed even after a failure")
    ap.add_argument("--sessions", action="store_true",
                    help="about half the writers use client sessions: stamped appends resent after "
                         "timeouts and failures, deduplicated by the leader")
    ap.add_argument("--state-machine", nargs="?", const="kv", default="", choices=("kv", "chain"),
                    help="every node runs the applier with this state machine (kv if none named), "
                         "snapshots and (segment store) retention; its state is checked against the "
                         "committed history after every step")
    ap.add_argument("--no-installs", action="store_true",
                    help="with --state-machine --store segment: retention only deletes what every "
                         "replica committed, so no follower ever needs an install (the simulator "
                         "before install snapshot; replays older seeds)")
    a = ap.parse_args(argv)
    faults = [] if a.faults in ("", "none") else [f.strip() for f in a.faults.split(",") if f.strip()]
    bad = [f for f in faults if f not in ALL_FAULTS + OPT_IN_FAULTS]
    if bad:
        ap.error(f"unknown fault(s) {bad}; known: {', '.join(ALL_FAULTS)}")
    a.fault_list = tuple(faults)
    return a


def _config(a: argparse.Namespace, seed: int) -> SimConfig:
    return SimConfig(seed=seed, nodes=a.nodes, faults=a.fault_list, steps=a.steps, store=a.store,
                     trace_len=a.trace_len, sessions=a.sessions, state_machine=a.state_machine,
                     installs=not a.no_installs, tmp_root=getattr(a, "tmp_root", None))


# Counters summed over a run's seeds and printed with its summary line (when non-zero): what
# shows that a run exercised installs (tools/sim/world.py, actors.py, smcheck.py count them).
SUMMARY_STATS = ("installs_started", "installs_completed", "installs_abandoned", "install_probes_sent",
                 "install_chunks_sent", "install_rewinds", "install_resumes", "install_chunks_corrupted",
                 "install_checksum_refusals", "applier_installs", "install_resets", "install_faults",
                 "lagging_install_shapes", "retention_deletions", "definite_failures", "handler_restarts",
                 "disk_probe_full", "figure8_shapes", "bad_client_dup", "bad_client_seq0", "bad_client_straddle", "bad_client_stale",
                 "membership_faults", "membership_success", "configurations_committed", "rot", "rot_repaired",
                 "lost_disks", "lost_disks_caught_up")


def _chunk(job: tuple[argparse.Namespace, int, int]) -> tuple[int, list[Result], float, Counter]:
    """Worker: run seeds [lo, hi); return how many ran, the failures, the time taken and the
    summed SUMMARY_STATS (plus `seeds_with_installs`)."""
    from tools.sim import mutations

    a, lo, hi = job
    fails: list[Result] = []
    t0 = time.perf_counter()
    ran = 0
    stats: Counter = Counter()
    with mutations.apply(a.mutate):
        for seed in range(lo, hi):
            r = run_seed(_config(a, seed))
            ran += 1
            stats.update({k: r.stats[k] for k in SUMMARY_STATS if r.stats.get(k)})
            stats["seeds_with_installs"] += bool(r.stats.get("installs_completed"))
            if not r.ok:
                fails.append(r)
                if not a.keep_going:
                    break
    return ran, fails, time.perf_counter() - t0, stats


def _report(r: Result, a: argparse.Namespace) -> None:
    print(f"\nFAILED seed {r.seed} after {r.steps} steps, {r.virtual_ms} virtual ms: {r.error}")
    print(f"--- last events (time ms, actor, event) ---\n{r.trace}\n---")
    opts = [f"--seed {r.seed}", f"--nodes {a.nodes}", f"--store {a.store}", f"--steps {a.steps}"]
    if a.fault_list != ALL_FAULTS:
        opts.append(f"--faults {','.join(a.fault_list) or 'none'}")
    if a.mutate:
        opts.append(f"--mutate {a.mutate}")
    if a.sessions:
        opts.append("--sessions")
    if a.state_machine:
        opts.append(f"--state-machine {a.state_machine}")
    if a.no_installs:
        opts.append("--no-installs")
    print(f"replay: python -m tools.simulate {' '.join(opts)}")


def _fmt_stats(stats: Counter) -> str:
    shown = [f"{k} {stats[k]}" for k in ("seeds_with_installs", *SUMMARY_STATS) if stats.get(k)]
    return f"\n  {', '.join(shown)}" if shown else ""


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # str hashes are salted per process; pin them so a seed replays in any process
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tools.simulate",
                                  *(sys.argv[1:] if argv is None else argv)])
    a = _parse(argv)
    # Every seed of this run makes its stores under one directory of the run's own, removed at
    # the end: workers stopped by `terminate()` (the first failure ends the run) cannot remove
    # the seed they were in, and matching leftovers by name and time would also take the
    # directories of another run going on beside this one.
    a.tmp_root = tempfile.mkdtemp(prefix=f"dlsim-run{os.getpid()}-", dir=_tmp_root())
    try:
        return _run(a)
    finally:
        shutil.rmtree(a.tmp_root, ignore_errors=True)


def _run(a: argparse.Namespace) -> int:
    if a.seed is not None:
        a.trace_len = max(a.trace_len, 60)
        ran, fails, dt, stats = _chunk((a, a.seed, a.seed + 1))
        if fails:
            _report(fails[0], a)
            return 1
        print(f"seed {a.seed}: ok ({dt * 1000:.0f} ms){_fmt_stats(stats)}")
        return 0
    lo, hi = a.first, a.first + a.seeds
    t0 = time.perf_counter()
    if a.jobs <= 1:
        ran, fails, _dt, stats = _chunk((a, lo, hi))
    else:
        size = max(1, min(500, (hi - lo) // (a.jobs * 4) or 1))
        jobs = [(a, s, min(s + size, hi)) for s in range(lo, hi, size)]
        ran, fails, stats = 0, [], Counter()
        with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
            for n, f, _dt, st in pool.imap(_chunk, jobs):
                ran += n
                fails += f
                stats.update(st)
                if fails and not a.keep_going:
                    pool.terminate()
                    break
    dt = time.perf_counter() - t0
    for r in sorted(fails, key=lambda r: r.seed)[:3]:
        _report(r, a)
    print(f"{ran} seeds ({a.nodes} nodes, {a.store} store, faults={','.join(a.fault_list) or 'none'}"
          f"{', state machine ' + a.state_machine if a.state_machine else ''}"
          f"{', mutate=' + a.mutate if a.mutate else ''}): {len(fails)} failed; {dt:.1f} s, "
          f"{dt / max(ran, 1) * 1000:.1f} ms/seed with {a.jobs} job(s){_fmt_stats(stats)}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
