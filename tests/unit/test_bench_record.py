"""The bench's Recorder (tools/bench/record.py) and summary (tools/commands/bench.summarize) on a
controlled clock: percentiles within HdrHistogram's 3 significant digits of the exact ones,
per-second rows as the old sample-keeping bench made them, errors by code, bounded memory."""

from __future__ import annotations

import argparse
import math
import random

import pytest

import tools.bench.record as br
from tools.commands.bench import summarize


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def perf_counter(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(br, "time", c)
    return c


def _args(**kw) -> argparse.Namespace:
    base = dict(size=100, duration=10.0, count=None, concurrency=1, batch=1, mode="async", warmup=1.0,
                local=3, peers=None, kv=False)
    base.update(kw)
    return argparse.Namespace(**base)


def _exact(vals: list[float], q: float) -> float:
    """The nearest-rank percentile (HdrHistogram's definition)."""
    s = sorted(vals)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def test_percentiles_are_within_three_significant_digits_of_the_exact_ones(clock):
    rec = br.Recorder(t0=100.0, measuring_from=100.0)
    rnd = random.Random(3)
    lats = [rnd.lognormvariate(-6, 1.0) for _ in range(20_000)]  # ~2.5 ms median, long tail
    for i, lat in enumerate(lats):
        clock.t = 100.0 + i * 1e-4
        rec.ok(clock.t - lat, 1, i, i)
    res = summarize(rec, _args(warmup=0.0))
    ms = [x * 1000 for x in lats]
    for key, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        assert res[key] == pytest.approx(_exact(ms, q), rel=2e-3), key
    assert res["max_ms"] == pytest.approx(max(ms), rel=1e-3)


def test_seconds_skip_the_warmup_keep_a_stall_and_drop_the_partial_last_second(clock):
    rec = br.Recorder(t0=100.0, measuring_from=101.0)  # one second of warmup
    done = [100.2, 100.7,            # warmup: neither counted nor a row
            101.1, 101.5, 101.9,     # t=0: three
            102.3,                   # t=1: one
            # t=2: a stall
            104.4, 104.6,            # t=3: two
            105.2]                   # t=4: partial (the window ends at 105.2)
    for i, t in enumerate(done):
        clock.t = t
        rec.ok(t - 0.002, 10, i * 10, i * 10)
    clock.t = 101.6
    res = summarize(rec, _args(batch=10))
    assert [(s["t"], s["entries"]) for s in res["samples"]] == [(0, 30), (1, 10), (2, 0), (3, 20)]
    assert res["entries"] == 70 and res["seconds"] == pytest.approx(4.2)
    assert res["requests_per_s"] == pytest.approx(7 / 4.2)
    assert res["samples"][0]["p50_ms"] == pytest.approx(2.0, rel=2e-3)


class Coded(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def test_errors_are_counted_by_code_in_the_window_and_per_second(clock):
    rec = br.Recorder(t0=100.0, measuring_from=101.0)
    clock.t = 100.5
    rec.fail(Coded("NOT_LEADER"))  # warmup: live count only
    for t, code in ((101.2, "TIMEOUT"), (101.3, "NOT_LEADER"), (101.4, "NOT_LEADER")):
        clock.t = t
        rec.fail(Coded(code))
    clock.t = 101.5
    rec.fail(ValueError("no code"))
    for t in (101.6, 102.5):
        clock.t = t
        rec.ok(t - 0.001, 1, 0, 0)
    res = summarize(rec, _args())
    assert res["errors_by_code"] == {"NOT_LEADER": 2, "TIMEOUT": 1, "ValueError": 1}
    assert res["errors"] == 4 and res["error_rate"] == pytest.approx(4 / 6)
    assert res["samples"][0]["errors"] == 4
    assert rec.errors_total == 5 and rec.first_error == "NOT_LEADER"


def test_mixed_ops_have_their_own_figures_and_merge_for_the_total(clock):
    rec = br.Recorder(t0=0.0, measuring_from=0.0, ops=("put", "get"))
    for i in range(1000):
        clock.t = 0.001 * i
        rec.op_ok(clock.t - (0.010 if i % 2 else 0.001), "get" if i % 2 else "put")
    res = summarize(rec, _args(kv=True, kv_op="mixed", keys=10, warmup=0.0))
    assert res["by_op"]["put"]["p50_ms"] == pytest.approx(1.0, rel=2e-3)
    assert res["by_op"]["get"]["p50_ms"] == pytest.approx(10.0, rel=2e-3)
    assert res["ops"] == 1000 and res["p99_ms"] == pytest.approx(10.0, rel=2e-3)


def test_the_read_back_sample_is_bounded_and_drawn_from_the_whole_run(clock, monkeypatch):
    monkeypatch.setattr(br, "ACKED_SAMPLE", 1000)
    rec = br.Recorder(t0=0.0, measuring_from=0.0, verify_sample=100)
    for i in range(20_000):
        clock.t = i * 1e-5
        rec.ok(clock.t, 1, i, i)
    assert len(rec.acked) == 1000
    firsts = sorted(f for f, _ in rec.acked)
    assert firsts[-1] > 15_000, "a prefix, not a sample of the run"
    assert 8_000 < firsts[500] < 12_000  # the median of a uniform sample of 0..20,000


def test_an_empty_run_reports_zeros_not_an_error(clock):
    rec = br.Recorder(t0=0.0, measuring_from=1.0)
    res = summarize(rec, _args())
    assert res["entries"] == 0 and res["p99_ms"] == 0.0 and res["samples"] == [] and res["errors"] == 0


def test_memory_does_not_grow_with_requests(clock):
    rec = br.Recorder(t0=0.0, measuring_from=0.0)
    for i in range(50_000):  # 50,000 requests in one second: one row, two histograms
        clock.t = i * 1e-5
        rec.op_ok(clock.t - 0.001, "")
    clock.t = 1.5
    rec.live()
    assert len(rec.seconds) == 1 and rec.seconds[0].requests == 50_000
    assert rec.acked == []  # ops (--kv) keep nothing per request


def test_the_read_back_sample_is_four_times_the_read_back(clock):
    assert br.Recorder(t0=0.0, measuring_from=0.0, verify_sample=50_000).acked_cap == 200_000
    assert br.Recorder(t0=0.0, measuring_from=0.0, verify_sample=10).acked_cap == br.ACKED_SAMPLE
