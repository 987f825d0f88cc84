"""A worked example: order events in a DLedger group, aggregated by Spark Structured Streaming,
and derived rows written back into another group through the `dledger` sink.

    python examples/orders_pipeline.py                # starts two local 1-node groups itself
    python examples/orders_pipeline.py --orders-peers P1 --alerts-peers P2 --out DIR

1. A producer appends JSON order events ({"order", "customer", "sku", "amount", "ts"}) to the
   group `orders` (event time `ts` is in the JSON: an entry records no time of its own).
2. Query 1 reads `orders` as a stream, parses the JSON, and counts orders and sums amounts
   per customer per minute of event time, with a 1-minute watermark; closed windows are
   appended to Parquet (a window is final once the watermark passes its end).
3. Query 2 reads the same stream and writes every order over 900 back, as a JSON alert, into
   the group `alerts` through the sink (exactly once per micro-batch: docs/pipeline.md).

Both queries run with Trigger.AvailableNow (everything committed when they start, then stop),
so the example ends by itself; a service would use processingTime triggers instead.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ipc.client import DLedgerClient  # noqa: E402

BASE_TS = 1_795_000_000_000  # 2026-11-17 ... in ms; the events span 6 minutes from here


def produce(peers: str, group: str, n: int, seed: int = 7) -> None:
    """n order events, 180 ms of event time apart, a few of them late (out of order)."""
    rnd = random.Random(seed)
    events = []
    for i in range(n):
        ts = BASE_TS + i * 180 - (rnd.randrange(20_000) if rnd.random() < 0.05 else 0)
        events.append(json.dumps({"order": i, "customer": f"c{rnd.randrange(4)}",
                                  "sku": rnd.randrange(100), "amount": rnd.randrange(1, 1000),
                                  "ts": ts}).encode())
    with DLedgerClient(peers, group=group) as c:
        for k in range(0, n, 500):
            c.append_batch(events[k:k + 500])


def run(orders: str, alerts: str, out: Path, master: str) -> None:
    from pyspark.sql import functions as F

    from tools.pipeline.session import build_session

    spark = build_session(master, app_name="orders-example")
    try:
        schema = "order long, customer string, sku int, amount int, ts long"
        events = (spark.readStream.format("dledger").option("peers", orders).option("group", "orders")
                  .option("startingIndex", "earliest").load()
                  .select(F.from_json(F.col("body").cast("string"), schema).alias("e"), "index")
                  .select("e.*", "index")
                  .withColumn("event_time", F.timestamp_millis("ts")))

        per_minute = (events.withWatermark("event_time", "1 minute")
                      .groupBy(F.window("event_time", "1 minute"), "customer")
                      .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
        q1 = (per_minute.writeStream.format("parquet").outputMode("append")
              .option("path", str(out / "per_minute")).option("checkpointLocation", str(out / "ck1"))
              .trigger(availableNow=True).start())

        big = (events.where("amount > 900")
               .select(F.to_json(F.struct("order", "customer", "amount", "index")).alias("body")))
        q2 = (big.writeStream.format("dledger").option("peers", alerts).option("group", "alerts")
              .option("checkpointLocation", str(out / "ck2")).trigger(availableNow=True).start())
        q1.awaitTermination()
        q2.awaitTermination()

        print("per customer per minute (closed windows):")
        (spark.read.parquet(str(out / "per_minute"))
         .selectExpr("date_format(window.start, 'HH:mm') AS minute", "customer", "orders", "amount")
         .orderBy("minute", "customer").show(8, truncate=False))
        alerts_log = (spark.read.format("dledger").option("peers", alerts).option("group", "alerts")
                      .option("includeNoop", "false").load())
        print(f"alerts appended to group 'alerts': {alerts_log.count()}")
        alerts_log.selectExpr("`index`", "CAST(body AS STRING) AS body").orderBy("index").show(3, truncate=False)
    finally:
        spark.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders-peers", help="the orders group (default: start a local one)")
    ap.add_argument("--alerts-peers", help="the alerts group (default: start a local one)")
    ap.add_argument("--out", help="output directory (default: a temporary one)")
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="orders-example-"))
    groups = []
    try:
        orders, alerts = args.orders_peers, args.alerts_peers
        if orders is None or alerts is None:
            from tools.local_group import LocalGroup

            for name in ("orders", "alerts"):
                g = LocalGroup(1, group=name).start()
                g.wait_leader()
                groups.append(g)
            orders, alerts = groups[0].peers, groups[1].peers
        produce(orders, "orders", args.events)
        print(f"{args.events} order events appended to group 'orders'")
        run(orders, alerts, out, args.master)
        print(f"output in {out}")
    finally:
        for g in groups:
            g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
