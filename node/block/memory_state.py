"""The shared block in plain memory: node/block/state_protocol.py's `StateBlock` over attributes.

Why: the unit tests and the simulator (tools/sim) run the real role classes in one process;
both need a block with SharedState's semantics (a read is one snapshot of its group, a write
publishes the group with omitted fields kept, role_epoch moves with role or term, words are
the declared ones) but none of its mapping. One class serves both, so the two cannot drift.

`MemoryBlock` is the block itself (what ``SharedState.create`` initialises); a `MemoryState`
is one role's handle on it. Several handles may share one block, as the roles of a node share
its mapping. The handle has three hooks, no-ops here, that the simulator overrides to make a
read a preemption point and to record writes (tools/sim/state.py): `_read_point`,
`_write_point`, `_published`.

What is left out on purpose: the single-writer check (the simulator's actors are the real
roles, which the production block already holds to it) and the metrics arrays (observers
record nothing: metrics decide nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from ipc.codes import Role
from node.block.shared_state import (
    FIELDS,
    HISTOGRAMS,
    NO_INDEX,
    NO_SLOT,
    PEER_FIELDS,
    PEER_RECORDS,
    ConfigWords,
    LedgerView,
    MemberView,
    PeerView,
    QuorumView,
    SnapshotView,
    monotonic_ms,
)

_MEMBER_FIELDS = frozenset(f.name for f in dataclasses.fields(MemberView)) - {"role_epoch"}
_LEDGER_FIELDS = frozenset(f.name for f in dataclasses.fields(LedgerView))
_PEER_GROUP = frozenset(n for n, f in PEER_FIELDS.items() if f.group is not None)


class Unobserved:
    """A histogram observer or request counter of a memory block: metrics decide nothing, and
    this block has no arrays for them."""

    def observe(self, value: int) -> None:
        pass

    def count_reply(self, msg: object) -> None:
        pass


_UNOBSERVED = Unobserved()


class MemoryBlock:
    """One incarnation of a node's block, initialised as ``SharedState.create`` does (a node
    restart creates a new one)."""

    def __init__(self, n_peers: int, self_slot: int = 0) -> None:
        self.n_peers = n_peers
        self.self_slot = self_slot
        self.member = MemberView(Role.CANDIDATE, 0, NO_SLOT, NO_SLOT, NO_SLOT, 0, 0, 0)
        self.ledger = LedgerView(NO_INDEX, NO_INDEX, -1, NO_INDEX, 0)
        self.config = ConfigWords()  # the ledger group's configuration words
        self.quorum = QuorumView(NO_INDEX, -1)
        self.snapshot = SnapshotView(NO_INDEX, -1)  # the applier's newest snapshot
        # Every record the real block holds (members added later take slots past --peers).
        self.peers = [PeerView(p, NO_INDEX, -1, False, 0, 0, 0, 0, 0) for p in range(PEER_RECORDS)]
        self.words: dict[str, int] = {"repair_index": NO_INDEX}


def _word(name: str) -> str:
    """``name`` if the layout declares it as a word (a typo fails as it would on SharedState)."""
    f = FIELDS[name]  # KeyError, as SharedState's lookup
    if f.group is not None:
        raise ValueError(f"{name!r} is in group {f.group}; use the group's write_*() method")
    return name


def _peer_word(slot: int, name: str) -> str:
    if name in _PEER_GROUP:
        raise ValueError(f"{name!r} is in the peer group; use write_peer()")
    PEER_FIELDS[name]  # KeyError, as SharedState's lookup
    return f"peer{slot}.{name}"


class MemoryState:
    """One role's handle on a `MemoryBlock` (a fresh block of `n_peers` when none is given)."""

    def __init__(self, n_peers: int = 3, self_slot: int = 0, *, block: MemoryBlock | None = None,
                 clock: Callable[[], int] = monotonic_ms) -> None:
        self._block = block if block is not None else MemoryBlock(n_peers, self_slot)
        self.n_peers = self.block.n_peers
        self.self_slot = self.block.self_slot
        self.clock = clock
        self.read_retries = 0  # SharedState's statistic; a memory read never retries
        self.member_reads = 0  # how many member snapshots this handle took (tests count them)

    @property
    def block(self) -> MemoryBlock:
        return self._block

    # ---- hooks: the simulator's preemption points and trace ----------------------------------
    def _read_point(self) -> None:
        """Called after a group snapshot was taken, before it is returned."""

    def _write_point(self) -> None:
        """Called before a group write."""

    def _published(self, group: str, old: Any, new: Any) -> None:
        """Called after group ``group`` changed from ``old`` to ``new``."""

    # ---- the groups as attributes (tests set them directly, as another role would) -----------
    @property
    def member(self) -> MemberView:
        return self.block.member

    @member.setter
    def member(self, v: MemberView) -> None:
        self.block.member = v

    @property
    def ledger(self) -> LedgerView:
        return self.block.ledger

    @ledger.setter
    def ledger(self, v: LedgerView) -> None:
        self.block.ledger = v

    @property
    def quorum(self) -> QuorumView:
        return self.block.quorum

    @quorum.setter
    def quorum(self, v: QuorumView) -> None:
        self.block.quorum = v

    @property
    def snapshot(self) -> SnapshotView:
        return self.block.snapshot

    @snapshot.setter
    def snapshot(self, v: SnapshotView) -> None:
        self.block.snapshot = v

    @property
    def peers(self) -> list[PeerView]:
        return self.block.peers

    @property
    def words(self) -> dict[str, int]:
        return self.block.words

    # ---- reads: one snapshot each ------------------------------------------------------------
    def read_member(self, timeout_s: float | None = None) -> MemberView:
        self.member_reads += 1
        v = self.block.member
        self._read_point()
        return v

    def read_ledger(self, timeout_s: float | None = None) -> LedgerView:
        v = self.block.ledger
        self._read_point()
        return v

    def read_ledger_config(self, timeout_s: float | None = None) -> tuple[LedgerView, ConfigWords]:
        v = (self.block.ledger, self.block.config)
        self._read_point()
        return v

    def read_quorum(self, timeout_s: float | None = None) -> QuorumView:
        v = self.block.quorum
        self._read_point()
        return v

    def read_snapshot(self, timeout_s: float | None = None) -> SnapshotView:
        v = self.block.snapshot
        self._read_point()
        return v

    def _with_counters(self, p: PeerView) -> PeerView:
        """The group as written, plus the counters read after it (as SharedState.read_peer)."""
        w, pre = self.block.words, f"peer{p.slot}."
        return dataclasses.replace(p, beat_ms=w.get(f"beat:dispatcher[{p.slot}]", 0), **{
            n: w.get(pre + n, 0) for n in ("pushes_sent", "entries_pushed", "bytes_pushed", "match_pos")})

    def read_peer(self, slot: int, timeout_s: float | None = None) -> PeerView:
        v = self._with_counters(self.block.peers[slot])
        self._read_point()
        return v

    def read_peers(self, timeout_s: float | None = None, slots: Iterable[int] | None = None) -> list[PeerView]:
        wanted = set(range(self.n_peers) if slots is None else slots)  # as SharedState.read_peers
        v = [self._with_counters(p) for p in self.block.peers
             if p.slot != self.self_slot and p.slot in wanted]
        self._read_point()
        return v

    # ---- writes: the whole group at once, omitted fields kept --------------------------------
    def write_member(
        self,
        *,
        role: Role | None = None,
        current_term: int | None = None,
        leader_slot: int | None = None,
        voted_for_slot: int | None = None,
        transferee_slot: int | None = None,
        last_leader_heartbeat_ms: int | None = None,
        last_quorum_heartbeat_ms: int | None = None,
    ) -> MemberView:
        self._write_point()
        given = dict(role=role, current_term=current_term, leader_slot=leader_slot,
                     voted_for_slot=voted_for_slot, transferee_slot=transferee_slot,
                     last_leader_heartbeat_ms=last_leader_heartbeat_ms,
                     last_quorum_heartbeat_ms=last_quorum_heartbeat_ms)
        upd: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if "role" in upd:
            upd["role"] = Role(upd["role"])
        cur = self.block.member
        new = dataclasses.replace(cur, **upd)
        if new.role != cur.role or new.current_term != cur.current_term:
            new = dataclasses.replace(new, role_epoch=cur.role_epoch + 1)
        self.block.member = new
        self._published("member", cur, new)
        return new

    def write_ledger(
        self,
        *,
        ledger_begin_index: int | None = None,
        ledger_end_index: int | None = None,
        ledger_end_term: int | None = None,
        committed_index: int | None = None,
        store_generation: int | None = None,
        config_index: int | None = None,
        config_voters: int | None = None,
        config_learners: int | None = None,
    ) -> LedgerView:
        self._write_point()
        given = dict(ledger_begin_index=ledger_begin_index, ledger_end_index=ledger_end_index,
                     ledger_end_term=ledger_end_term, committed_index=committed_index,
                     store_generation=store_generation)
        words = dict(config_index=config_index, config_voters=config_voters,
                     config_learners=config_learners)
        cur = self.block.ledger
        new = dataclasses.replace(cur, **{k: v for k, v in given.items() if v is not None})
        if any(v is not None for v in words.values()):  # one write with the ledger: one group
            self.block.config = dataclasses.replace(self.block.config,
                                                    **{k: v for k, v in words.items() if v is not None})
        self.block.ledger = new
        self._published("ledger", cur, new)
        return new

    def write_quorum(self, *, quorum_index: int, quorum_term: int) -> QuorumView:
        self._write_point()
        cur, new = self.block.quorum, QuorumView(quorum_index, quorum_term)
        self.block.quorum = new
        self._published("quorum", cur, new)
        return new

    def write_snapshot(self, *, snapshot_index: int, snapshot_term: int) -> SnapshotView:
        self._write_point()
        cur, new = self.block.snapshot, SnapshotView(snapshot_index, snapshot_term)
        self.block.snapshot = new
        self._published("snapshot", cur, new)
        return new

    def write_peer(
        self,
        slot: int,
        *,
        match_index: int | None = None,
        match_term: int | None = None,
        alive: bool | None = None,
        last_ack_ms: int | None = None,
    ) -> None:
        self._write_point()
        upd: dict[str, Any] = {}
        if match_index is not None:
            upd["match_index"] = match_index
        if match_term is not None:
            upd["match_term"] = match_term
        if alive is not None:
            upd["alive"] = bool(alive)
        if last_ack_ms is not None:
            upd["last_ack_ms"] = last_ack_ms
        cur = self.block.peers[slot]
        new = dataclasses.replace(cur, **upd)
        self.block.peers[slot] = new
        self._published("peer", cur, new)

    def reset_peer(self, slot: int) -> None:
        """supervisor: clear a released slot's watermark (SharedState.reset_peer)."""
        self._write_point()
        cur = self.block.peers[slot]
        new = dataclasses.replace(cur, match_index=NO_INDEX, match_term=NO_INDEX, alive=False,
                                  last_ack_ms=0)
        self.block.peers[slot] = new
        self._published("peer", cur, new)

    # ---- single words ------------------------------------------------------------------------
    def get(self, name: str) -> int:
        """Any declared field, as SharedState.get reads one word (a group's field too)."""
        f = FIELDS[name]  # KeyError, as SharedState's lookup
        b = self.block
        if name in ("n_peers", "self_slot"):
            return getattr(b, name)
        if f.group is not None and hasattr(getattr(b, f.group), name):
            return int(getattr(getattr(b, f.group), name))
        return b.words.get(name, 0)

    def set(self, name: str, value: int) -> None:
        self.block.words[_word(name)] = value

    def incr(self, name: str, delta: int = 1) -> int:
        w = self.block.words
        v = w.get(_word(name), 0) + delta
        w[name] = v
        return v

    def word_writer(self, name: str) -> Callable[[int], None]:
        key, words = _word(name), self.block.words
        return lambda value: words.__setitem__(key, value)

    def get_peer(self, slot: int, name: str) -> int:
        if name in _PEER_GROUP:
            return int(getattr(self.block.peers[slot], name))
        if name == "beat_ms":
            return self.last_beat(f"dispatcher[{slot}]")
        return self.block.words.get(_peer_word(slot, name), 0)

    def set_peer(self, slot: int, name: str, value: int) -> None:
        self.block.words[_peer_word(slot, name)] = value

    def incr_peer(self, slot: int, name: str, delta: int = 1) -> int:
        key = _peer_word(slot, name)
        w = self.block.words
        v = w.get(key, 0) + delta
        w[key] = v
        return v

    def beat(self, role: str, now_ms: int | None = None) -> None:
        self.block.words["beat:" + role] = self.clock() if now_ms is None else now_ms

    def last_beat(self, role: str) -> int:
        return self.block.words.get("beat:" + role, 0)

    def repair_seqs(self, role: str) -> list[str]:
        return []  # a memory write is never torn

    def bump_generation(self) -> int:
        w = self.block.words
        w["generation"] = w.get("generation", 0) + 1
        return w["generation"]

    # ---- metrics observers -------------------------------------------------------------------
    def histogram_writer(self, name: str) -> Unobserved:
        HISTOGRAMS[name]  # KeyError, as SharedState's lookup
        return _UNOBSERVED

    def peer_histogram_writer(self, slot: int, name: str) -> Unobserved:
        HISTOGRAMS[name]
        return _UNOBSERVED

    def request_counter(self) -> Unobserved:
        return _UNOBSERVED

    def read_histogram(self, name: str, slot: int | None = None) -> tuple[Any, tuple[int, ...], int]:
        """As SharedState's, of a histogram nothing observes here: every bucket empty (a
        METADATA status trailer asked of a memory block)."""
        spec = HISTOGRAMS[name]
        return spec, (0,) * (len(spec.bounds) + 1), 0

    def close(self) -> None:
        pass
