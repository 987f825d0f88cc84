"""Fixed-bucket histograms that live in the shared state block (node/block/shared_state.py).

Why fixed buckets in shared memory: the roles that observe latencies (handler, dispatchers, the
store's flush thread) must not take a lock or send a message per observation, and the process
that serves /metrics (the supervisor) must read them without asking anyone. A histogram is
therefore ``len(bounds) + 2`` int64 words with one writer: one *non-cumulative* count per bucket
(the last one is ``+Inf``) and the sum of the observed values. An observation is one bisect
and two plain read-add-stores, safe because the words have one writer (the block's rule).

Values are integers in the histogram's own unit (``scale`` converts them to Prometheus' base
unit: ms -> seconds is 1e-3). The reader cumulates the buckets at scrape time; buckets and sum
are read without a seqlock, so a scrape may see a count whose value is not yet in the sum (one
observation's worth of skew, never a torn word): fine for monitoring, never used for decisions.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """One histogram's name (block field and metric stem), upper bounds, unit and scale."""

    name: str
    bounds: tuple[int, ...]  # inclusive upper bounds, increasing; +Inf is implicit
    unit: str  # what the stored integers count: "ms", "us", "entries"
    scale: float  # stored value * scale = the value in the metric's base unit

    @property
    def words(self) -> int:
        """Block words taken: one count per bucket (+Inf included) and the sum."""
        return len(self.bounds) + 2


LATENCY_MS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
FSYNC_US: Final = (100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000,
                   1_000_000)
BATCH_ENTRIES: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

APPEND_LATENCY: Final = HistogramSpec("append_latency_ms", LATENCY_MS, "ms", 1e-3)
"""Handler, leader: an append request's received -> committed time (one per reply)."""
APPEND_BATCH: Final = HistogramSpec("append_batch_entries", BATCH_ENTRIES, "entries", 1.0)
"""Handler, leader: entries per store write (a BATCH_APPEND, or a MULTI's run of APPENDs)."""
FSYNC_LATENCY: Final = HistogramSpec("fsync_us", FSYNC_US, "us", 1e-6)
"""Handler process (the store's flushes): fdatasync of the data and index files."""
REPLICATION_LATENCY: Final = HistogramSpec("replication_latency_ms", LATENCY_MS, "ms", 1e-3)
"""dispatcher[p]: an APPEND push's send -> successful answer."""

NODE_HISTOGRAMS: Final = (APPEND_LATENCY, APPEND_BATCH, FSYNC_LATENCY)
PEER_HISTOGRAMS: Final = (REPLICATION_LATENCY,)


def bucket_index(bounds: tuple[int, ...], value: int) -> int:
    """The bucket ``value`` falls in: the first bound >= value (Prometheus ``le``), else +Inf."""
    return bisect_left(bounds, value)


def cumulative(counts: tuple[int, ...] | list[int]) -> list[int]:
    """Per-bucket counts -> Prometheus' cumulative ``le`` counts (the last one is the total)."""
    out, total = [], 0
    for c in counts:
        total += c
        out.append(total)
    return out


def quantile(bounds: tuple[int, ...], counts: tuple[int, ...] | list[int], q: float) -> float | None:
    """Estimate the ``q`` quantile (0..1) from per-bucket counts, as PromQL's
    ``histogram_quantile`` does (linear within the bucket; the +Inf bucket answers its lower
    bound). None when there is no observation. Used by `dledger top` on count *deltas*."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lo = 0 if i == 0 else bounds[i - 1]
            return lo + (bounds[i] - lo) * (rank - seen) / c
        seen += c
    return float(bounds[-1])


class HistogramWriter:
    """A histogram bound to its words in a block's ``memoryview.cast("q")``: the hot-path
    observer (no dict lookups, no writer checks per call; the block checked them once)."""

    __slots__ = ("_w", "_base", "_sum", "_bounds")

    def __init__(self, words: memoryview, base_word: int, spec: HistogramSpec) -> None:
        self._w = words
        self._base = base_word
        self._sum = base_word + len(spec.bounds) + 1
        self._bounds = spec.bounds

    def observe(self, value: int) -> None:
        """Count one value (negative values, e.g. from a clock step, count as 0)."""
        if value < 0:
            value = 0
        w = self._w
        i = self._base + bisect_left(self._bounds, value)
        w[i] = w[i] + 1
        s = self._sum
        w[s] = w[s] + value
