"""The shared block as the roles see it: one declared protocol, two implementations.

Why a protocol: every role reads and writes the node's block through the same few methods
(seqlocked groups read as one snapshot each, single-writer words, metrics observers). The
production block is node/block/shared_state.py's `SharedState` (a shared-memory mapping); the unit
tests and the simulator run the same role classes over node/block/memory_state.py's `MemoryState`
(plain attributes). Declaring the methods once lets a test hold both to it
(tests/unit/test_state_protocol.py), so a method a role starts calling cannot exist on one and
be missing, or take other arguments, on the other.

Only what the roles call is here; the supervisor's lifecycle (create/attach/unlink) and the
/metrics exporter's raw array reads stay SharedState's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from ipc.codes import Role
from node.block.shared_state import (
    ConfigWords,
    LedgerView,
    MemberView,
    PeerView,
    QuorumView,
    SnapshotView,
)


class Observer(Protocol):
    """A histogram's hot-path observer (node/observe/histogram.py's HistogramWriter)."""

    def observe(self, value: int) -> None: ...


class ReplyCounter(Protocol):
    """The handler's replies-by-type-and-code matrix (node/observe/request_counts.py)."""

    def count_reply(self, msg: object) -> None: ...


@runtime_checkable
class StateBlock(Protocol):
    """The methods and attributes of the shared block that role code uses.

    Invariant every implementation keeps: a ``read_*`` returns one consistent snapshot of its
    group (never fields of two writes), and a ``write_*`` publishes the whole group at once with
    omitted fields kept; ``role_epoch`` moves whenever role or term does.
    """

    n_peers: int
    self_slot: int

    # ---- seqlocked groups --------------------------------------------------------------------
    def read_member(self, timeout_s: float | None = None) -> MemberView: ...

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
    ) -> MemberView: ...

    def read_ledger(self, timeout_s: float | None = None) -> LedgerView: ...

    def read_ledger_config(self, timeout_s: float | None = None) -> tuple[LedgerView, ConfigWords]: ...

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
    ) -> LedgerView: ...

    def read_quorum(self, timeout_s: float | None = None) -> QuorumView: ...

    def write_quorum(self, *, quorum_index: int, quorum_term: int) -> QuorumView: ...

    def read_snapshot(self, timeout_s: float | None = None) -> SnapshotView: ...

    def write_snapshot(self, *, snapshot_index: int, snapshot_term: int) -> SnapshotView: ...

    def read_peer(self, slot: int, timeout_s: float | None = None) -> PeerView: ...

    def read_peers(self, timeout_s: float | None = None, slots: Iterable[int] | None = None) -> list[PeerView]: ...

    def reset_peer(self, slot: int) -> None: ...

    def write_peer(
        self,
        slot: int,
        *,
        match_index: int | None = None,
        match_term: int | None = None,
        alive: bool | None = None,
        last_ack_ms: int | None = None,
    ) -> None: ...

    # ---- single words ------------------------------------------------------------------------
    def get(self, name: str) -> int: ...

    def set(self, name: str, value: int) -> None: ...

    def incr(self, name: str, delta: int = 1) -> int: ...

    def word_writer(self, name: str) -> Callable[[int], None]: ...

    def get_peer(self, slot: int, name: str) -> int: ...

    def set_peer(self, slot: int, name: str, value: int) -> None: ...

    def incr_peer(self, slot: int, name: str, delta: int = 1) -> int: ...

    def beat(self, role: str, now_ms: int | None = None) -> None: ...

    def last_beat(self, role: str) -> int: ...

    def repair_seqs(self, role: str) -> list[str]: ...

    # ---- metrics observers (they decide nothing) ---------------------------------------------
    def histogram_writer(self, name: str) -> Observer: ...

    def peer_histogram_writer(self, slot: int, name: str) -> Observer: ...

    def request_counter(self) -> ReplyCounter: ...

    def close(self) -> None: ...
