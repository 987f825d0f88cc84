"""What the handler and the dispatchers record for /metrics, kept out of their loops.

Why a module of its own: the roles' hot paths should gain one call each, not the details of
which block words a metric uses. Everything here writes the shared block only (lock-free
words with this process as their one writer, docs/shared_state.md): nothing is sent, nothing
is locked, and the process that serves /metrics reads the words at scrape time. The
simulator's and the unit tests' blocks implement the same methods (their observers record
nothing): metrics take part in no decision.
"""

from __future__ import annotations

from collections.abc import Iterable

from node.block.state_protocol import Observer, StateBlock
from node.core.pending import Pending
from node.store.base import LogStore


def histogram(state: StateBlock, name: str, slot: int | None = None) -> Observer:
    """The observer of histogram `name` (peer `slot`'s when given)."""
    return state.histogram_writer(name) if slot is None else state.peer_histogram_writer(slot, name)


def set_peer_word(state: StateBlock, slot: int, name: str, value: int) -> None:
    """Peer `slot`'s lock-free word `name`."""
    state.set_peer(slot, name, value)


def store_end_pos(store: LogStore) -> int:
    """The store's data write position (bytes ever written, minus truncations)."""
    return store.data_end_pos


class HandlerMetrics:
    """The handler's observations: append latency (received -> committed, per reply), entries
    per store write, bytes appended, pending entries, replies by type and code, fsync time."""

    def __init__(self, state: StateBlock, max_wait_ack_ms: int) -> None:
        self.state = state
        self.max_wait_ack_ms = max_wait_ack_ms
        self.latency = histogram(state, "append_latency_ms")
        self.batch = histogram(state, "append_batch_entries")
        self.fsync = histogram(state, "fsync_us")
        self.requests = state.request_counter()
        self._set_end_pos = state.word_writer("ledger_end_pos")
        self._set_pending = state.word_writer("pending_appends")

    def watch_store(self, store: LogStore) -> None:
        """Have the store time its fdatasyncs into `fsync_us`."""
        store.flush_observer = self.fsync.observe

    def completed(self, now_ms: int, due: Iterable[tuple[int, int, Pending]]) -> None:
        """Replies answered SUCCESS at `now_ms`: each one's received -> committed time. The
        receive time is its deadline minus max_wait_ack_ms (the table keeps no other stamp)."""
        obs, wait = self.latency.observe, self.max_wait_ack_ms
        for _term, _last, p in due:
            obs(now_ms - (p.deadline_ms - wait))

    def wrote(self, entries: int, nbytes: int) -> None:
        """One leader store write of `entries` entries taking `nbytes` of the data files."""
        self.batch.observe(entries)
        self.state.incr("bytes_appended", nbytes)

    def published(self, end_pos: int) -> None:
        """The ledger end's data position (with a follower's match_pos: its lag in bytes)."""
        self._set_end_pos(end_pos)

    def pending(self, entries: int) -> None:
        """Entries written and waiting for a quorum, once per loop turn."""
        self._set_pending(entries)
