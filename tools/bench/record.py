"""What `dledger bench` measures, kept in memory bounded by the run's length, not its load.

Why HdrHistograms and not samples: the first bench appended a (time, latency, entries, op)
tuple per request and sorted them at the end — about 150 bytes a request, so an hour at
50,000 requests/s held 27 GB and the final sort took minutes. Here every latency goes into an
HdrHistogram (the library Gil Tene wrote for exactly this: fixed memory, every percentile to
3 significant digits from 1 µs to an hour). Recording is kept off the request path, because the
bench shares two cores with the group it measures and hdrh's `record_value` is pure Python
(~0.7 µs): a completion appends its latency to a flat `array('d')` of the second in progress
(~0.05 µs); when the next second starts, numpy collapses that second's values to distinct
microseconds and records each once with its count (a few ms a second), the second becomes a
small `Second` row, and its histogram is added into the measured window's (0.1 ms). Memory is
one second of latencies (8 bytes each), a few histograms of ~200 KiB, and one row per second.

Errors are counted by code (the figure the operator asks for: "which errors, how many"), and
the acknowledged indexes kept for the read-back are a uniform reservoir sample of the whole run,
not its first 200,000 (and 20,000 of them are plenty for a read-back of 1,000: a smaller
reservoir is also fewer replacements on the completion path).

Thread safety: completions arrive on the client's I/O thread (pipelined) or on the --mode sync
worker threads; every record takes one lock, and reads the clock inside it, so seconds roll
forward monotonically.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # an hour: a request slower than this is recorded as an hour
SIGNIFICANT_DIGITS = 3
ACKED_SAMPLE = 20_000  # acknowledged (index, seq) pairs kept for the read-back, at least


def new_histogram() -> HdrHistogram:
    """A latency histogram in microseconds (the unit every figure here is recorded in)."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def percentile_ms(h: HdrHistogram, q: float) -> float:
    """The q-th percentile (0..100) in milliseconds; 0.0 for an empty histogram."""
    return h.get_value_at_percentile(q) / 1000.0 if h.get_total_count() else 0.0


def _merge(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    """One histogram of several (the one itself when there is just one: no copy)."""
    hs = list(hists)
    if len(hs) == 1:
        return hs[0]
    out = new_histogram()
    for h in hs:
        out.add(h)
    return out


@dataclass(frozen=True, slots=True)
class Second:
    """One finished second, counted from the end of the warmup (negative during it)."""

    t: int
    entries: int  # entries (log) or ops (--kv) acknowledged in this second
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float


class Recorder:
    """Latencies, counts and errors of one bench run, thread-safe, bounded in memory."""

    def __init__(self, t0: float, measuring_from: float, ops: tuple[str, ...] = ("",),
                 verify_sample: int = 0) -> None:
        self.t0 = t0
        self.measuring_from = measuring_from
        self.lock = threading.Lock()
        # the measured window (from `measuring_from`)
        self.hist = {op: new_histogram() for op in ops}
        self.entries = dict.fromkeys(ops, 0)
        self.requests = 0
        self.errors_by_code: collections.Counter[str] = collections.Counter()
        self.last_done = measuring_from  # the last measured completion (the window's end)
        # the whole run, warmup included (for the live view and the preload check)
        self.errors_total = 0
        self.first_error: str | None = None
        self.seconds: list[Second] = []  # finished measured seconds, t = 0, 1, ...
        self.last_second: Second | None = None  # the newest finished second, warmup included
        self._sec: int | None = None
        self._sec_end = -math.inf  # when the second in progress ends (perf_counter)
        self._sec_lat = {op: array("d") for op in ops}  # latencies (s) of the second in progress
        self._sec_hists = {op: new_histogram() for op in ops}
        self._sec_entries = self._sec_requests = self._sec_errors = 0
        # acknowledged (first index, first seq) pairs: a uniform sample of the run (algorithm L),
        # 4x the read-back's size so that it survives retention deleting the oldest entries
        self.acked: list[tuple[int, int]] = []
        self.acked_cap = max(ACKED_SAMPLE, 4 * verify_sample)
        self._acked_seen = 0
        self._acked_next = 0  # the acknowledgement number that next enters a full reservoir
        self._acked_w = 1.0
        self._rng = random.Random(7)

    # ---- recording (any thread) ----------------------------------------------------------------
    def ok(self, sent: float, n: int, first_index: int, first_seq: int, op: str = "") -> None:
        """An acknowledged request of `n` entries sent at `sent` (perf_counter seconds).

        This runs once per completion on the client's I/O thread, which is what limits a
        pipelined single-append bench: every line here costs throughput."""
        with self.lock:
            now = time.perf_counter()
            self._count(now, now - sent, n, op)
            seen = self._acked_seen = self._acked_seen + 1
            if seen <= self.acked_cap:
                self.acked.append((first_index, first_seq))
                if seen == self.acked_cap:
                    self._skip()
            elif seen == self._acked_next:
                self.acked[self._rng.randrange(self.acked_cap)] = (first_index, first_seq)
                self._skip()

    def _skip(self) -> None:
        """Li's algorithm L: the next acknowledgement to enter the full reservoir, drawn once
        per replacement instead of a random number per request (the same uniform sample)."""
        rnd = self._rng.random
        self._acked_w *= math.exp(math.log(rnd() or 1e-300) / self.acked_cap)
        gap = math.floor(math.log(rnd() or 1e-300) / math.log1p(-self._acked_w)) if self._acked_w < 1 else 0
        self._acked_next = self._acked_seen + gap + 1

    def op_ok(self, sent: float, op: str) -> None:
        """An acknowledged --kv op (one per request; nothing to read back by index)."""
        with self.lock:
            now = time.perf_counter()
            self._count(now, now - sent, 1, op)

    def fail(self, e: BaseException) -> None:
        """A failed request, counted under its code name (the exception's class otherwise)."""
        code = getattr(e, "name", None) or type(e).__name__
        with self.lock:
            now = time.perf_counter()
            self._roll(now)
            self._sec_errors += 1
            self.errors_total += 1
            if self.first_error is None:
                self.first_error = code
            if now >= self.measuring_from:
                self.errors_by_code[code] += 1

    def _count(self, now: float, latency_s: float, n: int, op: str) -> None:
        """The per-request path (called with the lock held): a few attribute updates; the
        second's histogram work waits for `_roll`."""
        if now >= self._sec_end:
            self._roll(now)
        self._sec_lat[op].append(latency_s)
        self._sec_entries += n
        self._sec_requests += 1
        if now >= self.measuring_from:
            self.entries[op] += n
            self.requests += 1
            self.last_done = now

    def _roll(self, now: float) -> None:
        """Close the second in progress when `now` is in a later one (empty seconds between
        become zero rows: a stall shows as a stall)."""
        if now < self._sec_end:  # still the same second
            return
        s = math.floor(now - self.measuring_from)
        self._sec_end = self.measuring_from + s + 1
        if self._sec is None:
            self._sec = s
            return
        if s <= self._sec:  # float rounding at the boundary: still this second
            return
        self._drain()
        h = _merge(self._sec_hists.values())
        row = Second(self._sec, self._sec_entries, self._sec_requests, self._sec_errors,
                     percentile_ms(h, 50), percentile_ms(h, 99))
        self._keep(row)
        for t in range(max(self._sec + 1, s - 3600), s):  # a gap longer than an hour: its last hour
            self._keep(Second(t, 0, 0, 0, 0.0, 0.0))
        self._fold()
        self._sec = s
        self._sec_entries = self._sec_requests = self._sec_errors = 0

    def _drain(self) -> None:
        """Record the second's buffered latencies into its histograms, each distinct
        microsecond once with its count."""
        for op, buf in self._sec_lat.items():
            if not buf:
                continue
            us = np.clip((np.frombuffer(buf, dtype=np.float64) * 1e6).astype(np.int64), LOWEST_US, HIGHEST_US)
            values, counts = np.unique(us, return_counts=True)
            record = self._sec_hists[op].record_value
            for v, c in zip(values.tolist(), counts.tolist(), strict=True):
                record(v, c)
            del buf[:]

    def _fold(self) -> None:
        """Add the second in progress into the window (if it is measured) and clear it."""
        self._drain()
        for op, sh in self._sec_hists.items():
            if sh.get_total_count():
                if self._sec is not None and self._sec >= 0:
                    self.hist[op].add(sh)
                sh.reset()

    def _keep(self, row: Second) -> None:
        self.last_second = row
        if row.t >= 0:
            self.seconds.append(row)

    # ---- reading -------------------------------------------------------------------------------
    def close(self) -> None:
        """End of the run: the partial last second's latencies join the window (it gets no
        row: a partial second would look like a stall). Idempotent."""
        with self.lock:
            self._fold()

    def merged(self) -> HdrHistogram:
        """Every op's measured latencies in one histogram (after `close`)."""
        return _merge(self.hist.values())

    def live(self) -> tuple[Second | None, int]:
        """(the newest finished second, errors so far) for the live view."""
        with self.lock:
            self._roll(time.perf_counter())
            return self.last_second, self.errors_total
