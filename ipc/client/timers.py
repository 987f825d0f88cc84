"""The I/O thread's deadlines: one queue for every call's attempt deadline, backoff and
overall deadline, and for the leader discovery's round and restart timers.

Why a FIFO and a heap: deadlines set in non-decreasing order (every call with the default
timeout) go to a FIFO, O(1) per append, where a heap of ~100k lazily-deleted entries was not;
only out-of-order deadlines go to the heap. Deletion is lazy: an object holds the sequence
number of its one live timer (`timer_seq`), and an entry whose number no longer matches is
stale and skipped. A stale entry only ever causes an early wake-up.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from typing import Any


class Timer:
    """A timer owner that is not a call (e.g. "start the next discovery round")."""

    __slots__ = ("timer_seq",)

    def __init__(self) -> None:
        self.timer_seq = -1


class TimerQueue:
    """Timers of objects with a `timer_seq` attribute; one live timer per object."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []  # out-of-order deadlines
        self._fifo: collections.deque[tuple[float, int, Any]] = collections.deque()
        self._seq = itertools.count()

    def set(self, obj: Any, at: float, live: int) -> None:
        """Arm `obj`'s timer at `at` (replacing any it had). `live`: how many calls are live,
        to tell when the heap is mostly stale entries and worth pruning."""
        seq = next(self._seq)
        obj.timer_seq = seq
        fifo = self._fifo
        if not fifo or at >= fifo[-1][0]:
            fifo.append((at, seq, obj))
            return
        heap = self._heap
        heapq.heappush(heap, (at, seq, obj))
        if len(heap) > 65536 and len(heap) > 8 * (live + 8):
            # Completed calls leave their timer entries behind (lazy deletion): prune.
            heap[:] = [t for t in heap if t[2].timer_seq == t[1]]
            heapq.heapify(heap)

    def next_due(self) -> float | None:
        """The earliest timer (stale entries included: they only cause an early wake-up)."""
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][2].timer_seq != fifo[0][1]:
            fifo.popleft()  # completed calls: dropped as they reach the head
        if fifo:
            return min(fifo[0][0], heap[0][0]) if heap else fifo[0][0]
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> Any | None:
        """The owner of the earliest live timer due at `now` (its timer now disarmed), or None."""
        while (t := self._pop(now)) is not None:
            _at, seq, obj = t
            if obj.timer_seq != seq:
                continue  # stale: the call completed or moved on
            obj.timer_seq = -1
            return obj
        return None

    def _pop(self, now: float) -> tuple[float, int, Any] | None:
        fifo, heap = self._fifo, self._heap
        if fifo and fifo[0][0] <= now and (not heap or fifo[0][0] <= heap[0][0]):
            return fifo.popleft()
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)
        return None
