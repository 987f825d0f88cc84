"""One chaos run, start to verdict: a local group, writers and readers on it, a seeded fault
at a time with its election time and write outage measured, then every replica's store
decoded and the recorded history checked (history.py).

Per fault:
- *election*: if the fault took the leader out, the time from the fault to the moment the
  other nodes agree on a leader in a higher term (polled every 10 ms); "unchanged" if the
  leader kept its term.
- *write outage*: the longest stretch, from the fault to the group's recovery, with no
  acknowledged append from any writer (the first stretch starts at the fault).
- *recovered*: the fault has been healed, every node answers and agrees on one leader, and the
  writers have had appends acknowledged since. A group that does not recover within
  `recovery_timeout` is a violation (liveness): the run stops there and is judged.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from node.store.decoder import StoreDecoder
from tools.chaos.faults import ROLES, Fault, Injector, Schedule, enter_private_network, node_hosts
from tools.chaos.history import History, LogEntry, Replica, Verdict, check
from tools.chaos.workload import Clock, LeaderMonitor, Reader, Writer, leader_claims_from_logs
from tools.local_group import LocalGroup


@dataclass
class Options:
    nodes: int = 3
    duration: float = 120.0  # seconds of faults (the run also has a start and a final check)
    max_faults: int | None = None  # stop after this many faults, whatever the duration
    faults_count: int | None = None  # inject exactly this many faults, however long: no duration limit
    appends_per_fault: int | None = None  # the load bound by counts (Writer.grant), None: unlimited
    faults: list[str] = field(default_factory=lambda: ["kill", "pause", "role-kill", "partition"])
    seed: int = 1
    sequential_writers: int = 1  # one append at a time each
    pipelined_writers: int = 1
    depth: int = 16  # appends in flight per pipelined writer
    readers: int = 1
    size: int = 64  # body bytes
    client_timeout: float = 10.0
    recovery_timeout: float = 30.0
    leader_share: float = 0.6  # the share of faults aimed at the leader
    max_duration: float = 2.5  # the longest a node stays down / paused / cut off
    min_gap: float = 1.0
    max_gap: float = 3.0
    server_args: list[str] = field(default_factory=list)
    keep: bool = False  # keep the stores and logs (their directory is reported)
    kv: bool = False  # a KV store group: KV clients instead of log writers, checked for linearizability
    compact: bool = False  # with kv: tiny data files, frequent snapshots, retention at once → installs
    kv_clients: int = 4
    kv_keys: int = 5


@dataclass
class FaultResult:
    number: int
    kind: str
    node: str
    was_leader: bool
    term_before: int
    started_s: float
    healed_s: float
    description: str
    detail: str = ""
    new_leader: str | None = None
    new_term: int | None = None
    election_s: float | None = None  # None: the leader kept its term
    write_outage_s: float | None = None
    recovered_s: float | None = None  # from the fault to recovery; None: never recovered

    def line(self) -> str:
        who = f"{self.node} ({'leader' if self.was_leader else 'follower'}, term {self.term_before})"
        desc = self.description.replace(self.node, who, 1)
        if self.election_s is not None:
            el = f"new leader {self.new_leader} (term {self.new_term}) after {self.election_s:.2f} s"
        else:
            el = "leader unchanged"
        wo = "n/a" if self.write_outage_s is None else f"{self.write_outage_s:.2f} s"
        rec = "NOT RECOVERED" if self.recovered_s is None else f"recovered after {self.recovered_s:.2f} s"
        return (f"[{self.started_s:7.1f} s] #{self.number} {desc}{' (' + self.detail + ')' if self.detail else ''}: "
                f"{el}; write outage {wo}; {rec}")


@dataclass
class Report:
    options: Options
    faults: list[FaultResult]
    verdict: Verdict
    notes: list[str]
    timeline: list[tuple[float, str | None, int]]
    ack_times: list[float]
    elapsed_s: float
    store_root: str | None

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            "ok": self.ok, "seed": o.seed, "nodes": o.nodes,
            "duration_s": None if o.faults_count else o.duration, "faults_count": o.faults_count,
            "appends_per_fault": o.appends_per_fault,
            "faults_requested": o.faults, "notes": self.notes, "elapsed_s": round(self.elapsed_s, 2),
            "faults": [vars(f) for f in self.faults],
            "violations": self.verdict.violations, "stats": self.verdict.stats,
            "leader_timeline": self.timeline, "store_root": self.store_root,
        }


class ChaosRun:
    def __init__(self, opts: Options, emit: Callable[[str], None] = print) -> None:
        self.o = opts
        self.emit = emit
        self.notes: list[str] = []
        self.violations: list[str] = []
        self.clock = Clock()
        self.history = History()
        self.converged_at: int | None = None  # the committed index every node agreed on at the end

    # ------------------------------------------------------------------ setup
    def _group(self, root: Path) -> LocalGroup:
        kinds = list(self.o.faults)
        hosts = None
        extra = list(self.o.server_args)
        if "partition" in kinds:
            why = enter_private_network()
            if why is None:
                hosts = node_hosts(self.o.nodes)
                extra += ["--connect-from-own-host", "true"]
            else:
                kinds.remove("partition")
                self.notes.append(f"partition skipped: {why}")
        if not kinds:
            raise ValueError("no fault kind left to inject")
        self.kinds = kinds
        if self.o.kv:
            extra += ["--state-machine", "kv", "--snapshot-threshold", "300" if self.o.compact else "2000"]
        if self.o.compact:
            # 64 KiB data files and retention that deletes whatever a snapshot covers at once: a
            # follower killed or paused for a second is soon behind the leader's log begin and
            # is sent a snapshot (docs/snapshots.md "Install, end to end"), under the same faults
            # and checks.
            extra += ["--file-reserved-hours", "0", "--disk-space-ratio-to-clean", "0.0001",
                      "--max-body-size", str(4 << 10)]
        files = ["--data-file-size", str(64 << 10)] if self.o.compact else ["--data-file-size", str(64 << 20)]
        # Small segment files: a chaos run writes little and should not reserve gigabytes.
        return LocalGroup(self.o.nodes, [*files, "--index-file-size", str(8 << 20), *extra],
                          root=str(root), hosts=hosts)

    def run(self) -> Report:
        o = self.o
        root = Path(tempfile.mkdtemp(prefix="dledger-chaos-"))
        g = self._group(root)
        sched = Schedule(o.seed, self.kinds, leader_share=o.leader_share, max_duration=o.max_duration,
                         min_gap=o.min_gap, max_gap=o.max_gap,
                         roles=(*ROLES, "applier") if o.kv else ROLES)
        inj = Injector(g)
        writers: list[Writer] = []
        readers: list[Reader] = []
        monitor = LeaderMonitor(g, self.history, self.clock)
        results: list[FaultResult] = []
        replicas: dict[str, Replica] = {}
        try:
            g.start()
            g.wait_leader(timeout=60)
            if o.kv:
                from tools.chaos.kv_workload import KVWorker
                writers = [KVWorker(f"c{i}", g.peers, g.group, self.clock, seed=o.seed * 1000 + 100 + i,
                                    keys=o.kv_keys, timeout=o.client_timeout) for i in range(o.kv_clients)]
            for i in range(0 if o.kv else o.sequential_writers + o.pipelined_writers):
                depth = 1 if i < o.sequential_writers else o.depth
                writers.append(Writer(f"w{i}", g.peers, g.group, self.history, self.clock,
                                      depth=depth, size=o.size, timeout=o.client_timeout))
            readers = [Reader(f"r{i}", g.peers, g.group, self.history, self.clock, seed=o.seed * 1000 + i,
                              timeout=o.client_timeout) for i in range(o.readers)]
            monitor.start()
            self._grant(writers)
            for t in (*writers, *readers):
                t.start()
            if not self._wait_acks(writers, self.clock.now(), o.recovery_timeout):
                self.violations.append("liveness: no append was acknowledged within "
                                       f"{o.recovery_timeout:.0f} s of the start")
            end = self.clock.now() + o.duration
            limit = o.faults_count if o.faults_count is not None else o.max_faults
            while not self.violations and (limit is None or len(results) < limit):
                fault = sched.next()
                if o.faults_count is None and self.clock.now() + fault.gap + fault.duration > end:
                    break
                time.sleep(fault.gap)
                if not self._loaded(writers):
                    break
                res = self._one(g, inj, writers, fault)
                results.append(res)
                self.emit(res.line())
                if res.recovered_s is None:
                    self.violations.append(f"liveness: the group did not recover within "
                                           f"{o.recovery_timeout:.0f} s of fault #{res.number} "
                                           f"({res.description}); logs in {root}")
                    o.keep = True
            inj.heal_all()
            if not self.violations:
                self._drained(writers)
            for w in writers:
                w.stop()  # all at once: each drains its appends in flight
            for w in writers:
                w.close()
            for r in readers:
                r.close()
            monitor.close()
            if not self.violations:
                self._wait_converged(g, o.recovery_timeout)
        finally:
            inj.heal_all()
            for w in writers:
                w.close()
            for r in readers:
                r.close()
            monitor.close()
            g.close()  # SIGTERM: a clean stop writes each node's checkpoint
            _remove_segments(g)
        try:
            replicas = {nid: read_replica(root / nid, self.converged_at) for nid in g.ids}
            claims = leader_claims_from_logs(root, g.ids)
            verdict = check(self.history, replicas, claims, bodies_are_ours=not o.kv)
            if o.kv:
                self._check_linearizable(writers, verdict)
            verdict.stats["installs"] = sum((root / f"{nid}.log").read_text(errors="replace").count(
                "installed the leader's snapshot") for nid in g.ids if (root / f"{nid}.log").exists())
        finally:
            if not (o.keep or self.violations):
                shutil.rmtree(root, ignore_errors=True)
        verdict.violations[:0] = self.violations
        if not verdict.ok:
            o.keep = True
        acks = sorted(t for w in writers for t in w.ack_times)
        return Report(o, results, verdict, self.notes, monitor.timeline, acks, self.clock.now(),
                      str(root) if (o.keep or not verdict.ok) else None)

    def _check_linearizable(self, workers: list, verdict: Verdict) -> None:
        """The KV clients' recorded operations against a register per key
        (tools/chaos/linearizability.py); a key it cannot decide within the budget is a
        violation too (never a pass)."""
        from tools.chaos.linearizability import check_history

        ops = [op for w in workers for op in w.ops]
        res = check_history(ops, timeout=300)
        st = res.stats()
        verdict.stats.update(kv_operations=len(ops), kv_indeterminate=st["indeterminate"],
                             kv_keys_checked=st["keys"], kv_states_searched=st["states"])
        if not res.ok:
            verdict.violations += res.lines()
            verdict.stats["violations"] = verdict.stats.get("violations", 0) + max(
                1, st["keys_failed"] + st["keys_unknown"] + st["revision_violations"])

    # ------------------------------------------------------------------ one fault
    def _one(self, g: LocalGroup, inj: Injector, writers: list[Writer], fault: Fault) -> FaultResult:
        lead, term = self._agreed(g, self.o.recovery_timeout) or (None, -1)
        followers = [x for x in g.ids if x != lead]
        node = lead if (fault.on_leader and lead) else followers[int(fault.pick * len(followers))]
        was_leader = node == lead
        others = [x for x in g.ids if x != node]
        t0 = self.clock.now()
        detail = inj.start(fault, node)
        res = FaultResult(fault.number, fault.kind, node, was_leader, term, t0, t0,
                          fault.describe(node), detail)
        heal_at = t0 + fault.duration
        while self.clock.now() < heal_at:
            self._note_election(g, others, term, t0, res)
            time.sleep(0.01)
        inj.heal(fault, node)
        res.healed_s = self.clock.now()
        self._grant(writers)  # recovery is judged on appends acknowledged after the heal
        deadline = res.healed_s + self.o.recovery_timeout
        while self.clock.now() < deadline:
            self._note_election(g, others, term, t0, res)
            if g.leader() and self._wait_acks(writers, res.healed_s, 0):
                res.recovered_s = self.clock.now() - t0
                break
            time.sleep(0.01)
        t1 = self.clock.now()
        acks = sorted(t for w in writers for t in w.acks_between(t0, t1))
        edges = [t0, *acks, t1]
        res.write_outage_s = max(b - a for a, b in pairwise(edges))
        return res

    def _note_election(self, g: LocalGroup, among: list[str], term: int, t0: float, res: FaultResult) -> None:
        if res.election_s is not None or term < 0:
            return
        got = g.leader(among)
        if got and got[1] > term:
            res.election_s = self.clock.now() - t0
            res.new_leader, res.new_term = got

    # ------------------------------------------------------------------ the load, by counts
    def _grant(self, writers: list) -> None:
        """--appends-per-fault: allow each log writer N more appends (nothing when unbounded)."""
        if self.o.appends_per_fault and not self.o.kv:  # KV clients are not bounded by counts
            for w in writers:
                w.grant(self.o.appends_per_fault)

    def _loaded(self, writers: list) -> bool:
        """--appends-per-fault: grant each writer N appends and wait until half of them have
        completed, so the fault hits writers with appends in flight and about N/2 to go, on a
        fast machine or a slow one. False (a liveness violation recorded) if they do not
        complete within the recovery timeout."""
        n = self.o.appends_per_fault
        if not n or self.o.kv:
            return True
        self._grant(writers)
        deadline = time.monotonic() + self.o.recovery_timeout
        while not all(w.completed >= w.granted - n // 2 for w in writers):
            if time.monotonic() >= deadline:
                self.violations.append(f"liveness: the writers did not complete {n // 2} of the {n} appends "
                                       f"granted before a fault within {self.o.recovery_timeout:.0f} s")
                return False
            time.sleep(0.005)
        return True

    def _drained(self, writers: list) -> None:
        """--appends-per-fault: let every writer complete all it was granted before the run
        stops them, so a run invokes exactly N x writers x (1 + 2 x faults) appends."""
        if not self.o.appends_per_fault or self.o.kv:
            return
        deadline = time.monotonic() + self.o.recovery_timeout
        while not all(w.completed >= w.granted for w in writers):
            if time.monotonic() >= deadline:
                self.violations.append("liveness: the writers did not complete the appends granted after "
                                       f"the last fault within {self.o.recovery_timeout:.0f} s")
                return
            time.sleep(0.005)

    # ------------------------------------------------------------------ waiting
    def _agreed(self, g: LocalGroup, timeout: float) -> tuple[str, int] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = g.leader()
            if got:
                return got
            time.sleep(0.01)
        return None

    def _wait_acks(self, writers: list[Writer], since: float, timeout: float) -> bool:
        """True once every writer has had an append acknowledged after `since`."""
        deadline = time.monotonic() + timeout
        while True:
            if all(w.acks_between(since, float("inf")) for w in writers):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _wait_converged(self, g: LocalGroup, timeout: float) -> None:
        """Every node has committed everything the leader holds (so the stores compare)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [g.meta(x) for x in g.ids]
            if all(views):
                ends = {v.ledger_end_index for v in views} | {v.committed_index for v in views}
                if len(ends) == 1:
                    self.converged_at = ends.pop()
                    return
            time.sleep(0.05)
        self.violations.append(f"liveness: the replicas did not converge within {timeout:.0f} s "
                               "after the last fault")


def read_replica(store_dir: Path, converged_at: int | None = None) -> Replica:
    """A stopped node's store, decoded read-only (damage shows as crc_ok False). Its committed
    index is the checkpoint's, or `converged_at` when every node reported that index as
    committed (and as its end) before the stop: the checkpoint is written on a timer and may
    lag."""
    with StoreDecoder(store_dir) as d:
        entries = [LogEntry(e.index, e.term if e.term is not None else -1, e.type or "?",
                            e.body or b"", bool(e.crc_ok))
                   for e in d.iter_entries()]
        committed = max(d.committed_index, converged_at if converged_at is not None else -1)
        return Replica(store_dir.name, committed, entries)


def _remove_segments(g: LocalGroup) -> None:
    """A node SIGKILLed at the very end leaves its shared-memory segment; names are
    deterministic, so remove ours."""
    from node.block.shared_state import segment_name
    for x in g.ids:
        Path("/dev/shm", segment_name(g.group, x, g.root / x)).unlink(missing_ok=True)
