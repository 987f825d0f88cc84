"""`dledger bench --mode async`: a latency is one request's round trip, never the wait for a
free slot in the window before it was sent. With one request in flight and a server that
answers in D, the bench must report ~D, not ~2D (it did, before the window moved into the
bench: the submit blocked inside the client after the clock was read)."""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import Future

import tools.commands.bench as bench_mod
from tools.bench.progress import BenchProgress
from tools.commands.bench import Bench

ROUND_TRIP_S = 0.02


class SlowClient:
    """DLedgerClient's shape for the bench: `append_async` blocks while `max_in_flight` calls
    are out (as the real client's slots do), and each answer comes ROUND_TRIP_S after the call
    was submitted, one at a time (a server that serves requests in order)."""

    def __init__(self, peers: str, *, max_in_flight: int, **_kw: object) -> None:
        self.slots = threading.Semaphore(max_in_flight)
        self.server = threading.Lock()  # one request served at a time
        self.index = 0

    def __enter__(self) -> SlowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def metadata(self) -> None:
        return None

    def append_async(self, body: bytes) -> Future:
        self.slots.acquire()
        f: Future = Future()

        def serve() -> None:
            with self.server:
                time.sleep(ROUND_TRIP_S)
                self.index += 1
                r = type("R", (), {"index": self.index})()
            f.set_result(r)  # callbacks first, then the slot is free (as in the real client)
            self.slots.release()

        threading.Thread(target=serve, daemon=True).start()
        return f


def test_one_in_flight_reports_the_round_trip_not_twice_it(monkeypatch) -> None:
    monkeypatch.setattr(bench_mod, "DLedgerClient", SlowClient)
    monkeypatch.setattr(Bench, "_verify", lambda self, c, rec: {})
    args = argparse.Namespace(size=16, duration=60.0, count=25, concurrency=1, batch=1, mode="async",
                              warmup=0.0, group="default", timeout=5.0, server_arg=[], verify_sample=0)
    rec = Bench(args, "n0-127.0.0.1:1").run(BenchProgress(quiet=True))
    rec.close()
    h = rec.merged()
    assert h.get_total_count() >= 20
    p50_s = h.get_value_at_percentile(50) / 1e6  # the histogram counts microseconds
    assert p50_s < 1.5 * ROUND_TRIP_S, f"p50 {p50_s * 1e3:.1f} ms for a {ROUND_TRIP_S * 1e3:.0f} ms round trip"
    assert p50_s >= 0.9 * ROUND_TRIP_S
