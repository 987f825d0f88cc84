"""What `dledger bench` measures, kept in memory bounded by the run's length, not its load.

Why HdrHistograms and not samples: the first bench appended a (time, latency, entries, op)
tuple per request and sorted them at the end — about 150 bytes a request, so an hour at
50,000 requests/s held 27 GB and the final sort took minutes. Here every latency goes into an
HdrHistogram (the library Gil Tene wrote for exactly this: fixed memory, every percentile to
3 significant digits from 1 µs to an hour, ~0.7 µs a record), one for the measured window (one
per op for `--kv --kv-op mixed`) and one for the second in progress, which becomes a small
`Second` row when the next second starts. Memory is a few hundred KiB plus one row per second.

Errors are counted by code (the figure the operator asks for: "which errors, how many"), and
the acknowledged indexes kept for the read-back are a uniform reservoir sample of the whole run,
not its first 200,000.

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
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # an hour: a request slower than this is recorded as an hour
SIGNIFICANT_DIGITS = 3
ACKED_SAMPLE = 200_000  # acknowledged (index, seq) pairs kept for the read-back


def new_histogram() -> HdrHistogram:
    """A latency histogram in microseconds (the unit every figure here is recorded in)."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def _us(seconds: float) -> int:
    return min(max(int(seconds * 1e6), LOWEST_US), HIGHEST_US)


def percentile_ms(h: HdrHistogram, q: float) -> float:
    """The q-th percentile (0..100) in milliseconds; 0.0 for an empty histogram."""
    return h.get_value_at_percentile(q) / 1000.0 if h.get_total_count() else 0.0


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

    def __init__(self, t0: float, measuring_from: float, ops: tuple[str, ...] = ("",)) -> None:
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
        self._sec_hist = new_histogram()
        self._sec_entries = self._sec_requests = self._sec_errors = 0
        # acknowledged (first index, first seq) pairs: a uniform sample (Vitter's algorithm R)
        self.acked: list[tuple[int, int]] = []
        self._acked_seen = 0
        self._rng = random.Random(7)

    # ---- recording (any thread) ----------------------------------------------------------------
    def ok(self, sent: float, n: int, first_index: int, first_seq: int, op: str = "") -> None:
        """An acknowledged request of `n` entries sent at `sent` (perf_counter seconds)."""
        with self.lock:
            now = time.perf_counter()
            self._count(now, now - sent, n, op)
            self._acked_seen += 1
            if len(self.acked) < ACKED_SAMPLE:
                self.acked.append((first_index, first_seq))
            else:
                j = self._rng.randrange(self._acked_seen)
                if j < ACKED_SAMPLE:
                    self.acked[j] = (first_index, first_seq)

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
        self._roll(now)
        us = _us(latency_s)
        self._sec_hist.record_value(us)
        self._sec_entries += n
        self._sec_requests += 1
        if now >= self.measuring_from:
            self.hist[op].record_value(us)
            self.entries[op] += n
            self.requests += 1
            self.last_done = now

    def _roll(self, now: float) -> None:
        """Close the second in progress when `now` is in a later one (empty seconds between
        become zero rows: a stall shows as a stall)."""
        s = math.floor(now - self.measuring_from)
        if self._sec is None:
            self._sec = s
            return
        if s <= self._sec:
            return
        h = self._sec_hist
        row = Second(self._sec, self._sec_entries, self._sec_requests, self._sec_errors,
                     percentile_ms(h, 50), percentile_ms(h, 99))
        self._keep(row)
        for t in range(max(self._sec + 1, s - 3600), s):  # a gap longer than an hour: its last hour
            self._keep(Second(t, 0, 0, 0, 0.0, 0.0))
        h.reset()
        self._sec = s
        self._sec_entries = self._sec_requests = self._sec_errors = 0

    def _keep(self, row: Second) -> None:
        self.last_second = row
        if row.t >= 0:
            self.seconds.append(row)

    # ---- reading -------------------------------------------------------------------------------
    def merged(self) -> HdrHistogram:
        """Every op's measured latencies in one histogram."""
        ops = list(self.hist.values())
        if len(ops) == 1:
            return ops[0]
        out = new_histogram()
        for h in ops:
            out.add(h)
        return out

    def live(self) -> tuple[Second | None, int]:
        """(the newest finished second, errors so far) for the live view."""
        with self.lock:
            self._roll(time.perf_counter())
            return self.last_second, self.errors_total
