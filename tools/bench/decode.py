"""Benchmark: decode a store through the `dledger` Spark data source, end to end.

Builds (or reuses) a store of N entries of S bytes with the real SegmentStore, starts a
session, runs one warm-up query, then `count(*)` + `sum(size)` over the data source WITH bodies
(option body=true: every body is copied, CRC-checked and shipped to the JVM) --runs times, and
reports the median entries/s. Also measures the pure-Python decoder and the Arrow path alone,
in this process, to show where the time goes.

    python -m tools.bench.decode --entries 1000000 --size 1024 --master 'local[2]'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from node.store.decoder import StoreDecoder
from node.store.segment_store import SegmentStore, StoreConfig


def build_store(path: Path, entries: int, size: int, *, data_file_size: int = 1 << 30,
                index_file_size: int = 5_242_880 * 32, batch: int = 1000) -> None:
    """Write `entries` committed entries of `size`-byte bodies (64 distinct random bodies)."""
    bodies = [os.urandom(size) for _ in range(64)]
    st = SegmentStore(StoreConfig(store_dir=str(path), data_file_size=data_file_size,
                                  index_file_size=index_file_size, flush_mode="async"))
    st.open()
    try:
        done = 0
        while done < entries:
            n = min(batch, entries - done)
            st.append_batch_raw([bodies[(done + k) % 64] for k in range(n)], 1)
            done += n
        st.set_committed_index(st.ledger_end_index)
    finally:
        st.close()


def python_rates(path: Path, limit: int) -> dict[str, float]:
    """Entries/s of the row decoder and of the Arrow path, single process, first `limit`."""
    from tools.pipeline.arrow_decode import decode_batches

    out: dict[str, float] = {}
    with StoreDecoder(path) as r:
        hi = min(r.end_index, r.begin_index + limit - 1)
        t = time.perf_counter()
        n = sum(1 for _ in r.iter_rows(r.begin_index, hi))
        out["row_decoder_entries_per_s"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        n = sum(b.num_rows for b in decode_batches(r, "bench", r.begin_index, hi))
        out["arrow_decode_entries_per_s"] = n / (time.perf_counter() - t)
    return out


def spark_rates(path: Path, master: str, runs: int) -> tuple[list[float], int, int]:
    from tools.pipeline.session import build_session

    spark = build_session(master, app_name="dledger-bench-decode")
    try:
        def once() -> tuple[float, int, int]:
            t = time.perf_counter()
            row = (spark.read.format("dledger").option("path", str(path)).option("body", "true")
                   .load().selectExpr("count(*) AS n", "sum(size) AS bytes").collect()[0])
            return time.perf_counter() - t, row["n"], row["bytes"]

        once()  # warm-up: JIT, Python worker start, first planning
        results = [once() for _ in range(runs)]
    finally:
        spark.stop()
    n, nbytes = results[0][1], results[0][2]
    return [n / dt for dt, _, _ in results], n, nbytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.decode", description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes per entry")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store-dir", help="reuse/create the store here (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = None
    if args.store_dir:
        path = Path(args.store_dir)
    else:
        tmp = tempfile.mkdtemp(prefix="dledger-bench-decode-")
        path = Path(tmp) / "n0"
    try:
        if not (path / "index").is_dir():
            t = time.perf_counter()
            build_store(path, args.entries, args.size)
            print(f"built {args.entries} entries of {args.size} B in {time.perf_counter() - t:.1f}s",
                  file=sys.stderr)
        py = python_rates(path, 200_000)
        rates, n, nbytes = spark_rates(path, args.master, args.runs)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median(rates)
    result = {
        "entries": n, "body_size": args.size, "master": args.master, "cpus": os.cpu_count(),
        "runs_entries_per_s": [round(r) for r in rates], "entries_per_s": round(med),
        "mb_per_s": round(med * nbytes / n / 1e6, 1) if n else 0.0,
        **{k: round(v) for k, v in py.items()},
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
