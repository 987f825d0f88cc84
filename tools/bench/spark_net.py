"""Benchmark: the `dledger` Spark source over the network, against a local group.

Starts a local group (LocalGroup), appends N entries of S bytes (batches of 1,000, 8 in
flight), then in one Spark session (`--master`, default local[2]), after a warm-up query:

* batch: `count(*)` + `sum(size)` over `spark.read.format("dledger").option("peers", ...)`,
  and the same query over the file source on the leader's store (the same log) — entries/s;
* stream: a `readStream` from `earliest` with Trigger.AvailableNow into Parquet — entries/s
  from `start()` to termination (query start-up and shut-down included: ~2-4 s here), and
  inside the micro-batches (rows / the sum of their `triggerExecution` times: reading,
  writing Parquet and committing, i.e. the rate of a query that is already running);
* one task's read path, in this process, without Spark (`task_paths`);
* latency: a query from `latest` with the smallest trigger (processingTime 0) and a
  `foreachBatch` that records when each row reaches the driver; one entry is appended at a
  time, and latency is append call → row seen by the driver (p50 / p90 / max).

    python -m tools.bench.spark_net --entries 200000 --size 1024 --master 'local[2]'
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from ipc.client import DLedgerClient
from tools.local_group import LocalGroup


def fill(peers: str, entries: int, size: int) -> float:
    """Append `entries` bodies of `size` bytes; returns entries/s."""
    bodies = [os.urandom(size) for _ in range(64)]
    t0 = time.perf_counter()
    with DLedgerClient(peers, timeout=60.0) as c:
        futs: list[concurrent.futures.Future] = []
        for k in range(0, entries, 1000):
            n = min(1000, entries - k)
            futs.append(c.append_batch_async([bodies[(k + j) % 64] for j in range(n)]))
            if len(futs) >= 8:
                futs.pop(0).result()
        for f in futs:
            f.result()
    return entries / (time.perf_counter() - t0)


def task_paths(peers: str, end: int, reps: int) -> dict[str, list[int]]:
    """Entries/s of what one task does, in this process, over [0, end]: the leader's GET
    answers alone; GET + `net_arrow.blob_to_batch` (the read path); GET + one `Entry` per
    entry + Arrow columns from lists (the first version, kept for the comparison)."""
    import pyarrow as pa

    from tools.pipeline.net_arrow import blob_to_batch
    from tools.pipeline.net_source import _to_batch
    from tools.pipeline.netclient import fetch_blob

    out: dict[str, list[int]] = {"fetch_alone": [], "fetch_arrow": [], "get_entries": []}
    with DLedgerClient(peers, sessions=False) as c:
        for _ in range(reps):
            t, i = time.perf_counter(), 0
            while i <= end:
                fetch_blob(c, i, 4096)
                i += 4096
            out["fetch_alone"].append(round((end + 1) / (time.perf_counter() - t)))
            t, i = time.perf_counter(), 0
            while i <= end:
                blob, node = fetch_blob(c, i, 4096)
                _b, last = blob_to_batch(blob, i, node, True)
                i = last + 1
            out["fetch_arrow"].append(round((end + 1) / (time.perf_counter() - t)))
            t, i = time.perf_counter(), 0
            while i <= end:
                es = c.get_range(i, 4096)
                _to_batch(pa, "n", es)
                i = es[-1].index + 1
            out["get_entries"].append(round((end + 1) / (time.perf_counter() - t)))
    return out


def timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latency-samples", type=int, default=30)
    args = ap.parse_args(argv)

    from tools.pipeline.session import build_session

    out: dict[str, object] = {"entries": args.entries, "size": args.size, "master": args.master}
    work = Path(tempfile.mkdtemp(prefix="dledger-spark-net-"))
    group = LocalGroup(args.nodes, ["--data-file-size", str(1 << 30), "--index-file-size", str(64 << 20)])
    spark = None
    try:
        group.start()
        leader, _term = group.wait_leader()
        out["fill_entries_per_s"] = round(fill(group.peers, args.entries, args.size))
        with DLedgerClient(group.peers) as c:
            deadline = time.monotonic() + 120
            while True:
                m = c.metadata()
                ends = {(n.ledger_end_index, n.committed_index) for n in m.nodes}
                if len(ends) == 1 and m.leader_id == leader:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the group did not converge")
                time.sleep(0.2)
            committed = m.node(leader).committed_index
        out["task_paths_entries_per_s"] = task_paths(group.peers, min(committed, 50_000), args.runs)
        spark = build_session(args.master, app_name="dledger-bench-net")
        net = spark.read.format("dledger").option("peers", group.peers)
        files = (spark.read.format("dledger").option("path", str(group.root / leader))
                 .option("toIndex", str(committed)))
        q = "count(*) AS n", "sum(size) AS bytes"
        net.load().selectExpr(*q).collect()  # warm-up: JVM, Python workers, the group's caches
        files.load().selectExpr(*q).collect()
        rows = committed + 1
        for name, reader in (("network", net), ("files", files)):
            secs = [timed(lambda r=reader: r.load().selectExpr(*q).collect()) for _ in range(args.runs)]
            out[f"batch_{name}_entries_per_s"] = round(rows / statistics.median(secs))
            out[f"batch_{name}_runs"] = [round(rows / s) for s in secs]

        rates, in_batches = [], []
        for run in range(args.runs):
            target = work / f"stream-{run}"
            sq = (spark.readStream.format("dledger").option("peers", group.peers)
                  .option("startingIndex", "earliest").load()
                  .writeStream.format("parquet").option("path", str(target / "out"))
                  .option("checkpointLocation", str(target / "ck")).trigger(availableNow=True))
            t0 = time.perf_counter()
            handle = sq.start()
            handle.awaitTermination()
            rates.append(args.entries / (time.perf_counter() - t0))
            prog = [p for p in handle.recentProgress if p["numInputRows"]]
            in_batches.append(sum(p["numInputRows"] for p in prog)
                              / (sum(p["durationMs"]["triggerExecution"] for p in prog) / 1000))
        out["stream_parquet_entries_per_s"] = round(statistics.median(rates))
        out["stream_parquet_runs"] = [round(r) for r in rates]
        out["stream_parquet_in_batches_entries_per_s"] = round(statistics.median(in_batches))
        out["stream_parquet_in_batches_runs"] = [round(r) for r in in_batches]
        out["stream_parquet_rows_check"] = spark.read.parquet(str(work / "stream-0" / "out")).count()

        seen: dict[bytes, float] = {}
        cond = threading.Condition()

        def record(df, _batch_id: int) -> None:  # noqa: ANN001 - a DataFrame
            now = time.perf_counter()
            got = [bytes(r["body"]) for r in df.select("body").collect()]
            with cond:
                for b in got:
                    seen.setdefault(b, now)
                cond.notify_all()

        lq = (spark.readStream.format("dledger").option("peers", group.peers).load()
              .writeStream.foreachBatch(record).trigger(processingTime="0 seconds").start())
        lat = []
        try:
            while lq.lastProgress is None:
                time.sleep(0.05)
            with DLedgerClient(group.peers) as c:
                for k in range(args.latency_samples):
                    body = b"latency-%d" % k
                    t0 = time.perf_counter()
                    c.append(body)
                    with cond:
                        if not cond.wait_for(lambda b=body: b in seen, timeout=30):
                            raise SystemExit(f"{body!r} never reached the sink")
                        lat.append(seen[body] - t0)
        finally:
            lq.stop()
        lat.sort()
        out["latency_ms"] = {"p50": round(1000 * lat[len(lat) // 2], 1),
                             "p90": round(1000 * lat[int(len(lat) * 0.9)], 1),
                             "max": round(1000 * lat[-1], 1)}
        out["load_average"] = os.getloadavg()
    finally:
        if spark is not None:
            spark.stop()
        group.close()
        shutil.rmtree(work, ignore_errors=True)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
