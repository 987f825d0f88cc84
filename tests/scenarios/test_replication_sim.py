"""Simulated replication: leaders, followers and a faulty network, all in one process
(docs/replication.md; Raft paper §5.3-§5.4).

* Each node runs the REAL role classes of node/roles: a `Handler` (follower pushes, the leader's
  NOOP, client appends, commit -> acknowledgements), one `Dispatcher` per peer and an
  `AckChecker`, over one in-memory shared block (`node.block.memory_state.MemoryState`, the block of
  the unit tests and of tools/simulate.py) and a MemoryStore kept across crashes (it is the
  disk). The harness only delivers their inputs (frames, replies, wake-ups, loop turns), as
  their processes' poll loops do; it decides nothing for them. Whole nodes with real electors,
  files and interleavings inside a node are tools/simulate.py's job (docs/testing.md).
  The roles' loops run one at a time here, each turn to its end (no role is descheduled
  between two reads of the block: tools/simulate.py covers that); no retention, so a
  dispatcher never needs a snapshot.
* Elections are abstract (the election has its own simulator): the harness plays the
  elector, publishing role, term, leader and the leader's quorum heartbeat time (its lease)
  into each node's block. A candidate needs the votes of a majority of reachable nodes whose
  logs are not more up to date than its own (Raft §5.4.1; DLedger compares ledgerEndTerm, then
  ledgerEndIndex); a leader's "heartbeat" makes reachable nodes of older terms its followers
  and renews its lease while it reaches a majority, and a leader that meets a higher term
  steps down.
* The network delivers each message after a seeded random delay, may drop it, and — in "chaos"
  mode — duplicate it and reorder messages of one connection; in "tcp" mode one connection is
  FIFO and never duplicates (ZeroMQ over TCP), messages of different connections interleave
  freely.

Invariants, checked after every step that changed anything:
  1. Log Matching (Raft §5.3): two logs with the same term at an index are identical up to it.
  2. State Machine Safety (Raft §5.4.3): no two nodes commit different entries at an index, and
     no node's committed entry ever changes or disappears.
  3. The highest committed entry is stored on a majority (docs/contracts.md C8: the leader
     never acknowledges a write that is not on a quorum): no committed entry is truncated below a quorum.
  4. For the current leader: each follower's log matches it up to the follower's verified end,
     and each dispatcher's watermark (match index) is an entry the follower really holds.
After healing (all nodes up, no faults), every log converges to the leader's, every commit
index reaches the leader's end, and every acknowledged client write is in the final log.

A failure names the seed and prints the end of the trace; replay with
``_run_seed(seed, mode)`` (or build a ``Cluster`` and call ``random_faults``).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import tempfile
from collections import Counter
from types import SimpleNamespace

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block.memory_state import MemoryBlock, MemoryState
from node.config import NodeConfig
from node.core.replication import PushState
from node.roles.ack_checker import AckChecker
from node.roles.dispatcher import Dispatcher
from node.roles.handler import Handler
from node.store import codec
from node.store.memory_store import MemoryStore
from tools.sim.state import MemReader

GROUP = "g"
NO_SLOT = -1
TIMEOUT_MS = 300  # push timeout and the ack checker's own poll: DLedger's 1 s, scaled
TICK_MS = 10
HEARTBEAT_MS = 50  # the elector's heartbeat interval: the roles' lease follows from it
CLIENT = b"client"  # the ident of the client connection at each node (the harness's writer)


class InvariantViolation(AssertionError):
    pass


_OPEN: list[Cluster] = []  # clusters a test built: their directories go when it ends


@pytest.fixture(autouse=True)
def _remove_cluster_dirs():  # noqa: ANN202
    yield
    while _OPEN:
        _OPEN.pop().close()


# ============================================================================================
# Stores that remember their content as tuples, so the invariants are cheap to check
# ============================================================================================
class TrackedStore(MemoryStore):
    """A MemoryStore whose entries are mirrored as (term, magic, body) on every change."""

    changes = 0  # any store change anywhere: the invariants are re-checked after one

    def __init__(self, c: Cluster, node_id: str) -> None:
        super().__init__()
        self.c = c
        self.node_id = node_id
        self.mirror: list[tuple[int, int, bytes]] = []

    def set_committed_index(self, index: int) -> None:
        TrackedStore.changes += 1
        super().set_committed_index(index)

    def append_leader(self, body: bytes, term: int, magic: int = codec.MAGIC_NORMAL, **stamp):  # noqa: ANN003, ANN201
        r = super().append_leader(body, term, magic, **stamp)
        TrackedStore.changes += 1
        self.mirror.append((term, magic, bytes(body)))
        return r

    def append_follower(self, blob: bytes | memoryview, index_records: bytes | memoryview = b"",
                        run_crc: int | None = None) -> int:
        end = super().append_follower(blob, index_records, run_crc)
        TrackedStore.changes += 1
        self.mirror.extend((e.term, e.magic, bytes(e.body)) for _o, e in codec.iter_entries(blob, False))
        assert len(self.mirror) == end + 1
        return end

    def truncate(self, index: int) -> None:
        end = self.ledger_end_index
        super().truncate(index)
        if index <= end:
            self.c.log_event(f"{self.node_id} truncate from {index} (end {end})")
            self.c.stats["entries truncated"] += end - index + 1
        TrackedStore.changes += 1
        del self.mirror[max(self.ledger_end_index + 1, 0):]


# ============================================================================================
# One node: the real roles over one block; the harness is their sockets and their loops
# ============================================================================================
class Quiet(logging.Logger):
    """The roles' logger: their lines are not part of what is checked here."""

    def __init__(self) -> None:
        super().__init__("replication-sim", logging.CRITICAL)


LOG = Quiet()


class HandlerWire:
    """The handler's transport: replies go back over the network (pushes) or to the client."""

    def __init__(self, x: SimNode) -> None:
        self.x = x

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.x.on_handler_reply(ident, bytes(frame))

    def appended(self, end: int) -> None:
        pass  # the dispatchers and the ack checker take a loop turn every step anyway

    def control(self, frame: bytes) -> bool:
        return True  # the abstract elector renews the lease on its own heartbeats


class DispatcherWire:
    """Dispatcher[p]'s transport: pushes onto the network, the ack checker's wake-up."""

    def __init__(self, x: SimNode, d: Disp) -> None:
        self.x, self.d = x, d

    def send(self, frame: bytes) -> bool:
        x = self.x
        x.c.net.send(x.c.now, x.slot, self.d.peer, ("push", self.d.uid), bytes(frame))
        return True  # a lost push simply times out

    def ack(self, slot: int, match_index: int) -> None:
        x = self.x
        if x.c.rng.random() >= x.c.lost_wakeup:  # the wake-up may be lost: the timer re-checks
            x.ack_check()


class AckWire:
    def __init__(self, x: SimNode) -> None:
        self.x = x

    def commit_wakeup(self) -> None:
        self.x.handler.on_commit_wakeup()


class Disp:
    """One dispatcher process: the real Dispatcher for peer `peer`, and its connection id."""

    def __init__(self, x: SimNode, uid: int, peer_slot: int) -> None:
        self.uid = uid
        self.peer = peer_slot
        self.d = Dispatcher(x.rc("dispatcher", x.c.ids[peer_slot]))
        self.d.reader.close()
        self.d.reader = MemReader(x)
        self.d.transport = DispatcherWire(x, self)

    @property
    def core(self):  # noqa: ANN201 - the real DispatcherCore (the invariants read it)
        return self.d.core


class SimNode:
    def __init__(self, c: Cluster, slot: int) -> None:
        self.c = c
        self.slot = slot
        self.id = c.ids[slot]
        self.dir = f"{c.dir.name}/{self.id}"  # the roles' store readers make data/ and index/ here
        self.cfg = NodeConfig(id=self.id, peers=c.peer_spec, group=GROUP, store_dir=self.dir,
                              heartbeat_interval_ms=HEARTBEAT_MS, max_pending_pushes=c.max_pending,
                              max_push_timeout_ms=TIMEOUT_MS, enable_batch_push=c.max_batch > 1,
                              max_batch_push_size=max(c.max_batch, 1))
        self.store = TrackedStore(c, self.id)
        self.up = True
        # the elector's state (the term is on disk: it survives a crash)
        self.term = 0
        self.role = Role.CANDIDATE
        self.leader_slot = NO_SLOT
        self.rid = 0
        self.writes: dict[int, tuple[int, bytes]] = {}  # client request id -> (term, body)
        self.reset_volatile()

    @property
    def memstore(self) -> TrackedStore:
        """What a dispatcher's or the ack checker's store reader reads (`MemReader`)."""
        return self.store

    def rc(self, role: str, peer: str | None = None) -> SimpleNamespace:
        """A RoleContext as the role's process builds it (docs/contracts.md C7)."""
        def fatal(message: str) -> None:
            raise InvariantViolation(f"{self.id} {role}: fatal: {message}")

        return SimpleNamespace(cfg=self.cfg, role=role, log=LOG, state=MemoryState(block=self.block),
                               clock=self.c.clock, wall_clock=lambda: self.c.now / 1000, disk_usage=lambda _p: 0.0,
                               peer_id=peer, fatal=fatal)

    def reset_volatile(self) -> None:
        """What a node restart loses: everything but the store and the term (a new block)."""
        self.block = MemoryBlock(self.c.n, self.slot)
        self.elector = MemoryState(block=self.block)
        self.publish_member()
        self.new_handler()
        self.disp = {p: self.c.new_disp(self, p) for p in range(self.c.n) if p != self.slot}
        self.acker = AckChecker(self.rc("ack_checker"))
        self.acker.reader.close()
        self.acker.reader = MemReader(self)
        self.acker.transport = AckWire(self)
        self.next_ack_check = 0

    def new_handler(self) -> None:
        h = Handler(self.rc("handler"))
        h.store = self.store
        h.lock = contextlib.nullcontext()  # one role runs at a time here
        h.transport = HandlerWire(self)
        h.scrub_delay_ms = 0
        h.open()
        self.handler = h

    # ---- the elector's side (abstract elections) -------------------------------------------
    def become(self, term: int, role: Role, leader_slot: int) -> None:
        self.term, self.role, self.leader_slot = term, role, leader_slot
        if self.up:
            self.publish_member()

    def publish_member(self, quorum_ms: int | None = None) -> None:
        """What the elector writes: role, term, leader; a leader's lease from a quorum round."""
        self.elector.write_member(role=self.role, current_term=self.term, leader_slot=self.leader_slot,
                                  last_quorum_heartbeat_ms=quorum_ms)

    # ---- inputs of the roles ----------------------------------------------------------------
    def on_handler_reply(self, ident: bytes, frame: bytes) -> None:
        if ident == CLIENT:
            msg = P.decode(frame)
            w = self.writes.pop(msg.request_id, None)
            if w is not None and msg.code == RC.SUCCESS:
                term, body = w
                self.c.acked[msg.index] = (term, codec.MAGIC_NORMAL, body)
            return
        src, uid = self.c.idents[ident]
        self.c.net.send(self.c.now, self.slot, src, ("reply", uid), frame)

    def on_push(self, src: int, uid: int, frame: bytes) -> None:
        ident = b"d:%d:%d" % (src, uid)
        self.c.idents[ident] = (src, uid)
        self.handler.handle_frame(ident, frame)

    def on_reply(self, d: Disp, frame: bytes) -> None:
        """A follower's answer: counted by what the dispatcher has in flight, then delivered
        as the dispatcher's loop does (a burst of replies, then one ack wake-up)."""
        msg = P.decode(frame)
        kind = d.d.inflight.get(msg.request_id, ("",))[0]
        if not kind:
            self.c.stats["stale reply"] += 1
        elif msg.term <= d.core.term:
            self.c.stats[f"{kind} {RC(msg.code).name}{' x_term' if msg.x_term != -1 else ''}"] += 1
        d.d.on_reply(frame)
        d.d.flush_ack()

    def ack_check(self) -> None:
        self.acker.tick()

    def client_write(self, k: int) -> None:
        """k single APPENDs from a client connected to this node."""
        h = self.handler
        if self.role != Role.LEADER or self.term != h.leader_term:
            return
        for _ in range(k):
            self.rid += 1
            body = b"%s-t%d-w%d" % (self.id.encode(), self.term, self.c.next_body())
            self.writes[self.rid] = (self.term, body)
            h.handle_frame(CLIENT, P.encode(P.AppendRequest(GROUP, self.id, body, request_id=self.rid)))


# ============================================================================================
# Network
# ============================================================================================
class Net:
    def __init__(self, c: Cluster, rng: random.Random, fifo: bool) -> None:
        self.c = c
        self.rng = rng
        self.fifo = fifo
        self.q: list = []
        self.seq = 0
        self.drop = 0.0
        self.dup = 0.0
        self.delay = (1, 10)
        self.last_at: dict[tuple, int] = {}
        # test hook: tap(decoded msg) -> None (deliver normally) or the delays of the copies to
        # deliver instead ([] drops it), outside any FIFO order (as if through an older connection)
        self.tap = None

    def send(self, now: int, src: int, dst: int, chan: tuple, msg: object) -> None:
        c = self.c
        if not c.reachable(src, dst) or not c.nodes[dst].up:
            return
        tapped = self.tap(P.decode(msg)) if self.tap else None
        if tapped is not None:
            for extra in tapped:
                self.seq += 1
                heapq.heappush(self.q, (now + extra, self.seq, src, dst, chan, msg))
            return
        if self.rng.random() < self.drop:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            at = now + self.rng.randint(*self.delay)
            if self.fifo:
                key = (src, dst, chan)
                at = max(at, self.last_at.get(key, 0))
                self.last_at[key] = at
            self.seq += 1
            heapq.heappush(self.q, (at, self.seq, src, dst, chan, msg))

    def due(self, now: int):  # noqa: ANN201
        while self.q and self.q[0][0] <= now:
            yield heapq.heappop(self.q)[2:]


# ============================================================================================
# The cluster
# ============================================================================================
class Cluster:
    def __init__(self, n: int, seed: int = 0, mode: str = "tcp", max_pending: int | None = None,
                 max_batch: int | None = None) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.seed = seed
        self.mode = mode
        self.ids = [f"n{i}" for i in range(n)]
        self.majority = n // 2 + 1
        self.max_pending = max_pending or self.rng.choice([1, 2, 4, 16])
        self.max_batch = max_batch or self.rng.choice([1, 130, 4096])  # bytes per push (1 = no batching)
        self.dir = tempfile.TemporaryDirectory(prefix="replication-sim-")
        _OPEN.append(self)
        self.peer_spec = ";".join(f"{i}-127.0.0.1:{20000 + 2 * k}" for k, i in enumerate(self.ids))
        self.idents: dict[bytes, tuple[int, int]] = {}  # push ident -> (source slot, dispatcher uid)
        self.now = 0
        self.uid = 0
        self.bodies = 0
        self.cut: set[frozenset[int]] = set()
        self.lost_wakeup = 0.0
        self.write_rate = 0.0  # chance per tick that each leader takes a client write
        self.trace: list[str] = []
        self.stats: Counter[str] = Counter()
        self.acked: dict[int, tuple] = {}
        self.committed_log: list[tuple] = []
        self.net = Net(self, self.rng, fifo=(mode == "tcp"))
        if mode == "chaos":
            self.net.dup = 0.1
        self.nodes = [SimNode(self, i) for i in range(n)]
        self._last_mark: tuple = ()
        self.next_heartbeat = 0

    # ---- helpers --------------------------------------------------------------------------
    def new_disp(self, x: SimNode, peer: int) -> Disp:
        self.uid += 1
        return Disp(x, self.uid, peer)

    def clock(self) -> int:
        return self.now

    def close(self) -> None:
        self.dir.cleanup()

    def next_body(self) -> int:
        self.bodies += 1
        return self.bodies

    def log_event(self, text: str) -> None:
        self.trace.append(f"t={self.now:5d} {text}")

    def node(self, ident: str) -> SimNode:
        return self.nodes[self.ids.index(ident)]

    def reachable(self, a: int, b: int) -> bool:
        return a == b or frozenset((a, b)) not in self.cut

    def leader(self) -> SimNode | None:
        """The up leader of the highest term, if any."""
        ls = [x for x in self.nodes if x.up and x.role == Role.LEADER]
        return max(ls, key=lambda x: x.term) if ls else None

    # ---- faults ---------------------------------------------------------------------------
    def crash(self, i: int) -> None:
        x = self.nodes[i]
        if x.up:
            x.up = False
            x.become(x.term, Role.CANDIDATE, NO_SLOT)
            x.writes.clear()
            x.reset_volatile()
            self.log_event(f"{x.id} crashed")

    def restart(self, i: int) -> None:
        x = self.nodes[i]
        if not x.up:
            x.up = True
            x.reset_volatile()
            self.log_event(f"{x.id} restarted term={x.term} end={x.store.ledger_end_index}")

    def restart_handler(self, i: int) -> None:
        """The handler process dies and is restarted: its queue and verified end are gone."""
        x = self.nodes[i]
        if x.up:
            x.new_handler()  # the old one is simply gone, as a killed process is
            x.writes.clear()  # the client's requests to it are never answered
            self.log_event(f"{x.id} handler restarted")

    def restart_dispatcher(self, i: int, peer: int) -> None:
        x = self.nodes[i]
        if x.up and peer != i:
            x.disp[peer] = self.new_disp(x, peer)
            self.log_event(f"{x.id} dispatcher→{self.ids[peer]} restarted")

    def partition(self, *groups: list[int]) -> None:
        self.cut = {frozenset((a, b)) for g in groups for a in g for b in range(self.n)
                    if b not in g}
        self.log_event("partition " + " | ".join(",".join(self.ids[i] for i in g) for g in groups))

    def heal(self) -> None:
        self.cut = set()

    # ---- elections (abstract) ---------------------------------------------------------------
    def elect(self, i: int) -> bool:
        cand = self.nodes[i]
        if not cand.up:
            return False
        term = max(x.term for x in self.nodes) + 1
        mine = (cand.store.ledger_end_term, cand.store.ledger_end_index)
        voters = [x for x in self.nodes if x.up and self.reachable(i, x.slot)]
        grants = [x for x in voters if mine >= (x.store.ledger_end_term, x.store.ledger_end_index)]
        for x in voters:
            x.become(term, Role.CANDIDATE, NO_SLOT)
        if len(grants) < self.majority:
            self.log_event(f"{cand.id} lost the election of term {term}")
            return False
        cand.become(term, Role.LEADER, cand.slot)
        cand.publish_member(quorum_ms=self.now)  # the won vote round starts its lease
        self.log_event(f"{cand.id} elected in term {term}")
        return True

    def heartbeats(self) -> None:
        """Every HEARTBEAT_MS a leader reaches the nodes it can: older terms follow it
        (docs/election.md), a higher term makes it step down (DLedger #325). Between heartbeats a
        node can be a candidate (pushes answered NOT_FOLLOWER) or a deposed leader can push in
        its old term (answered INCONSISTENT_TERM). A round that reaches a majority renews the
        leader's lease (what the elector publishes as its quorum heartbeat time)."""
        if self.now < self.next_heartbeat:
            return
        self.next_heartbeat = self.now + HEARTBEAT_MS
        for ld in self.nodes:
            if not (ld.up and ld.role == Role.LEADER):
                continue
            reached = 1
            for x in self.nodes:
                if x is ld or not x.up or not self.reachable(ld.slot, x.slot):
                    continue
                if x.term > ld.term:
                    self.log_event(f"{ld.id} steps down: {x.id} has term {x.term}")
                    ld.become(x.term, Role.CANDIDATE, NO_SLOT)
                    break
                if x.role == Role.LEADER and x.term == ld.term:
                    raise InvariantViolation(f"two leaders in term {x.term}: {ld.id}, {x.id}")
                if x.term < ld.term or x.role != Role.FOLLOWER or x.leader_slot != ld.slot:
                    x.become(ld.term, Role.FOLLOWER, ld.slot)
                reached += 1
            else:
                if reached >= self.majority:
                    ld.publish_member(quorum_ms=self.now)

    # ---- time -------------------------------------------------------------------------------
    def step(self) -> None:
        self.now += TICK_MS
        now = self.now
        for src, dst, (kind, uid), frame in list(self.net.due(now)):
            x = self.nodes[dst]
            if not x.up or not self.reachable(src, dst):
                continue
            if kind == "push":
                x.on_push(src, uid, frame)
            else:
                d = x.disp.get(src)
                if d is not None and d.uid == uid:
                    x.on_reply(d, frame)
        self.heartbeats()
        for x in self.nodes:
            if not x.up:
                continue
            # one loop turn of each role; the handler may see a role change before or after
            # the dispatchers do (the elector's PUB reaches the processes in any order)
            if self.rng.random() < 0.5:
                x.handler.sync_role()
            for d in x.disp.values():
                d.d.tick()
            x.handler.tick()
            if now >= x.next_ack_check:
                x.next_ack_check = now + TIMEOUT_MS
                x.ack_check()
            if x.role == Role.LEADER and self.rng.random() < self.write_rate:
                x.client_write(self.rng.randint(1, 3))
        mark = (TrackedStore.changes, self.net.seq,
                [(x.up, x.role, x.term, x.handler.follower.verified_end,
                  [d.core.match_index for d in x.disp.values()]) for x in self.nodes])
        if mark != self._last_mark:
            self._last_mark = mark
            self.check()

    def run(self, ms: int) -> None:
        end = self.now + ms
        while self.now < end:
            self.step()

    # ---- invariants -------------------------------------------------------------------------
    def check(self) -> None:
        logs = [x.store.mirror for x in self.nodes]
        # 1. Log Matching (Raft §5.3)
        for a in range(self.n):
            for b in range(a + 1, self.n):
                la, lb = logs[a], logs[b]
                m = min(len(la), len(lb))
                if la[:m] == lb[:m]:
                    continue
                d = next(i for i in range(m) if la[i] != lb[i])
                for i in range(d, m):
                    if la[i][0] == lb[i][0]:
                        raise InvariantViolation(
                            f"Log Matching: {self.ids[a]} and {self.ids[b]} both have term {la[i][0]} "
                            f"at {i} but differ at {d}")
        # 2. State Machine Safety: committed entries agree and never change
        g = self.committed_log
        for x, log in zip(self.nodes, logs, strict=True):
            c = x.store.committed_index
            if c >= len(log):
                raise InvariantViolation(f"{x.id}: committed {c} beyond its log ({len(log)} entries)")
            k = min(c + 1, len(g))
            if log[:k] != g[:k]:
                i = next(i for i in range(k) if log[i] != g[i])
                raise InvariantViolation(f"{x.id}: committed entry {i} is {log[i][:2]}, elsewhere {g[i][:2]}")
            if c + 1 > len(g):
                g.extend(log[len(g):c + 1])
        # 3. the highest committed entry is on a majority
        if g:
            top = len(g) - 1
            holders = sum(1 for log in logs if len(log) > top and log[top] == g[top])
            if holders < self.majority:
                raise InvariantViolation(f"committed entry {top} is stored on {holders} of {self.n} nodes")
        # 4. the current leader's view of its followers is true
        ld = self.leader()
        if ld is None:
            return
        llog = logs[ld.slot]
        for x in self.nodes:
            f = x.handler.follower
            if (x is not ld and x.up and x.role == Role.FOLLOWER and x.term == ld.term
                    and f.key == (ld.term, ld.slot)):
                v = min(f.verified_end, len(logs[x.slot]) - 1)
                if v >= 0 and (v >= len(llog) or logs[x.slot][:v + 1] != llog[:v + 1]):
                    raise InvariantViolation(f"{x.id} verified up to {v} but differs from leader {ld.id}")
        for p, d in ld.disp.items():
            core, x = d.core, self.nodes[p]
            if core.state == PushState.IDLE or core.term != ld.term or x.term > ld.term:
                continue
            m = core.match_index
            if m >= 0 and (m >= len(logs[p]) or logs[p][m] != llog[m]):
                raise InvariantViolation(f"{ld.id}'s watermark for {x.id} is {m}, which {x.id} does not hold "
                                         f"(end {len(logs[p]) - 1})")

    # ---- convergence ------------------------------------------------------------------------
    def converged(self) -> bool:
        ld = self.leader()
        if ld is None or any(not x.up for x in self.nodes):
            return False
        if ld.handler.leader_term != ld.term or ld.store.ledger_end_term != ld.term:
            return False  # the new leader's NOOP is not even written yet
        end = ld.store.ledger_end_index
        return all(x.store.mirror == ld.store.mirror and x.store.committed_index == end for x in self.nodes)

    def heal_all(self) -> None:
        self.heal()
        self.net.drop = self.net.dup = 0.0
        self.net.delay = (1, 10)
        self.lost_wakeup = 0.0
        self.write_rate = 0.0
        for i in range(self.n):
            self.restart(i)

    def ensure_leader(self) -> None:
        """The elector's job after healing: if no leader holds the highest term, the most up to
        date node wins (it gets every vote)."""
        ld = self.leader()
        if ld is not None and ld.term == max(x.term for x in self.nodes):
            return
        best = max(self.nodes, key=lambda x: (x.store.ledger_end_term, x.store.ledger_end_index, -x.slot))
        assert self.elect(best.slot)

    def stabilize(self, max_ms: int) -> int | None:
        start = self.now
        while self.now - start <= max_ms:
            self.ensure_leader()
            if self.converged():
                return self.now - start
            self.step()
        return None

    def status(self) -> list[str]:
        out = []
        for x in self.nodes:
            terms = "".join(str(t % 10) for t, _m, _b in x.store.mirror)
            out.append(f"{x.id} {'up' if x.up else 'DOWN'} {x.role.name} term={x.term} "
                       f"commit={x.store.committed_index} log={terms}")
        return out

    def explain(self) -> str:
        return "\n".join(self.trace[-30:] + self.status())


def random_faults(c: Cluster, duration_ms: int) -> None:
    rnd = c.rng
    c.ensure_leader()
    c.write_rate = 0.3
    end = c.now + duration_ms
    while c.now < end:
        c.run(rnd.randint(20, 300))
        up = [x.slot for x in c.nodes if x.up]
        down = [x.slot for x in c.nodes if not x.up]
        ld = c.leader()
        fault = rnd.randrange(12)
        if fault == 0 and len(up) > 1:
            c.crash(rnd.choice(up))
        elif fault == 1 and down:
            c.restart(rnd.choice(down))
        elif fault == 2:
            ids = list(range(c.n))
            rnd.shuffle(ids)
            cut = rnd.randint(1, c.n - 1)
            c.partition(ids[:cut], ids[cut:])
        elif fault == 3:
            c.heal()
        elif fault == 4 and ld is not None:
            # the leader is cut off with its uncommitted tail; the others elect a new one
            c.partition([ld.slot], [i for i in range(c.n) if i != ld.slot])
            c.run(rnd.randint(10, 100))
            others = [x.slot for x in c.nodes if x.up and x is not ld]
            if others:
                c.elect(rnd.choice(others))
        elif fault == 5 and up:
            c.elect(rnd.choice(up))
        elif fault == 6:
            c.net.drop = rnd.choice([0.0, 0.05, 0.2])
        elif fault == 7:
            c.net.delay = rnd.choice([(1, 5), (1, 40), (20, 150), (1, 400)])
        elif fault == 8 and ld is not None:
            c.restart_dispatcher(ld.slot, rnd.choice([p for p in range(c.n) if p != ld.slot]))
        elif fault == 9 and up:
            c.restart_handler(rnd.choice(up))
        elif fault == 10:
            c.lost_wakeup = rnd.choice([0.0, 0.5])
        elif fault == 11 and c.leader() is None and up:
            c.elect(rnd.choice(up))


HEAL_BOUND_MS = 4_000


def _run_seed(seed: int, mode: str) -> Cluster:
    rnd = random.Random(seed)
    c = Cluster(rnd.choice([3, 3, 5]), seed=seed, mode=mode)
    try:
        random_faults(c, 2_500)
        c.heal_all()
        took = c.stabilize(HEAL_BOUND_MS)
    except InvariantViolation as e:
        raise InvariantViolation(f"seed {seed} ({mode}): {e}\n{c.explain()}") from None
    assert took is not None, f"seed {seed} ({mode}): no convergence {HEAL_BOUND_MS} ms after healing\n" \
        + c.explain()
    final = c.leader().store.mirror
    for i, e in c.acked.items():
        assert i < len(final) and final[i] == e, f"seed {seed}: acknowledged write {i} {e[:2]} lost"
    return c


TCP_SEEDS = range(120)
CHAOS_SEEDS = range(1000, 1030)


@pytest.mark.parametrize("seed", TCP_SEEDS, ids=lambda s: f"seed={s}")
def test_random_faults_tcp(seed: int) -> None:
    c = _run_seed(seed, "tcp")
    assert c.committed_log, "nothing was ever committed: the scenario tested nothing"


@pytest.mark.parametrize("seed", CHAOS_SEEDS, ids=lambda s: f"seed={s}")
def test_random_faults_chaos(seed: int) -> None:
    # Raft assumes a network that may also duplicate and reorder (§5.1, §5.3).
    c = _run_seed(seed, "chaos")
    assert c.committed_log


def test_random_runs_exercise_every_path() -> None:
    """Guard against a simulation that silently stopped testing anything: over a few seeds of
    each mode, every dispatcher transition and follower answer of interest happened."""
    stats: Counter[str] = Counter()
    for seed in range(15):
        with contextlib.suppress(AssertionError):  # failures are reported by the tests above
            stats.update(_run_seed(seed, "tcp").stats)
        with contextlib.suppress(AssertionError):
            stats.update(_run_seed(1000 + seed, "chaos").stats)
    for path in ("APPEND SUCCESS", "COMMIT SUCCESS", "COMPARE SUCCESS", "TRUNCATE SUCCESS",
                 "COMPARE INCONSISTENT_STATE", "COMPARE INCONSISTENT_STATE x_term", "COMPARE NOT_FOLLOWER",
                 "APPEND REPEATED_PUSH", "entries truncated", "stale reply"):
        assert stats[path] > 0, f"{path!r} never happened: {sorted(stats.items())}"


# ============================================================================================
# Scripted scenarios
# ============================================================================================
def _cluster(n: int = 3, seed: int = 7) -> Cluster:
    c = Cluster(n, seed=seed, mode="tcp", max_pending=4, max_batch=4096)
    c.net.delay = (2, 6)
    return c


def _lead(c: Cluster, i: int) -> SimNode:
    """Elect node i and run until its handler leads (its NOOP is written)."""
    assert c.elect(i)
    x = c.nodes[i]
    for _ in range(100):
        if x.handler.leader_term == x.term:
            return x
        c.step()
    raise AssertionError(c.explain())


def _log_terms(x: SimNode) -> list[int]:
    return [t for t, _m, _b in x.store.mirror]


def test_old_leader_with_a_divergent_tail_is_truncated_when_it_rejoins() -> None:
    # docs/replication.md "Dispatcher": COMPARE finds the agreement point, TRUNCATE drops the
    # follower's extra entries, APPEND refills. Also the regression test of the fast-backup
    # livelock: the old leader's committed entries and its uncommitted tail share term 1, so
    # DLedger's writeIndex = xIndex would TRUNCATE committed entries (refused → forever).
    c = _cluster()
    n0, n1, n2 = c.nodes
    _lead(c, 0)
    n0.client_write(3)
    assert c.stabilize(1_000) is not None
    committed = n0.store.committed_index
    assert committed == 3 and _log_terms(n1) == [1, 1, 1, 1]
    c.partition([0], [1, 2])
    n0.client_write(2)
    n0.client_write(3)  # 5 entries of term 1 only n0 has: uncommitted forever
    c.run(100)
    assert n0.store.ledger_end_index == 8 and n0.store.committed_index == committed
    _lead(c, 1)
    n1.client_write(2)
    c.run(100)
    c.heal()
    assert c.stabilize(2_000) is not None, c.explain()
    assert _log_terms(n0) == _log_terms(n1) == _log_terms(n2) == [1, 1, 1, 1, 2, 2, 2]
    assert any("n0 truncate from 4 (end 8)" in t for t in c.trace), c.explain()
    assert not any(b"n0-t1" in body for _t, _m, body in n0.store.mirror[4:])


def test_new_leader_commits_the_previous_terms_entries_with_its_noop() -> None:
    # Raft §5.4.2 / Figure 8 and docs/contracts.md C9 (DLedger #305): entries of term 1 on a
    # majority are not committed by counting once term 2 began; the new leader's NOOP (term 2)
    # commits them without any client write.
    c = _cluster()
    n0, n1, _n2 = c.nodes
    _lead(c, 0)
    assert c.stabilize(1_000) is not None
    c.lost_wakeup = 1.0  # the ack checker sleeps: nothing past the NOOP commits in term 1
    n0.next_ack_check = 10**9
    n0.client_write(3)
    c.run(100)
    assert n1.store.ledger_end_index == 3  # on a majority...
    assert n0.store.committed_index == 0  # ...but not committed
    c.crash(0)
    c.lost_wakeup = 0.0
    assert c.elect(1)
    c.run(200)
    assert n1.store.mirror[4][:2] == (2, codec.MAGIC_NOOP)
    assert n1.store.committed_index == 4, c.explain()  # the term-1 entries committed with the NOOP
    assert not c.acked  # TERM_CHANGED for the client: indeterminate, yet the writes survive
    assert [body for _t, _m, body in n1.store.mirror[1:4]] == [b"n0-t1-w1", b"n0-t1-w2", b"n0-t1-w3"]


def test_lagging_follower_catches_up_after_a_long_outage() -> None:
    c = _cluster(5)
    _lead(c, 0)
    c.write_rate = 0.5
    c.run(100)
    c.crash(4)
    c.run(1_500)
    c.write_rate = 0.0
    c.restart(4)
    assert c.stabilize(3_000) is not None, c.explain()


def test_lossy_network_still_converges() -> None:
    c = _cluster(3, seed=11)
    _lead(c, 0)
    c.net.drop = 0.3
    c.net.delay = (1, 60)
    c.write_rate = 0.5
    c.run(2_000)
    c.heal_all()
    assert c.stabilize(4_000) is not None, c.explain()
    assert len(c.acked) > 10


def test_dispatcher_and_handler_restarts_mid_stream() -> None:
    # a dead role process is restarted; its state comes back from the store and the
    # shared block (a new dispatcher starts with COMPARE, a new handler re-verifies).
    c = _cluster(3, seed=5)
    _lead(c, 0)
    c.write_rate = 0.5
    for t in range(10):
        c.run(97)
        if t % 3 == 0:
            c.restart_dispatcher(0, 1 + t % 2)
        if t % 4 == 1:
            c.restart_handler(2)
    c.write_rate = 0.0
    n0 = c.nodes[0]
    n0.client_write(1)  # see test_bug_idle_follower_whose_handler_restarted_never_learns_the_commit
    assert c.stabilize(3_000) is not None, c.explain()


def test_bug_idle_follower_whose_handler_restarted_never_learns_the_commit() -> None:
    """BUG (liveness): a follower's handler restart (or node restart) resets verified_end to -1
    (Handler._sync_role). If the leader's dispatcher for it is already in APPEND with nothing
    left to send, the follower only receives idle COMMIT pushes, and follower_commit(commit,
    verified_end=-1, ...) never moves: its committed index stays behind for as long as no
    client writes (docs/replication.md: the idle COMMIT exists precisely so idle followers learn it).
    Fix: let COMMIT carry (pre_log_index, pre_log_term) = (commitIndex, term of that entry)
    from the dispatcher, and in the handler's COMMIT branch raise verified_end to
    pre_log_index when the follower holds that entry with that term (Log Matching), before
    follower_commit. (Alternatively answer such a COMMIT INCONSISTENT_STATE and make the core
    go COMPARE on it.)"""
    c = _cluster()
    n0, n1, _n2 = c.nodes
    _lead(c, 0)
    assert c.stabilize(1_000) is not None
    n0.client_write(2)
    d = n0.disp[1]
    for _ in range(100):  # until n0 heard n1's ack, before n1 learns the commit
        if d.core.match_index == 2:
            break
        c.step()
    assert d.core.match_index == 2 and d.core.state == PushState.APPEND and not d.core.pending
    assert n1.store.ledger_end_index == 2 and n1.store.committed_index < 2
    c.partition([1], [0, 2])  # n1 misses the commit news...
    c.run(100)
    c.restart_handler(1)  # ...and its handler restarts
    c.heal()
    c.run(3_000)
    assert n0.store.committed_index == 2
    assert n1.store.committed_index == 2, f"n1 is stuck at {n1.store.committed_index}\n{c.explain()}"


def test_bug_duplicated_truncate_drops_acknowledged_entries() -> None:
    """BUG (under duplication/reordering): a copy of the TRUNCATE that cleaned n0's divergent
    tail arrives again after n0 acknowledged the new leader's entries (and before n0 learned
    that they are committed); n0 truncates them although the leader counted them, so the
    committed index is no longer backed by a quorum (invariant 3 / the watermark check of
    invariant 4 fire). The fix is in FollowerCore's TRUNCATE rule (never cut at or below the
    verified end): see
    tests/unit/test_replication_follower.py::test_duplicate_truncate_must_not_drop_entries_already_acknowledged."""
    c = _cluster()
    n0, n1, _n2 = c.nodes
    _lead(c, 0)
    n0.client_write(3)
    assert c.stabilize(1_000) is not None
    c.partition([0], [1, 2])
    n0.client_write(3)  # n0's divergent, uncommitted tail: 4..6 of term 1
    c.run(50)
    _lead(c, 1)
    n1.client_write(4)  # 5..8 of term 2 (4 is n1's NOOP)
    c.run(50)
    c.crash(2)  # from now on n1's commits need n0's acks
    copied: list[P.PushRequest] = []

    def tap(msg: object) -> list[int] | None:
        if not isinstance(msg, P.PushRequest) or msg.remote_id != "n0":
            return None
        if msg.kind == P.PushKind.TRUNCATE and not copied:
            copied.append(msg)
            return [5, 300]  # delivered now, and once more 300 ms later
        if msg.kind == P.PushKind.COMMIT:
            return []  # n0 does not learn the commit index in time
        return None

    c.net.tap = tap
    c.heal()
    for _ in range(300):  # n1 asks n0 again once its dispatcher's unanswered COMPARE timed out
        if copied:
            break
        c.step()
    assert copied, "no TRUNCATE was sent to n0\n" + c.explain()
    c.run(600)  # the copy arrives again after n0 acknowledged n1's entries
    c.net.tap = None
    c.restart(2)
    assert c.stabilize(2_000) is not None, c.explain()
