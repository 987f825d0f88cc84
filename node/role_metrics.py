"""What the handler and the dispatchers record for /metrics, kept out of their loops.

Why a module of its own: the roles' hot paths should gain one call each, not the details of
which block words a metric uses. Everything here writes the shared block only (lock-free
words with this process as their one writer, docs/shared_state.md): nothing is sent, nothing
is locked, and the process that serves /metrics reads the words at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from node.core.pending import Pending
from node.shared_state import SharedState


class _NoOp:
    """Stands in for the block's observers on a state without metrics arrays (the simulator's
    and the unit tests' fake blocks): metrics take part in no decision."""

    def observe(self, value: int) -> None:
        pass

    def count_reply(self, msg: object) -> None:
        pass


def histogram(state: Any, name: str, slot: int | None = None) -> Any:
    """The observer of histogram `name` (peer `slot`'s when given), or a no-op on a fake."""
    if slot is None:
        fn = getattr(state, "histogram_writer", None)
        return fn(name) if fn is not None else _NoOp()
    fn = getattr(state, "peer_histogram_writer", None)
    return fn(slot, name) if fn is not None else _NoOp()


def set_peer_word(state: Any, slot: int, name: str, value: int) -> None:
    """Peer `slot`'s lock-free word `name` (a fake block without it is left alone)."""
    fn = getattr(state, "set_peer", None)
    if fn is not None:
        fn(slot, name, value)


def store_end_pos(store: Any) -> int:
    """The store's data write position (bytes ever written, minus truncations), 0 if unknown
    (a memory fake has no data file)."""
    data = getattr(store, "data", None)
    return int(getattr(data, "wrote_position", 0) or 0)


class HandlerMetrics:
    """The handler's observations: append latency (received -> committed, per reply), entries
    per store write, bytes appended, pending entries, replies by type and code, fsync time."""

    def __init__(self, state: SharedState, max_wait_ack_ms: int) -> None:
        self.state = state
        self.max_wait_ack_ms = max_wait_ack_ms
        self.latency = histogram(state, "append_latency_ms")
        self.batch = histogram(state, "append_batch_entries")
        self.fsync = histogram(state, "fsync_us")
        rc = getattr(state, "request_counter", None)
        self.requests = rc() if rc is not None else _NoOp()
        ww = getattr(state, "word_writer", None)
        self._set_end_pos = ww("ledger_end_pos") if ww else (lambda v: state.set("ledger_end_pos", v))
        self._set_pending = ww("pending_appends") if ww else (lambda v: state.set("pending_appends", v))

    def watch_store(self, store: Any) -> None:
        """Have the store time its fdatasyncs into `fsync_us` (a store without the hook, such as
        the memory fake, is left alone)."""
        if hasattr(store, "flush_observer"):
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
