"""The handler's side of append results (a node with a state machine), as data.

With a state machine an append is answered once its entries are committed *and applied*, with
what `apply` returned. The applier sends the results of every run it applies (whatever this
node's role: a new leader then already holds the results of recent entries, and answers a
client's retry of one of them with the original result). The handler keeps the newest of them
in a bounded `ResultCache` and parks committed replies in `AwaitingResults` until the results
of all their entries are in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

DEFAULT_RESULT_CACHE = 100_000
"""Results kept for retries: a retry of an entry older than this is answered without one."""

EVICTED = "evicted"


class ResultCache:
    """Results by index for the newest `max_entries` applied entries (None for NOOPs and for
    entries whose `apply` returned None)."""

    def __init__(self, max_entries: int = DEFAULT_RESULT_CACHE) -> None:
        self.max_entries = max_entries
        self._by_index: OrderedDict[int, bytes | None] = OrderedDict()
        self.high = -1  # the highest index whose result arrived
        self.low_water = 0  # results below this were evicted (or never seen by this handler)

    def put(self, first_index: int, results: Sequence[bytes | None]) -> None:
        if first_index > self.high + 1 and self._by_index:
            # A gap (results lost on the way, or a restarted applier): what lies below the
            # gap can no longer be completed; start afresh from here.
            self._by_index.clear()
        if not self._by_index:
            self.low_water = first_index
        for k, r in enumerate(results):
            i = first_index + k
            if i > self.high:
                self._by_index[i] = r
                self.high = i
        while len(self._by_index) > self.max_entries:
            i, _ = self._by_index.popitem(last=False)
            self.low_water = i + 1

    def lookup(self, first: int, last: int) -> list[bytes | None] | str | None:
        """The results of first..last; None if some have not arrived yet; EVICTED if some are
        older than what the cache holds (they will never arrive)."""
        if first < self.low_water:
            return EVICTED
        if last > self.high:
            return None
        return [self._by_index[i] for i in range(first, last + 1)]

    def reset(self) -> None:
        self._by_index.clear()
        self.high = -1
        self.low_water = 0


RESULTS_GRACE_MS = 2_000
"""A parked reply whose entries the shared block has shown applied for this long gets no
results any more (they were sent before this handler started, or lost): it is answered
without them."""


class AwaitingResults:
    """Committed replies parked until their entries' results arrive, keyed by last index."""

    def __init__(self) -> None:
        self._items: list[tuple[int, int, Any]] = []  # (last index, term, reply)
        self._applied_seen: dict[int, int] = {}  # id(reply) -> when its entries were first seen applied

    def __len__(self) -> int:
        return len(self._items)

    def park(self, term: int, last: int, reply: Any) -> None:
        self._items.append((last, term, reply))

    def stale(self, now_ms: int, applied_index: int,
              grace_ms: int = RESULTS_GRACE_MS) -> list[tuple[int, int, Any]]:
        """(term, last, reply) of parked replies whose entries have been applied
        (`applied_index` from the shared block) for `grace_ms` without their results coming:
        a handler restarted after the applier sent them, in an idle group, would otherwise
        wait for the next results for ever. The grace counts from the first call that saw them
        applied, so results still on their way (the applier publishes the index, then sends)
        are never overtaken. Removed from the parked set."""
        out, keep = [], []
        for last, term, reply in self._items:
            if last <= applied_index:
                seen = self._applied_seen.setdefault(id(reply), now_ms)
                if now_ms - seen >= grace_ms:
                    self._applied_seen.pop(id(reply), None)
                    out.append((term, last, reply))
                    continue
            keep.append((last, term, reply))
        self._items = keep
        return out

    def release(self, cache: ResultCache) -> list[tuple[int, int, Any, list[bytes | None] | None]]:
        """(term, last, reply, results or None when evicted) of every parked reply whose results
        are now known; the others stay parked."""
        out, keep = [], []
        for last, term, reply in self._items:
            got = cache.lookup(reply.first_index, last)
            if got is None:
                keep.append((last, term, reply))
            else:
                self._applied_seen.pop(id(reply), None)
                out.append((term, last, reply, None if got == EVICTED else got))
        self._items = keep
        return out

    def drain(self) -> list[tuple[int, int, Any]]:
        items, self._items = self._items, []
        self._applied_seen.clear()
        return [(term, last, reply) for last, term, reply in items]
