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

from typing import TYPE_CHECKING, Any

from node.block.memory_state import MemoryBlock, MemoryState
from node.store import codec
from node.store.base import StoreError
from node.store.reader import StaleRead

if TYPE_CHECKING:  # pragma: no cover
    from tools.sim.actors import Actor
    from tools.sim.config import Node
    from tools.sim.world import Sim


class NodeBlock(MemoryBlock):
    """One incarnation of a node's shared block (a node restart creates a new one)."""


class SimState(MemoryState):
    """One actor's handle on its node's block: node/block/memory_state.py's MemoryState, with every
    read a preemption point and every write a scheduling point the trace records."""

    def __init__(self, sim: Sim, node: Node, actor: Actor) -> None:
        self.sim = sim
        self.node = node
        self.actor = actor
        super().__init__(block=node.block, clock=node.clock)

    @property
    def block(self) -> MemoryBlock:
        return self.node.block  # a node restart replaces it: every handle follows

    def _read_point(self) -> None:
        self.sim.preempt(self.actor)

    def _write_point(self) -> None:
        self.sim.at_write(self.actor)

    def _published(self, group: str, old: Any, new: Any) -> None:
        if group == "member":
            self.sim.on_member_write(self.node, old, new)
        elif group == "ledger":
            self.sim.on_ledger_write(self.node, old, new)
        elif group == "quorum":
            self.sim.trace_event(self.actor.key, "quorum", (new.quorum_index, new.quorum_term))
            self.sim.on_quorum_write(self.node, new.quorum_index, new.quorum_term)
        elif group == "snapshot":
            self.sim.trace_event(self.actor.key, "snapshot", (new.snapshot_index, new.snapshot_term))


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
