"""The deterministic cluster simulator: scheduler, network, faults, clients and invariants.

One `Sim` is one seed: a whole cluster of nodes, each node a set of actors (elector, handler,
one dispatcher per peer, ack checker) running the real role classes (tools/sim/actors.py),
plus client writers, all in one process on virtual time. Every random choice comes from one
`random.Random(seed)`; nothing reads the wall clock, iterates a set, or depends on `id()`, so
a seed replays exactly (`python -m tools.simulate --seed S`).

Scheduling. Virtual time only moves when no actor can run. At each instant the scheduler
picks a random ready actor (one with inbox items or a due timer) and runs one step of it. Any
read of the shared block is a preemption point (tools/sim/state.py): the scheduler may run
other ready actors' steps nested there, respecting the member lock.

The parts live beside this module: config.py (options, the node model), scheduler.py,
network.py, faults.py, invariants.py, trace.py and clients.py; `Sim` composes them.

See docs/testing.md for the fault model, the invariants and how to read a trace.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from node.block.memory_state import MemoryState
from node.core.slots import SlotOwner, bootstrap_slots, plan_dispatchers, release
from node.wiring.slot_file import SlotFile
from tools.sim import actors as A
from tools.sim import slot_stamps
from tools.sim.clients import BadWriterActor, ClientActor, ReaderActor, Writer, definite_failure
from tools.sim.config import (
    ALL_FAULTS,
    CLIENT,
    FAILOVER_MS,
    OPT_IN_FAULTS,
    RETENTION_RATIO,
    SESSION_FAULTS,
    TRACE_LEN,
    Node,
    SimConfig,
    Violation,
    _SimNodeConfig,
)
from tools.sim.faults import FaultsMixin
from tools.sim.invariants import InvariantsMixin
from tools.sim.membership import MembershipMixin, Shape2015Mixin
from tools.sim.network import NetworkMixin
from tools.sim.scheduler import SchedulerMixin
from tools.sim.state import NodeBlock, SimLock
from tools.sim.trace import TraceMixin, capture_logs

__all__ = ["ALL_FAULTS", "CLIENT", "FAILOVER_MS", "OPT_IN_FAULTS", "RETENTION_RATIO", "SESSION_FAULTS", "TRACE_LEN",
           "BadWriterActor", "ClientActor", "Node", "ReaderActor", "Result", "Sim", "SimConfig", "Violation",
           "Writer", "definite_failure", "run_seed"]


class Sim(SchedulerMixin, NetworkMixin, FaultsMixin, MembershipMixin, Shape2015Mixin, InvariantsMixin, TraceMixin):
    """One seed: the cluster, its clients and the random source every choice draws from."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.faults = set(cfg.faults)
        self.store_kind = cfg.store
        self.group = "g"
        self.now = 0
        self.steps = 0
        self._inc = 0
        self._seq = 0
        self.heap: list = []
        self.stack: list[A.Actor] = []
        self.trace: collections.deque = collections.deque(maxlen=cfg.trace_len)
        self.hash = hashlib.sha256() if cfg.hash_trace else None
        self.events = 0
        self.writing = True
        self.faulting = True
        self.blocked: set[tuple[int, int]] = set()
        self.fifo: dict[tuple[str, str], int] = {}
        self.leaders: dict[int, str] = {}
        self.led: set[tuple[str, int]] = set()  # (node, term) leaderships
        self.chist: list[tuple[int, int, bytes]] = []  # committed history: (term, magic, body)
        self.chist_where: dict[bytes, int] = {}
        self.served_ahead: list[tuple[str, int, tuple[int, int, bytes]]] = []  # reads past the history
        self.acked: dict[int, tuple[bytes, int]] = {}  # index -> (body, term) acknowledged
        self.acked_max = -1
        self.last_ack_at = -1
        self.sent: dict[bytes, tuple[int, int]] = {}
        self.stats = collections.Counter()
        self.rot_pending: tuple[Node, int] | None = None  # fault rot: the node damaged, the entry
        self.lost_disk_pending: Node | None = None  # fault lost-disk: the node whose disk was lost
        self._tmp = tempfile.mkdtemp(prefix=f"dlsim-{cfg.seed}-", dir=cfg.tmp_root or _tmp_root())
        # network conditions for this seed
        r = self.rng
        self.p_drop = r.uniform(0.0, 0.08) if "drop" in self.faults else 0.0
        self.p_dup = r.uniform(0.0, 0.05) if "dup" in self.faults else 0.0
        self.p_reorder = r.uniform(0.0, 0.1) if "reorder" in self.faults else 0.0
        self.p_spike = r.uniform(0.0, 0.05) if "delay" in self.faults else 0.0
        self.p_corrupt = r.uniform(0.0, 0.05) if "corrupt" in self.faults else 0.0
        self.p_eager_commit = r.uniform(0.05, 0.5) if "eager-commit" in self.faults else 0.0
        self.p_preempt = cfg.preempt
        self.p_midcrash = 0.002 if "role-crash" in self.faults else 0.0
        self.fault_every = (r.randint(100, 600), r.randint(600, 2500))
        self.next_fault = r.randint(*self.fault_every)
        self.quiet_until = 0
        self.m15: dict[str, Any] | None = None  # a 2015 shape in progress (tools/sim/membership.py)
        sm: dict[str, Any] = {}
        # client sessions: the session faults turn them on (and draw only when named)
        self.session_faults = [f for f in SESSION_FAULTS if f in self.faults]
        self.sessions = cfg.sessions or bool(self.session_faults)
        self.stamped: dict[tuple[bytes, int], tuple[int, int, list[bytes]]] = {}  # (ident, rid) -> stamp, bodies
        self.definite: dict[bytes, str] = {}  # body -> the definite failure a client reported for it
        self.stamp_where: dict[tuple[int, int], int] = {}  # (session, seq) -> committed index
        self.p_handler_restart = 0.0
        self.retention_on = False
        if "session-evict" in self.faults:  # tiny tables: sessions evicted, few seqs' indexes kept
            sm.update(max_sessions=r.choice((1, 2, 3)), session_window=r.choice((1, 2, 4, 16)))
        if "handler-restart" in self.faults:  # short rebuild scans: a restart forgets sessions
            sm.update(session_scan_entries=r.choice((1, 3, 8, 20, 100_000)))
            self.p_handler_restart = r.uniform(0.005, 0.05)
        if "retention" in self.faults and cfg.store == "segment":
            self.retention_on = True
            sm.setdefault("file_reserved_hours", 0)
        self.disk_ratio = 0.0  # what every handler's disk measurement says (retention, DISK_FULL)
        if cfg.state_machine:  # drawn only then: seeds without a state machine keep their histories
            from tools.sim.smcheck import SPECS
            sm = dict(state_machine=SPECS[cfg.state_machine], snapshot_threshold=r.choice((3, 8, 20, 50)),
                      max_snapshots_kept=r.choice((1, 2, 3)), file_reserved_hours=0)
            if cfg.store == "segment":  # retention deletes what snapshots and every replica allow
                self.disk_ratio = RETENTION_RATIO
        if self.retention_on:
            self.disk_ratio = RETENTION_RATIO
        self.f8: dict[str, Any] | None = None  # fault figure8: the shape in progress
        if "figure8" in self.faults:
            # one entry per push, one push in flight: a follower catches up entry by entry
            sm.update(enable_batch_push=False, max_pending_pushes=1)
        ids = [f"n{i}" for i in range(cfg.nodes)]
        peers = ";".join(f"{i}-127.0.0.1:{30000 + 2 * k}" for k, i in enumerate(ids))
        self.nodes: list[Node] = []
        for k, nid in enumerate(ids):
            d = f"{self._tmp}/{nid}"
            ncfg = _SimNodeConfig(id=nid, peers=peers, group=self.group, store_dir=d, run_dir=d,
                              data_file_size=4096, index_file_size=8 * 32, **sm)
            os.makedirs(d, exist_ok=True)
            self.nodes.append(Node(self, k, nid, ncfg, d))
        # Fault `join`: one more machine, outside every --peers, started with `server --join`;
        # the membership fault adds it (a learner), promotes it, removes it (tools/sim/membership.py),
        # and each node's supervisor, modelled by `follow_slots`, starts and stops its dispatchers.
        self.joins = "join" in self.faults
        if self.joins:
            k = len(ids)
            nid, d = f"n{k}", f"{self._tmp}/n{k}"
            ncfg = _SimNodeConfig(id=nid, join=peers, join_address=f"127.0.0.1:{30000 + 2 * k}",
                                  group=self.group, store_dir=d, run_dir=d, data_file_size=4096,
                                  index_file_size=8 * 32, **sm)
            os.makedirs(d, exist_ok=True)
            self.nodes.append(Node(self, k, nid, ncfg, d))
        self.by_id = {n.id: n for n in self.nodes}
        self.smc: Any = None
        # Install snapshot (smcheck.py): retention strands lagging followers, the leader sends
        # them its snapshot in chunks of a size drawn per seed (real snapshots here are a few
        # hundred bytes to a few KB: 1 MiB chunks would make every install one chunk).
        self.installs = bool(cfg.state_machine and cfg.store == "segment" and cfg.installs)
        self.install_cfg: Any = None
        self.p_install_fault = 0.0
        if self.installs:  # drawn only then: other seeds keep their histories
            from node.core.install import InstallConfig
            self.install_cfg = InstallConfig(chunk_bytes=r.choice((64, 200, 512, 1500)),
                                             window=r.choice((1, 2, 4)),
                                             chunk_timeout_ms=r.choice((300, 1000, 5000)))
            self.p_install_fault = r.uniform(0.01, 0.08)
            self.install_faults = [w for w, f in (
                ("follower-applier", "role-crash"), ("follower-handler", "role-crash"),
                ("leader-dispatcher", "role-crash"), ("follower-node", "crash"), ("leader-node", "crash"),
                ("pause-applier", "pause"), ("new-leader", "partition")) if f in self.faults]
            if not self.install_faults:
                self.p_install_fault = 0.0
        if cfg.state_machine:
            from tools.sim.smcheck import StateMachineChecks
            self.smc = StateMachineChecks(self, cfg.state_machine)
        self.repeats: collections.Counter = collections.Counter()  # bodies sent more than once (KV deletes)
        self.actors: list[A.Actor] = []
        self.actor_events = 0  # actors added or killed so far (Sim.follow_slots)
        self.slots: dict[str, int] = {}
        self._log_undo = capture_logs(self)
        slot_stamps.install()  # close() removes it: on a failure below too
        try:
            for n in self.nodes:
                self._start_node(n)
            for w in range(cfg.writers):
                self._add_actor(ClientActor(self, w))
            if "session-evict" in self.faults:  # more sessions than the table holds
                for w in range(cfg.writers, cfg.writers + 2):
                    self._add_actor(ClientActor(self, w))
            if "bad-client" in self.faults:
                self._add_actor(BadWriterActor(self, cfg.writers + 2))
            self._add_actor(ReaderActor(self))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ bookkeeping
    def disk_ratio_at(self, path: Any) -> float:
        """What a node's disk measurement reads (the handler measures its store directory):
        full while fault disk-probe holds it, else the seed's ratio (retention modelled or not)."""
        p = str(path)
        for n in self.nodes:
            if n.probe_full_until > self.now and (p == n.dir or p.startswith(n.dir + "/")):
                return 0.97
        return self.disk_ratio

    def wall_clock(self) -> float:
        """Every role's wall clock (`RoleContext.wall_clock`): the virtual time, in seconds since
        the epoch, so a snapshot's `created` (it travels in every install chunk's meta) is the
        same in every replay."""
        return self.now / 1000

    def retention_floor(self) -> int:
        """Fault retention without a state machine (no snapshot to install): the highest index
        retention may delete, one below what every replica has committed, so a lagging replica
        still finds every entry it needs in the leader's log. A node damaged by fault rot needs
        its damaged entry again (without snapshots a log retention deleted is gone for it: it
        would have to be re-seeded by hand, docs/operations.md)."""
        floor = min(n.max_committed for n in self.nodes) - 1
        if self.rot_pending is not None:
            floor = min(floor, self.rot_pending[1] - 1)
        return floor

    def _start_node(self, n: Node) -> None:
        # A new supervisor: none of the last life's roles is this one's (a dispatcher of a member
        # that joined and has another slot now stays gone, as a real restart leaves it).
        n.life += 1
        n.roles = {}
        n.block = NodeBlock(len(n.cfg.peer_ids), n.cfg.self_slot)
        n.lock = SimLock(self, n)
        n.up = True
        if self.joins:  # what the supervisor does at start: the bootstrap slot table on file
            table = bootstrap_slots(n.cfg.peer_map)
            n.slot_file = SlotFile(n.dir)
            n.slot_file.update(lambda _: table)
        self._add_actor(A.HandlerActor(self, n))
        self._add_actor(A.ElectorActor(self, n))
        for peer in n.cfg.peer_ids:
            if peer != n.id:
                self._add_actor(A.DispatcherActor(self, n, peer))
        self._add_actor(A.AckActor(self, n))
        if n.cfg.state_machine:
            self._add_actor(A.ApplierActor(self, n))

    def follow_slots(self) -> None:
        """Fault `join`: each up node's supervisor (node/roles/supervisor.py `_follow_slots`),
        by the same rules (`plan_dispatchers`): a dispatcher for every member its handler gave
        a slot, a spent guest slot freed, and a leaving slot whose removal committed released
        (its dispatcher stopped, its record reset, the table updated under the same rule: only
        if it is still leaving). Modelled more simply than the processes: a stopped dispatcher
        is gone at once, and a crashed one of a joined member is started again at the next step
        (the supervisor's backoff is not modelled). A pass runs only when one of its inputs
        moved (the plan is a pure function of them)."""
        for n in self.nodes:
            f = n.slot_file
            if not n.up or f is None:
                continue
            # Nothing the plan reads moved (the file, the commit, the leader slot, the set of
            # dispatchers: an actor added or killed anywhere bumps `actor_events`): skip the pass.
            key = (f._current_stamp(), n.block.ledger.committed_index, n.block.member.leader_slot,
                   self.actor_events)
            if key == n.slots_key:
                continue
            n.slots_key = key
            table = f.refresh()
            if table is None:
                continue
            alive = [a for a in n.roles.values() if a.role == "dispatcher" and a.alive]
            committed, leader_slot = n.block.ledger.committed_index, n.block.member.leader_slot
            seen = (table, committed, leader_slot, [(a.slot, a.peer, a.address) for a in alive])  # type: ignore[attr-defined]
            if seen == n.slots_seen:
                continue
            n.slots_seen = seen
            serving = {a.slot: (a.peer, *(a.address or n.cfg.peer_map[a.peer])) for a in alive}  # type: ignore[attr-defined]
            plan = plan_dispatchers(table, n.id, committed, leader_slot, serving, ())
            for slot in plan.start:
                o = table.owners[slot]
                assert o is not None
                self._add_actor(A.DispatcherActor(self, n, o.id, slot, (o.host, o.port)))
                self.trace_event(f"{n.id}.d{slot}", "start", f"member {o.id}")
            for slot in plan.free_guests:
                self._release_slot(n, slot, table.owners[slot])
            for slot in plan.retire:
                o = table.owners[slot]
                a = n.roles.get(f"{n.id}.d{slot}")
                if a is not None and a.alive:
                    a.kill()
                    self.trace_event(a.key, "stop", f"{o.id} removed")  # type: ignore[union-attr]
                if a is not None:
                    a.retired = True  # type: ignore[attr-defined]
                    n.roles.pop(a.key, None)  # gone for good: not a role of the node any more
                self._release_slot(n, slot, o)

    def _release_slot(self, n: Node, slot: int, owner: SlotOwner | None) -> None:
        """The supervisor's `_release`: the slot's record reset, then the slot freed in the
        table if it still has the owner the plan saw (a leaving one or a guest: a member added
        back meanwhile is no longer leaving, and keeps it)."""
        MemoryState(block=n.block, clock=n.clock).reset_peer(slot)  # the supervisor's own reset
        n.slot_file.update(lambda t: release(t, slot) if t is not None and t.owners[slot] == owner else t)

    def run(self) -> None:
        try:
            while self.steps < self.cfg.steps:
                self.step_once()
            self.heal_all()
            stop_writes = self.now + 200
            full = self._fill_leaders_disk() if "disk-full" in self.faults else None
            if full is not None:
                stop_writes = full + FAILOVER_MS
            deadline = self.now + self.cfg.heal_ms
            next_check = self.now
            # every --peers member a voter again first (faults membership, m2015-*)
            restores = any(f in ("membership", "join") or f.startswith("m2015-") for f in self.faults)
            restoring = restores
            next_restore = self.now
            while True:
                self.step_once()
                # Every 200 ms until the group converges, not only until one leader's view was
                # complete: a deposed leader's stale configuration can say "done" while the
                # group's newest one still lacks a member (seed 614,237 of the join fault).
                if restores and self.now >= next_restore:
                    next_restore = self.now + 200
                    restoring = self.restore_membership()
                if full is not None and self.now >= full + FAILOVER_MS:
                    if self.last_ack_at < full + FAILOVER_MS // 2:
                        self.fail(f"no append acknowledged in the {FAILOVER_MS // 2}-{FAILOVER_MS} ms after the "
                                  f"leader's disk filled, with the other nodes healthy: the group did not fail over")
                    full = None
                if self.writing and self.now >= stop_writes:
                    self.writing = False
                if not self.writing and self.now >= next_check:
                    next_check = self.now + 50
                    why = "the membership is not every --peers member a voter yet" if restoring else self.converged()
                    if why is None:
                        break
                    if self.now >= deadline:
                        self.fail(f"no convergence {self.cfg.heal_ms} ms after the faults stopped: {why}")
            for n in self.nodes:  # final: every replica's whole log is the history
                n.checked = -1
            self.check(final=True)
            if self.rot_pending is not None and self.rot_pending[0].store.repair_index < 0:
                self.stats["rot_repaired"] += 1  # the last damaged node repaired before the end
            top = max(n.store.committed_index for n in self.nodes)
            if len(self.chist) - 1 < top:
                self.fail(f"entries {len(self.chist)}..{top} are committed but no replica's log held them "
                          f"where the history check could read them")
            if self.smc is not None:
                self.smc.final_check()
        finally:
            self.close()

    def close(self) -> None:
        for a in self.actors:
            if a.alive:
                a.kill()
        for n in self.nodes:
            s = n.store
            if s is not None:
                with contextlib.suppress(Exception):
                    s.data.close()
                    s.index.close()
        self._log_undo()
        slot_stamps.uninstall(self._tmp)
        shutil.rmtree(self._tmp, ignore_errors=True)


def _tmp_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class Result:
    seed: int
    ok: bool
    error: str = ""
    trace: str = ""
    steps: int = 0
    virtual_ms: int = 0
    trace_hash: str = ""
    stats: dict[str, int] = field(default_factory=dict)


def run_seed(cfg: SimConfig) -> Result:
    """Run one seed; never raises for an invariant violation (the Result says what broke)."""
    sim = Sim(cfg)
    try:
        sim.run()
    except Violation as v:
        return Result(cfg.seed, False, str(v), sim.format_trace(), sim.steps, sim.now,
                      sim.hash.hexdigest() if sim.hash else "", dict(sim.stats))
    return Result(cfg.seed, True, "", "", sim.steps, sim.now, sim.hash.hexdigest() if sim.hash else "",
                  dict(sim.stats))
