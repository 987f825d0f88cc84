"""Actors: the real role classes of one node, driven one loop iteration per step.

Each actor wraps one role object (node.roles.*) built from a fake RoleContext (`SimRC`): the
real class, with the simulator's SharedState (`SimState`), member lock (`SimLock`), store or
store reader, clock and transport injected. A *step* is one iteration of the role's loop: the
inputs the scheduler delivered (a random-sized burst of the actor's inbox), then its timers.

The roles are driven through their contract-C7 interface: input methods (`handle_frame`,
`on_reply`, `on_request`, ..., `tick`, `next_wait_ms`) and a `transport` attribute, exactly
what each role's `run()` calls from its ZeroMQ poll loop.
"""

from __future__ import annotations

import collections
import os
import random
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from node.store.base import DiskFull, StoreConfig
from node.store.codec import BODY_CRC_OFFSET, ENTRY_MAGICS, HEADER_SIZE, INDEX, INDEX_SIZE
from node.store.layout import read_checkpoint
from node.store.memory_store import MemoryStore
from node.store.reader import StoreReader
from node.store.segment_store import SegmentStore
from tools.sim.state import MemReader, SimState

if TYPE_CHECKING:  # pragma: no cover
    from tools.sim.config import Node
    from tools.sim.world import Sim


class SimCrash(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Unwinds an actor's step: the process died at this point."""


class SimFatal(BaseException):  # noqa: N818
    """A role called rc.fatal(): the supervisor would stop the node."""


class SimLog:
    """A logger that records into the simulator's trace instead of formatting lines."""

    def __init__(self, sim: Sim, key: str) -> None:
        self.sim, self.key = sim, key

    def _rec(self, level: str, msg: str, args: tuple) -> None:
        self.sim.trace_event(self.key, "log", (level, msg, args))
        if level == "W" and msg.startswith("install of snapshot"):  # the applier: checksum mismatch
            self.sim.stats["install_checksum_refusals"] += 1

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        pass

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self._rec("I", msg, args)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._rec("W", msg, args)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._rec("E", msg, args)

    def exception(self, msg: str, *args: Any, **kw: Any) -> None:
        self._rec("E", msg, args)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802
        return False


class SimRC:
    """A RoleContext-like object (docs/contracts.md C7)."""

    def __init__(self, sim: Sim, node: Node, actor: Actor, role: str, peer_id: str | None = None) -> None:
        self.sim = sim
        self.cfg = node.cfg
        self.role = role
        self.log = SimLog(sim, actor.key)
        self.state = SimState(sim, node, actor)
        self.peer_id = peer_id
        self.peer_slot: int | None = None  # a dispatcher's follower given a slot (fault join)
        self.peer_address: tuple[str, int] | None = None
        self.run_dir = node.dir
        self.clock = node.clock
        self.wall_clock = sim.wall_clock  # virtual: nothing in a trace reads the real time
        self.disk_usage = sim.disk_ratio_at  # the modelled disk (retention, fault disk-probe)
        self.stopping = False
        self.wake_fd = -1
        self.zctx = None

    def should_stop(self) -> bool:
        return False

    def beat(self) -> None:
        self.state.beat(self.role, self.clock())

    def drain_wake(self) -> None:
        pass

    def channel(self, ch: Any) -> str:
        return f"sim://{ch.name}"

    def ipc(self, name: str) -> str:
        return f"sim://{name}"

    def fatal(self, message: str) -> None:
        self.sim.trace_event(self.role, "fatal", message)
        raise SimFatal(message)

    def close(self) -> None:
        pass


class _DiskFullable:
    """Fault `disk-full`: while `disk_full()` says so, every append (leader, batch, follower)
    fails with the store's own DiskFull before writing anything, as ENOSPC does."""

    disk_full: Any = None  # set by the handler actor: () -> bool

    def _refuse_if_full(self, what: str) -> None:
        if self.disk_full is not None and self.disk_full():
            raise DiskFull(f"{what}: no space left on device (simulated)")

    def has_room(self) -> bool:
        return not (self.disk_full is not None and self.disk_full()) and super().has_room()  # type: ignore[misc]

    def append_leader(self, *a: Any, **kw: Any) -> Any:
        self._refuse_if_full("append")
        return super().append_leader(*a, **kw)  # type: ignore[misc]

    def append_batch_raw(self, *a: Any, **kw: Any) -> Any:
        self._refuse_if_full("batch append")
        return super().append_batch_raw(*a, **kw)  # type: ignore[misc]

    def append_follower(self, *a: Any, **kw: Any) -> Any:
        self._refuse_if_full("follower append")
        return super().append_follower(*a, **kw)  # type: ignore[misc]


class SimMemoryStore(_DiskFullable, MemoryStore):
    """The MemoryStore, plus `append_batch_raw` where it lacks it (the handler's BATCH_APPEND
    path calls it; the memory store only had `append_leader_batch`): same results, derived."""

    if not hasattr(MemoryStore, "append_batch_raw"):
        def append_batch_raw(self, bodies: list[bytes], term: int) -> tuple[int, list[int]]:
            rs = self.append_leader_batch(bodies, term)
            return rs[0].index, [r.pos for r in rs]

    def data_file_ranges(self, limit: int) -> list[tuple[int, int, float]]:
        """No files: retention (a disk probe reading full, fault disk-probe) finds nothing to delete."""
        return []


class SimSegmentStore(_DiskFullable, SegmentStore):
    """The real SegmentStore without its flush thread: the simulator flushes and checkpoints at
    virtual times (a thread would run on wall-clock time and break determinism)."""

    retention_floor: Any = None  # --no-installs: () -> the highest index every replica committed
    on_reset: Any = None  # install snapshot: (store, phase "before"/"after", index, term) -> None
    before_delete: Any = None  # retention: (store) -> None, the simulator reads what it commits first

    def _flush_service(self) -> None:
        return

    def reset_to(self, snapshot_index: int, snapshot_term: int) -> None:
        """The real `reset_to`, with the install checks around it (smcheck.InstallChecks): the
        handler resets its log only to a snapshot its applier has restored, and afterwards the
        log begins right after it."""
        if self.on_reset is not None:
            self.on_reset(self, "before", snapshot_index, snapshot_term)
        super().reset_to(snapshot_index, snapshot_term)
        if self.on_reset is not None:
            self.on_reset(self, "after", snapshot_index, snapshot_term)

    def delete_before(self, index: int, wait: bool = True) -> int | None:
        """The real `delete_before`, once the simulator has read this store's committed entries
        into the history: with installs, retention may delete entries no other replica's store
        ever showed committed (their leader's store commits a moment after its block; the
        others were installed past them), and the history must not have a hole."""
        if self.before_delete is not None:
            self.before_delete(self)
        return super().delete_before(index, wait)

    def data_file_ranges(self, limit: int) -> list[tuple[int, int, float]]:
        """What retention may look at. By default all of it: a replica that needs an entry
        retention deleted is sent the leader's snapshot (install). With `SimConfig.installs`
        off, only files every replica has committed (plus the next one, which the decision
        never deletes), the simulator's behaviour before installs existed (old seeds)."""
        # Every file is old: the simulated nodes reserve no file for `file_reserved_hours`
        # (their files carry real modification times, their clock is virtual).
        files = [(first, last, float("-inf")) for first, last, _mtime in super().data_file_ranges(limit)]
        if self.retention_floor is None:
            return files
        floor, out = self.retention_floor(), []
        for f in files:
            out.append(f)
            if f[1] > floor:
                break
        return out


class Actor:
    """One simulated process."""

    takes_lock = False
    role = ""

    def __init__(self, sim: Sim, node: Node | None, key: str) -> None:
        self.sim = sim
        self.node = node
        self.key = key
        self.inbox: collections.deque = collections.deque()
        self.wake_at = sim.now
        self.alive = True
        self.busy = False
        self.paused = False  # SIGSTOPped (Sim.pause_actor)
        self.listening = True  # False: inbox items do not make it ready (only its timer does)
        self.inc = sim.next_inc()

    def ready(self, now: int) -> bool:
        return self.alive and not self.busy and (self.wake_at <= now or (self.listening and bool(self.inbox)))

    def take_burst(self) -> list:
        n = len(self.inbox)
        if n == 0:
            return []
        k = 1 if n == 1 else self.sim.rng.randint(1, min(n, 8))
        return [self.inbox.popleft() for _ in range(k)]

    def step(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def kill(self) -> None:
        self.alive = False
        self.sim.actor_events += 1  # Sim.follow_slots: the set of live actors moved
        self.inbox.clear()
        if self.node is not None:
            self.node.lock.drop(self)

    # ---- readers let go of what retention deleted ---------------------------------------------
    def _deleted_below(self) -> int:
        """With retention modelled: the data position below which retention has deleted files and
        published the new ledger begin (-1: nothing to check)."""
        st = self.node.store if self.node is not None and self.sim.disk_ratio else None
        if not isinstance(st, SegmentStore) or st.ledger_begin_index != self.node.block.ledger.ledger_begin_index:
            return -1
        return st.data.files[0].start if st.data.files else -1

    def _check_unmapped(self, reader: Any, deleted_below: int) -> None:
        """A reader that still maps a file retention deleted before its loop turn began keeps the
        file's space from the disk (every long-lived reader calls `follow_begin` each turn)."""
        d = getattr(reader, "_data", None) if isinstance(reader, StoreReader) else None
        if deleted_below >= 0 and d is not None and d.files and d.files[0].start < deleted_below:
            self.sim.fail(f"{self.key}: after a loop turn it still maps data file {d.files[0].path.name}, which "
                          f"retention deleted before the turn began: the disk never gets that space back")


# ---------------------------------------------------------------------------------------------
# handler
# ---------------------------------------------------------------------------------------------
class HandlerActor(Actor):
    takes_lock = True
    role = "handler"

    def __init__(self, sim: Sim, node: Node) -> None:
        super().__init__(sim, node, f"{node.id}.handler")
        from node.roles import handler as hmod

        self.rc = SimRC(sim, node, self, "handler")
        with sim.acting(self):
            h = hmod.Handler(self.rc)
        self.h = h
        if sim.store_kind == "memory":
            if node.memstore is None:
                node.memstore = SimMemoryStore()
            h.store = node.memstore
        else:
            h.store = SimSegmentStore(StoreConfig(
                node.cfg.store_dir, data_file_size=node.cfg.data_file_size,
                index_file_size=node.cfg.index_file_size, flush_mode="async"))
        h.lock = node.lock
        h.transport = HandlerTransport(sim, node, self)
        if node.cfg.state_machine:
            h.sm_link = SimStateMachineLink(sim, node, self)
        self.opened = False
        self.next_cp = 0

    def _open(self) -> None:
        h = self.h
        node, sim = self.node, self.sim
        h.store.disk_full = lambda: node.disk_full_until > sim.now
        if sim.smc is not None and isinstance(h.store, SimSegmentStore):
            if sim.installs:
                h.store.on_reset = lambda st, phase, s, t: sim.smc.on_reset(node, st, phase, s, t)
                h.store.before_delete = lambda st: sim.record_committed(node, st)
            else:
                h.store.retention_floor = sim.smc.retention_floor
        elif sim.retention_on and isinstance(h.store, SimSegmentStore):  # fault retention, no snapshots
            h.store.retention_floor = sim.retention_floor
            h.store.before_delete = lambda st: sim.record_committed(node, st, count=True)
        h.scrub_delay_ms = 0  # virtual time: scrub at once (retention waits for it after a reopen)
        h.open()
        self.node.store = h.store
        self.node.checked = -1
        self.rc.beat()  # first beat = "ledger published": the elector waits for it
        self.opened = True
        s = h.store
        self.sim.trace_event(self.key, "open", f"begin={s.ledger_begin_index} end={s.ledger_end_index} "
                             f"committed={s.committed_index}")
        h.tick()

    def step(self) -> None:
        h = self.h
        if not self.opened:
            self._open()
        else:
            for kind, payload in self.take_burst():
                self.sim.trace_in(self.key, kind, payload)
                if kind == "frame":
                    h.handle_frame(*payload)
                elif kind == "commit":
                    h.on_commit_wakeup()
                elif kind == "ctlreply":
                    h.on_control_reply(payload)
                elif kind == "role":
                    h.sync_role()
                elif kind == "results":
                    h.on_results(payload)
                elif kind == "qreply":
                    h.on_query_reply(payload)
                elif kind == "change":  # fault membership (tools/sim/membership.py)
                    got = h.member_changes.propose(payload)
                    self.sim.on_change_result(self.node, payload, got.code, got.reason, got.index)
            h.tick()
        self.rc.beat()
        now = self.node.clock()
        if self.sim.store_kind == "segment" and now >= self.next_cp:
            self.next_cp = now + 250
            h.store.checkpoint()  # what the flush service does every checkpoint interval
        self.wake_at = self.sim.now + max(1, min(h.next_wait_ms(), 1000))

    def kill(self) -> None:
        super().kill()
        if not self.opened:
            return
        st = self.h.store
        if isinstance(st, SegmentStore):
            self.node.last_wrote = (st.data.wrote_position, st.index.wrote_position)
            st.data.close()  # no flush, no checkpoint: a killed process writes nothing more
            st.index.close()
            st._opened = False
        self.node.store = None


class SimStateMachineLink:
    """The handler's StateMachineLink (node/roles/handler.py) in the simulator: the wake-up is
    a hint (it may be lost: the applier also looks every IDLE_POLL_MS); queries go to the live
    applier in order (a DEALER with IMMEDIATE: none alive, the send fails)."""

    def __init__(self, sim: Sim, node: Node, actor: HandlerActor) -> None:
        self.sim, self.node, self.actor = sim, node, actor

    def committed_moved(self) -> None:
        self.sim.intra(self.node, ("applier",), "apply", b"a")

    def send_query(self, frame: bytes) -> bool:
        a = self.sim._node_actor(self.node, "applier")
        if a is None:
            return False
        self.sim.intra_fifo(self.actor, a, "query", (b"h:%d" % self.actor.inc, bytes(frame)))
        return True


class HandlerTransport:
    def __init__(self, sim: Sim, node: Node, actor: HandlerActor) -> None:
        self.sim, self.node, self.actor = sim, node, actor

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.sim.route_reply(self.node, self.actor, (bytes(ident), bytes(frame)))

    def appended(self, end: int) -> None:
        self.sim.intra(self.node, ("dispatchers", "ack"), "appended", end)

    def control(self, frame: bytes) -> bool:
        return self.sim.intra(self.node, ("elector",), "ctl", (b"h", bytes(frame)))


# ---------------------------------------------------------------------------------------------
# elector
# ---------------------------------------------------------------------------------------------
class ElectorActor(Actor):
    takes_lock = True
    role = "elector"

    def __init__(self, sim: Sim, node: Node) -> None:
        super().__init__(sim, node, f"{node.id}.elector")
        from node.roles import elector as emod

        self.rc = SimRC(sim, node, self, "elector")
        with sim.acting(self):
            e = emod.Elector(self.rc)
        self.e = e
        e.lock = node.lock
        e.transport = ElectorTransport(sim, node, self)
        self.started = False
        self.listening = False  # it reads no socket before the handler's first beat
        self.answers: dict[str, Any] | None = None  # asking the group's term (lost state)
        self.asked: dict[str, int] = {}
        self.asking_since = 0

    def _learn_group_term(self) -> bool:
        """What `Elector.run` does before `start` when its term/vote state is lost
        (node/roles/group_term.py): ask every other member's handler for METADATA, every 300 ms
        until answered, through the simulated network, and let the production decision
        (`decide_lost_state`, `record_group_term`) act. Other frames wait in the inbox, as in
        the elector's socket. True once decided."""
        from node.core.lost_state import NEW_GROUP_PATIENCE_MS, decide_lost_state
        from node.roles import group_term as gt

        e, sim, node = self.e, self.sim, self.node
        if "lost-disk" not in sim.faults:
            return True  # no seed without it asks (their histories stay what they were)
        led = self.rc.state.read_ledger()
        if self.answers is None:
            if not gt.needs_group_term(e.cfg, e.termvote, led):
                return True
            self.answers = {}
            self.asking_since = sim.now
            self.rc.state.set("not_voting", gt.NOT_VOTING_TERM_LOST)
            sim.trace_event(self.key, "lost-state", e.termvote.damaged or "no currterm")
        keep: collections.deque = collections.deque()
        for item in self.inbox:
            kind, payload = item
            msg = None
            if kind == "resp":
                try:
                    msg = P.decode(payload)
                except P.ProtocolError:
                    msg = None
            if isinstance(msg, P.MetadataResponse):
                got = gt.peer_term(msg.self_id, e.cfg.group, msg)
                if got is not None and got.peer in e.cfg.peer_ids and got.peer != e.cfg.id:
                    sim.trace_in(self.key, kind, payload)
                    self.answers[got.peer] = got
            else:
                keep.append(item)
        self.inbox = keep
        local_empty = led.ledger_end_index < 0 and led.ledger_begin_index < 0
        decision = decide_lost_state(len(e.cfg.peer_ids), list(self.answers.values()),
                                     file_absent=e.termvote.absent, local_empty=local_empty,
                                     local_end_term=led.ledger_end_term,
                                     patience_over=sim.now - self.asking_since >= NEW_GROUP_PATIENCE_MS)
        if decision is not None:
            gt.record_group_term(e.cfg, e.log, e.termvote, decision, self.answers)
            sim.trace_event(self.key, "group-term", f"term={decision.term} catch_up={decision.catch_up} "
                            f"new_group={decision.new_group}")
            self.answers = None
            return True
        now = sim.now
        for peer in e.cfg.peer_ids:
            if peer == e.cfg.id or peer in self.answers or now - self.asked.get(peer, -10**9) < gt.LOST_STATE_ASK_MS:
                continue
            dst = sim.by_id.get(peer)
            h = sim._node_actor(dst, "handler") if dst is not None else None
            if h is None:
                continue  # IMMEDIATE: nobody listening there, asked again at the next turn
            self.asked[peer] = now
            frame = P.encode(gt.metadata_request(e.cfg.group, peer, now))
            sim.net_send(node.idx, dst.idx, h, "frame", (b"e:%d:%d" % (node.idx, self.inc), frame), self.key)
        self.wake_at = now + 10
        return False

    def step(self) -> None:
        e = self.e
        if not self.started:
            if self.rc.state.last_beat("handler") <= 0:
                self.wake_at = self.sim.now + 50
                return
            if not self._learn_group_term():
                self.rc.beat()
                return
            self.started = True
            self.listening = True
            e.start()
            e.core.rng = random.Random(self.sim.rng.getrandbits(64))  # the core's vote timers
        for kind, payload in self.take_burst():
            self.sim.trace_in(self.key, kind, payload)
            if kind == "req":
                e.on_request(*payload)
            elif kind == "resp":
                e.on_response(payload)
            elif kind == "ctl":
                e.on_control(*payload)
        e.tick()
        self.rc.beat()
        self.wake_at = self.sim.now + max(1, e.next_wait_ms())


class ElectorTransport:
    def __init__(self, sim: Sim, node: Node, actor: ElectorActor) -> None:
        self.sim, self.node, self.actor = sim, node, actor

    def send(self, peer_id: str, frame: bytes) -> bool:
        sim = self.sim
        if sim.p_eager_commit and sim.faulting and _is_heartbeat(frame):
            # Fault `eager-commit`: the leader's commit index rides along with its heartbeats
            # (etcd's raft), so it reaches the follower's handler as the heartbeat reaches its
            # elector: the moment a follower learns of a new leader.
            d = next((x for x in self.node.roles.values() if x.role == "dispatcher" and x.alive
                      and x.peer == peer_id), None)  # type: ignore[attr-defined]
            if d is not None and d.alive:
                d.eager_due = True
                d.wake_at = min(d.wake_at, sim.now)
        return sim.elector_send(self.node, self.actor, peer_id, bytes(frame))

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.sim.route_reply(self.node, self.actor, (bytes(ident), bytes(frame)))

    def role_changed(self, frame: bytes) -> None:
        self.sim.intra(self.node, ("handler", "dispatchers", "ack"), "role", frame)

    def control_reply(self, ident: bytes, frame: bytes) -> None:
        self.sim.intra(self.node, ("handler",), "ctlreply", bytes(frame))


# ---------------------------------------------------------------------------------------------
# dispatcher
# ---------------------------------------------------------------------------------------------
class DispatcherActor(Actor):
    role = "dispatcher"

    def __init__(self, sim: Sim, node: Node, peer: str, slot: int | None = None,
                 address: tuple[str, int] | None = None) -> None:
        """`slot`, `address`: a member the slot table gave a slot (fault join); else the
        `--peers` position and address."""
        self.slot = node.cfg.peer_ids.index(peer) if slot is None else slot
        super().__init__(sim, node, f"{node.id}.d{self.slot}")
        from node.roles import dispatcher as dmod

        self.peer = peer
        self.address = address
        self.retired = False  # stopped by the supervisor (its member left): never restarted
        self.rc = SimRC(sim, node, self, f"dispatcher[{self.slot}]", peer)
        self.rc.peer_slot, self.rc.peer_address = slot, address
        with sim.acting(self):
            d = dmod.Dispatcher(self.rc)
        self.d = d
        if sim.store_kind == "memory":
            d.reader.close()
            d.reader = MemReader(node)
        self.ident = b"d:%d:%d:%d" % (node.idx, self.slot, self.inc)
        self.eager_due = False  # fault eager-commit: send a COMMIT on the next step
        d.transport = DispatcherTransport(sim, node, self)
        self.sender: Any = None  # the core's InstallSender looked at last (for the stats)
        if sim.install_cfg is not None:
            self._configure_installs(d)

    def _configure_installs(self, d: Any) -> None:
        """The seed's InstallConfig (small chunks, so a snapshot is several; a short chunk
        timeout) for every install this dispatcher starts, through the core's own `cfg`
        parameter (the real dispatcher passes none: 1 MiB chunks). Counts installs started."""
        core, sim = d.core, self.sim
        start = core.start_install

        def start_install(last_index: int, last_term: int, size: int, cfg: Any = None) -> None:
            sim.stats["installs_started"] += 1
            sim.trace_event(self.key, "install", f"start snapshot {last_index}/{last_term} ({size} bytes)")
            start(last_index, last_term, size, sim.install_cfg)

        core.start_install = start_install

    def _install_stats(self) -> None:
        """Install progress of this dispatcher's core, after each step: a transfer that ended
        adds its rewinds (refusals and timeouts that moved it back); one that ended with the
        follower's `installed` counts as completed."""
        core = self.d.core
        ins = core.install
        if ins is self.sender:
            return
        old, self.sender = self.sender, ins
        if old is not None:
            self.sim.stats["install_rewinds"] += old.rewinds
            if old.done:
                self.sim.stats["installs_completed"] += 1
                self.sim.trace_event(self.key, "install", f"done snapshot {old.last_index}/{old.last_term}")
                self.sim.smc.on_install_done(self.node, self.sim.nodes[self.slot], old.last_index, old.last_term)
            else:
                self.sim.stats["installs_abandoned"] += 1

    def step(self) -> None:
        d = self.d
        deleted_below = self._deleted_below()
        for kind, payload in self.take_burst():
            self.sim.trace_in(self.key, kind, payload)
            if kind == "reply":
                d.on_reply(payload)
        d.flush_ack()
        d.tick()
        if self.sim.install_cfg is not None:
            self._install_stats()
        self._check_unmapped(d.reader, deleted_below)
        sim = self.sim
        if self.eager_due or (sim.faulting and sim.p_eager_commit and sim.rng.random() < sim.p_eager_commit):
            self.eager_due = False
            self.eager_commit()
        self.rc.beat()
        self.wake_at = self.sim.now + max(1, min(1000, d.next_wait_ms()))

    def eager_commit(self) -> None:
        """Fault `eager-commit`: send a COMMIT push now, whatever the push state (before any
        COMPARE of this term too), as a leader that announces its commit index with every
        heartbeat does (etcd's raft). The message is truthful -- the leader's committed index
        and that entry's term, read like the dispatcher reads them -- so a correct follower must
        stay safe whatever the order it arrives in; our dispatcher only sends COMMIT after a
        COMPARE succeeded, which is what hides a follower that validates a push on one member
        read and applies it against state keyed on another (docs/contracts.md C2)."""
        from node.core.replication import Commit, PushState
        from node.store.reader import StaleRead

        d = self.d
        if not d._leasing or d.core.state == PushState.IDLE:
            return
        led = d.state.read_ledger()
        ci = led.committed_index
        if ci < max(led.ledger_begin_index, 0):
            return
        gen = led.store_generation
        try:
            d.reader.begin(gen)
            out = d._build(Commit(ci), led, d.core.term, d.now())
            d.reader.validate(gen)
        except StaleRead:
            return
        if out is not None:
            self.sim.trace_event(self.key, "eager-commit", f"COMMIT {ci} term {d.core.term}")
            d.transport.send(out[0])  # its answer matches no request in flight: ignored

    def kill(self) -> None:
        super().kill()
        self.d.reader.close()


class DispatcherTransport:
    def __init__(self, sim: Sim, node: Node, actor: DispatcherActor) -> None:
        self.sim, self.node, self.actor = sim, node, actor

    def send(self, frame: bytes) -> bool:
        return self.sim.data_send(self.node, self.actor, self.actor.peer, (self.actor.ident, bytes(frame)))

    def ack(self, slot: int, match_index: int) -> None:
        self.sim.intra(self.node, ("ack",), "ack", (slot, match_index))


# ---------------------------------------------------------------------------------------------
# ack checker
# ---------------------------------------------------------------------------------------------
class AckActor(Actor):
    role = "ack_checker"

    def __init__(self, sim: Sim, node: Node) -> None:
        super().__init__(sim, node, f"{node.id}.ack")
        from node.roles import ack_checker as amod

        self.rc = SimRC(sim, node, self, "ack_checker")
        with sim.acting(self):
            a = amod.AckChecker(self.rc)
        self.a = a
        if sim.store_kind == "memory":
            a.reader.close()
            a.reader = MemReader(node)
        a.transport = AckTransport(sim, node)

    def step(self) -> None:
        a = self.a
        deleted_below = self._deleted_below()
        for kind, payload in self.take_burst():
            self.sim.trace_in(self.key, kind, payload)
        a.tick()
        self._check_unmapped(a.reader, deleted_below)
        self.rc.beat()
        self.wake_at = self.sim.now + max(1, min(1000, a.next_wait_ms()))

    def kill(self) -> None:
        super().kill()
        self.a.reader.close()


class AckTransport:
    def __init__(self, sim: Sim, node: Node) -> None:
        self.sim, self.node = sim, node

    def commit_wakeup(self) -> None:
        self.sim.intra(self.node, ("handler",), "commit", b"c")


# ---------------------------------------------------------------------------------------------
# applier (--state-machine)
# ---------------------------------------------------------------------------------------------
RESULTS_HWM = 8  # results frames a paused handler queues before the applier's sends fail


class ApplierActor(Actor):
    role = "applier"

    def __init__(self, sim: Sim, node: Node) -> None:
        super().__init__(sim, node, f"{node.id}.applier")
        from node.roles import applier as apmod

        self.rc = SimRC(sim, node, self, "applier")
        with sim.acting(self):
            ap = apmod.Applier(self.rc)  # loads the state machine, opens the SnapshotStore
        self.ap = ap
        if sim.store_kind == "memory":
            ap.reader.close()
            ap.reader = MemReader(node)
        ap.transport = ApplierTransport(sim, node, self)
        if sim.installs:
            restore_installed = ap._restore_installed

            def _restore_installed(meta: Any) -> None:
                restore_installed(meta)
                sim.smc.on_restore_installed(node, meta)

            ap._restore_installed = _restore_installed
        self.started = False
        self.restored = -1  # the snapshot index its restore started from

    def step(self) -> None:
        ap = self.ap
        deleted_below = self._deleted_below()
        if not self.started:  # the supervisor starts it with the other roles: no wait for the handler
            self.started = True
            ap.restore()
            self.restored = ap.snapshot_index
            self.sim.stats["applier_starts"] += 1
            if self.restored >= 0:
                self.sim.stats["applier_restored_snapshots"] += 1
        for kind, payload in self.take_burst():
            self.sim.trace_in(self.key, kind, payload)
            if kind == "query":
                ap.on_query(*payload)
            # "apply" is a wake-up: the tick below reads the block
        ap.tick()
        self._check_unmapped(ap.reader, deleted_below)
        self.rc.beat()
        self.wake_at = self.sim.now + max(1, ap.next_wait_ms())

    def kill(self) -> None:
        super().kill()
        ap = self.ap
        ap.reader.close()
        ap.snaps.close()  # the kernel drops the writer's flock with the process
        if self.sim.faulting and self.sim.rng.random() < 0.3:
            self.sim.trace_event(self.key, "torn", write_torn_take(self.node, self.sim.rng))
            self.sim.stats["torn_snapshot_takes"] += 1


class ApplierTransport:
    """Results go to the live handler in order (PUSH/PULL); while the handler is paused, after
    RESULTS_HWM queued frames the send fails (the high-water mark: the applier logs that the
    results were dropped). Query replies go to the handler incarnation that asked (ROUTER):
    lost if it died."""

    def __init__(self, sim: Sim, node: Node, actor: ApplierActor) -> None:
        self.sim, self.node, self.actor = sim, node, actor

    def results(self, frame: bytes) -> bool:
        h = self.sim._node_actor(self.node, "handler")
        if h is None:
            return False
        if h.paused and sum(1 for k, _ in h.inbox if k == "results") >= RESULTS_HWM:
            return False
        self.sim.intra_fifo(self.actor, h, "results", bytes(frame))
        return True

    def reply(self, ident: bytes, frame: bytes) -> None:
        h = self.sim._node_actor(self.node, "handler")
        if h is not None and ident == b"h:%d" % h.inc:
            self.sim.intra_fifo(self.actor, h, "qreply", bytes(frame))


def write_torn_take(node: Node, rng: random.Random) -> str:
    """A snapshot being taken when the applier died: a temporary directory with part of its
    data. The next applier's SnapshotStore must remove it, and nothing may restore from it."""
    from node.statemachine.snapshot_files import TMP_PREFIX
    from node.statemachine.snapshot_meta import SNAPSHOTS_DIR

    d = os.path.join(node.cfg.store_dir, SNAPSHOTS_DIR, f"{TMP_PREFIX}take-sim-{node.sim.next_inc()}")
    os.makedirs(d, exist_ok=True)
    n = rng.randint(0, 64)
    with open(os.path.join(d, "data"), "wb") as f:
        f.write(bytes(rng.getrandbits(8) for _ in range(n)))
    return f"{os.path.basename(d)} with {n} bytes"


def _is_heartbeat(frame: bytes) -> bool:
    try:
        return isinstance(P.decode(frame), P.HeartbeatRequest)
    except P.ProtocolError:
        return False


def write_torn_tail(node: Node, rng: random.Random) -> str:
    """A write in progress when the power went: junk after the last complete entry of the
    data file (and sometimes of the index file). Recovery must cut it."""
    data_pos, index_pos = node.last_wrote
    out = []
    for sub, pos, size in (("data", data_pos, node.cfg.data_file_size),
                           ("index", index_pos, node.cfg.index_file_size)):
        if sub == "index" and rng.random() < 0.5:
            continue
        d = os.path.join(node.cfg.store_dir, sub)
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            continue
        fname = f"{(pos // size) * size:020d}"
        if fname not in names:
            continue
        rel = pos % size
        room = size - rel
        if room <= 8:
            continue
        n = rng.randint(1, min(room, 96))
        junk = bytes(rng.getrandbits(8) for _ in range(n))
        if junk[:4] == b"\0\0\0\0":
            junk = b"\x01" + junk[1:]
        with open(os.path.join(d, fname), "r+b") as f:
            f.seek(rel)
            f.write(junk)
        out.append(f"{sub}/{fname}@{rel}+{n}")
    return ", ".join(out) or "nothing"


def rot_entry(node: Node, rng: random.Random, below: bool = False, held_from: int = 0) -> tuple[int, str] | None:
    """Damage at rest on a stopped node: one bit of one entry's body CRC flipped in its data
    file, an entry the checkpoint vouches for and the walk at open CRC-checks -- the
    checkpoint's committed entry C, or one above it up to the checkpoint's end index (on disk
    when it was written, so this node may have acknowledged it). Recovery must find it at open
    and repair from peers (docs/store.md "Repair from peers"). With `below`, an entry of the
    200 below C instead, which open leaves to the scrub: found later (the scrub, a GET, a
    dispatcher's check before it pushes it), while the node may already vote or lead; only an
    entry at or after `held_from`, which the other nodes still hold (without snapshots, one
    their retention deleted could not be fetched again: the node would need re-seeding).
    (index, description), or None when there is nothing to damage (no checkpoint, C is the log
    base, a file gone)."""
    d = node.cfg.store_dir
    try:
        cp = read_checkpoint(d)
    except (OSError, ValueError):
        return None
    c = cp.committed_index
    if c < 0 or (cp.base is not None and c <= cp.base.index):
        return None
    if below:
        lo = max(0, c - 200, held_from, cp.base.index + 1 if cp.base is not None else 0)
        if lo >= c:
            return None
        i = rng.randrange(lo, c)
    else:
        above = list(range(c + 1, cp.end_index + 1))
        i = c if not above or rng.random() < 0.5 else rng.choice(above)
    isz, dsz = node.cfg.index_file_size, node.cfg.data_file_size
    off = i * INDEX_SIZE
    try:
        with open(os.path.join(d, "index", f"{(off // isz) * isz:020d}"), "rb") as f:
            f.seek(off % isz)
            magic, pos, size, idx, _term = INDEX.unpack(f.read(INDEX_SIZE))
        if magic not in ENTRY_MAGICS or idx != i or size < HEADER_SIZE:
            return None
        with open(os.path.join(d, "data", f"{(pos // dsz) * dsz:020d}"), "r+b") as f:
            f.seek(pos % dsz + BODY_CRC_OFFSET)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    except (OSError, ValueError):
        return None
    what = "C" if i == c else f"below C={c}" if i < c else f"durable, C={c} end={cp.end_index}"
    return i, f"entry {i} ({what})"

