"""The simulated shared block, member lock and store readers.

`NodeBlock` holds one node's block (what `SharedState.create` would initialise); every actor of
the node gets its own `SimState` handle on it. A handle's reads are *preemption points*: after
taking the snapshot the scheduler may run other actors' pending steps before the value is
returned, so the caller acts on a value the world has already moved past -- exactly what a
descheduled role process does between reading the block and using what it read.

`SimLock` stands for the node's member lock (an fcntl lock in production). While an actor holds
it, only actors that never take it (dispatchers, ack checker) may run nested.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ipc.codes import Role
from node.shared_state import NO_SLOT, LedgerView, MemberView, PeerView, QuorumView, SnapshotView
from node.store import codec
from node.store.base import StoreError
from node.store.reader import StaleRead

if TYPE_CHECKING:  # pragma: no cover
    from tools.sim.actors import Actor
    from tools.sim.config import Node
    from tools.sim.world import Sim


def _defaults(cls: type, **given: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            out[f.name] = given[f.name]
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        else:
            out[f.name] = 0
    return out


_MEMBER_FIELDS = frozenset(f.name for f in dataclasses.fields(MemberView))
_LEDGER_FIELDS = frozenset(f.name for f in dataclasses.fields(LedgerView))


class NodeBlock:
    """One incarnation of a node's shared block (a node restart creates a new one)."""

    def __init__(self, n_peers: int, self_slot: int) -> None:
        self.n_peers = n_peers
        self.self_slot = self_slot
        self.member = MemberView(**_defaults(
            MemberView, role=Role.CANDIDATE, current_term=0, leader_slot=NO_SLOT, voted_for_slot=NO_SLOT,
            transferee_slot=NO_SLOT, role_epoch=0, last_leader_heartbeat_ms=0, last_quorum_heartbeat_ms=0))
        ledger_init = {f: -1 for f in ("ledger_begin_index", "ledger_end_index", "ledger_end_term",
                                      "committed_index")}
        ledger_init.update({f: 0 for f in _LEDGER_FIELDS - set(ledger_init)})
        self.ledger = LedgerView(**ledger_init)
        self.quorum = QuorumView(-1, -1)
        self.snapshot = SnapshotView(-1, -1)  # the applier's newest snapshot (--state-machine)
        self.peers = [PeerView(p, -1, -1, False, 0, 0, 0, 0, 0) for p in range(n_peers)]
        self.words: dict[str, int] = {"repair_index": -1}  # as SharedState.create initialises it


class Unobserved:
    """A histogram observer or request counter of a fake block: metrics decide nothing, and
    this block has no arrays for them."""

    def observe(self, value: int) -> None:
        pass

    def count_reply(self, msg: object) -> None:
        pass


class SimState:
    """The SharedState methods the roles use, over a NodeBlock, for one actor."""

    def __init__(self, sim: Sim, node: Node, actor: Actor) -> None:
        self.sim = sim
        self.node = node
        self.actor = actor
        self.n_peers = node.block.n_peers
        self.self_slot = node.block.self_slot
        self.read_retries = 0

    @property
    def block(self) -> NodeBlock:
        return self.node.block

    # ---- reads: snapshot, then maybe let the world move on ------------------------------
    def read_member(self, timeout_s: float | None = None) -> MemberView:
        v = self.block.member
        self.sim.preempt(self.actor)
        return v

    def read_ledger(self, timeout_s: float | None = None) -> LedgerView:
        v = self.block.ledger
        self.sim.preempt(self.actor)
        return v

    def read_quorum(self, timeout_s: float | None = None) -> QuorumView:
        v = self.block.quorum
        self.sim.preempt(self.actor)
        return v

    def read_snapshot(self, timeout_s: float | None = None) -> SnapshotView:
        v = self.block.snapshot
        self.sim.preempt(self.actor)
        return v

    def read_peer(self, slot: int, timeout_s: float | None = None) -> PeerView:
        v = self.block.peers[slot]
        self.sim.preempt(self.actor)
        return v

    def read_peers(self, timeout_s: float | None = None) -> list[PeerView]:
        v = [p for p in self.block.peers if p.slot != self.self_slot]
        self.sim.preempt(self.actor)
        return v

    # ---- writes ---------------------------------------------------------------------------
    def write_member(self, **kw: Any) -> MemberView:
        self.sim.at_write(self.actor)
        cur = self.block.member
        upd = {k: v for k, v in kw.items() if v is not None and k in _MEMBER_FIELDS}
        if "role" in upd:
            upd["role"] = Role(upd["role"])
        new = dataclasses.replace(cur, **upd)
        if new.role != cur.role or new.current_term != cur.current_term:
            new = dataclasses.replace(new, role_epoch=cur.role_epoch + 1)
        self.block.member = new
        self.sim.on_member_write(self.node, cur, new)
        return new

    def write_ledger(self, **kw: Any) -> LedgerView:
        self.sim.at_write(self.actor)
        cur = self.block.ledger
        upd = {k: v for k, v in kw.items() if v is not None and k in _LEDGER_FIELDS}
        new = dataclasses.replace(cur, **upd)
        self.block.ledger = new
        self.sim.on_ledger_write(self.node, cur, new)
        return new

    def write_quorum(self, *, quorum_index: int, quorum_term: int) -> QuorumView:
        self.sim.at_write(self.actor)
        self.block.quorum = QuorumView(quorum_index, quorum_term)
        self.sim.trace_event(self.actor.key, "quorum", (quorum_index, quorum_term))
        self.sim.on_quorum_write(self.node, quorum_index, quorum_term)
        return self.block.quorum

    def write_snapshot(self, *, snapshot_index: int, snapshot_term: int) -> SnapshotView:
        self.sim.at_write(self.actor)
        self.block.snapshot = SnapshotView(snapshot_index, snapshot_term)
        self.sim.trace_event(self.actor.key, "snapshot", (snapshot_index, snapshot_term))
        return self.block.snapshot

    def write_peer(self, slot: int, *, match_index: int | None = None, match_term: int | None = None,
                   alive: bool | None = None, last_ack_ms: int | None = None) -> None:
        self.sim.at_write(self.actor)
        cur = self.block.peers[slot]
        upd: dict[str, Any] = {}
        if match_index is not None:
            upd["match_index"] = match_index
        if match_term is not None:
            upd["match_term"] = match_term
        if alive is not None:
            upd["alive"] = bool(alive)
        if last_ack_ms is not None:
            upd["last_ack_ms"] = last_ack_ms
        self.block.peers[slot] = dataclasses.replace(cur, **upd)

    # ---- single words -------------------------------------------------------------------
    def get(self, name: str) -> int:
        return self.block.words.get(name, 0)

    def set(self, name: str, value: int) -> None:
        self.block.words[name] = value

    # ---- metrics (the SharedState methods node/role_metrics.py calls) -------------------
    def word_writer(self, name: str) -> Callable[[int], None]:
        return lambda value: self.set(name, value)

    def set_peer(self, slot: int, name: str, value: int) -> None:
        self.set(f"peer{slot}.{name}", value)

    def histogram_writer(self, name: str) -> Unobserved:
        return Unobserved()

    def peer_histogram_writer(self, slot: int, name: str) -> Unobserved:
        return Unobserved()

    def request_counter(self) -> Unobserved:
        return Unobserved()

    def incr(self, name: str, delta: int = 1) -> int:
        w = self.block.words
        v = w.get(name, 0) + delta
        w[name] = v
        return v

    def get_peer(self, slot: int, name: str) -> int:
        p = self.block.peers[slot]
        return getattr(p, name, 0) if hasattr(p, name) else self.block.words.get(f"peer{slot}.{name}", 0)

    def incr_peer(self, slot: int, name: str, delta: int = 1) -> int:
        return self.incr(f"peer{slot}.{name}", delta)

    def beat(self, role: str, now_ms: int | None = None) -> None:
        self.block.words["beat:" + role] = self.node.clock() if now_ms is None else now_ms

    def last_beat(self, role: str) -> int:
        return self.block.words.get("beat:" + role, 0)

    def repair_seqs(self, role: str) -> list[str]:
        return []

    def bump_generation(self) -> int:
        return self.incr("generation")

    def close(self) -> None:
        pass


class SimLock:
    """The member lock: re-entrant for its holder; a second holder is a simulator bug (the
    scheduler never runs a lock-taking actor while another actor of the node holds it)."""

    def __init__(self, sim: Sim, node: Node) -> None:
        self.sim = sim
        self.node = node
        self.holder: Actor | None = None
        self.depth = 0
        self.timeout = None

    def acquire(self, timeout: float | None = None) -> None:
        me = self.sim.current()
        if self.holder is not None and self.holder is not me:
            raise AssertionError(f"simulator: {me.key} takes the member lock held by {self.holder.key}")
        self.holder = me
        self.depth += 1

    def release(self) -> None:
        self.depth -= 1
        if self.depth <= 0:
            self.depth = 0
            self.holder = None

    def drop(self, actor: Actor) -> None:
        """The holder died: the kernel drops an flock with its last descriptor."""
        if self.holder is actor:
            self.holder = None
            self.depth = 0

    @property
    def held(self) -> bool:
        return self.holder is not None and self.holder is self.sim.current()

    def close(self) -> None:
        pass

    def __enter__(self) -> SimLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class MemReader:
    """StoreReader's interface over a node's MemoryStore (memory mode): a reader in another
    process sees the writer's store as it is now, bounded by the end it was given."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def _store(self):  # noqa: ANN202
        s = self.node.memstore
        if s is None:
            raise StaleRead("no store")
        return s

    def follow_begin(self, ledger_begin_index: int) -> None:
        pass

    def refresh(self) -> None:
        pass

    def begin(self, generation: int) -> None:
        g = getattr(self._store, "generation", generation)
        if g != generation or g & 1:
            raise StaleRead(f"store generation {g}, expected {generation}")

    def validate(self, generation: int) -> None:
        self.begin(generation)

    def term_at(self, index: int) -> int:
        try:
            return self._store.term_at(index)
        except StoreError as e:
            raise StaleRead(str(e)) from e

    def get_run(self, index: int, end_index: int, max_count: int,
                max_bytes: int) -> tuple[memoryview, int, memoryview]:
        if index > end_index:
            raise StaleRead(f"index {index} beyond published end {end_index}")
        s = self._store
        try:
            blob, n = s.get_raw(index, min(max(max_count, 1), end_index - index + 1), max_bytes)
        except StoreError as e:
            raise StaleRead(str(e)) from e
        recs = []
        off = 0
        mv = memoryview(blob)
        for _ in range(n):
            h = codec.HEADER.unpack_from(mv, off)
            recs.append(codec.INDEX.pack(h[0], h[4], h[1], h[2], h[3]))
            off += h[1]
        return mv, n, memoryview(b"".join(recs))

    def get_raw(self, index: int, end_index: int, max_count: int, max_bytes: int) -> tuple[memoryview, int]:
        blob, n, _r = self.get_run(index, end_index, max_count, max_bytes)
        return blob, n

    def get(self, index: int, end_index: int) -> codec.Entry:
        blob, _n = self.get_raw(index, end_index, 1, 1)
        return codec.decode_entry(blob)

    def close(self) -> None:
        pass
