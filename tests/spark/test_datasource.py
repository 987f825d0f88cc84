"""The `dledger` data source: rows equal `dledger dump`, options, SQL, fixed partitions."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from spark_stores import (
    COMMITTED,
    N_ENTRIES,
    WIDTH,
    body_of,
    flip_body_byte,
    term_of,
    zero_index_record,
)

from tools.cli import main
from tools.pipeline.datasource import StorePartition, parse_stores, plan_partitions

pytestmark = pytest.mark.spark


def dump_jsonl(capsys: pytest.CaptureFixture[str], store: Path) -> list[dict]:
    assert main(["dump", "--store-dir", str(store), "--format", "jsonl"]) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def as_dump(row) -> dict:  # noqa: ANN001 - a pyspark Row
    return {"index": row["index"], "term": row["term"], "pos": row["pos"], "size": row["size"],
            "type": row["type"], "crc_ok": row["crc_ok"], "error": row["error"],
            "body_b64": None if row["body"] is None else base64.b64encode(row["body"]).decode()}


def test_rows_equal_dump_exactly_including_damage(spark: SparkSession, replica_copies,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    n0 = replica_copies()[0]
    flip_body_byte(n0, 40)
    zero_index_record(n0, 77)
    rows = (spark.read.format("dledger").option("path", str(n0)).option("committedOnly", "false")
            .option("partitionEntries", str(WIDTH)).load().orderBy("index").collect())
    assert [as_dump(r) for r in rows] == dump_jsonl(capsys, n0)
    assert {r["node"] for r in rows} == {"n0"}
    assert rows[40]["crc_ok"] is False and rows[77]["error"].startswith("gap:")
    assert sum(1 for r in rows if r["error"] is None and r["crc_ok"]) == N_ENTRIES - 2


def test_committed_only_range_and_body_options(spark: SparkSession, healthy_replicas) -> None:
    n0 = str(healthy_replicas[0])
    read = spark.read.format("dledger").option("path", n0)
    assert read.load().count() == COMMITTED + 1
    assert read.option("committedOnly", "false").load().count() == N_ENTRIES
    sel = (spark.read.format("dledger").option("path", n0).option("fromIndex", "10")
           .option("toIndex", "19").option("body", "false").load().orderBy("index").collect())
    assert [r["index"] for r in sel] == list(range(10, 20))
    assert all(r["body"] is None and r["crc_ok"] for r in sel)
    one = (spark.read.format("dledger").option("path", n0).option("fromIndex", "5")
           .option("toIndex", "5").load().collect()[0])
    assert (one["body"], one["term"], one["size"]) == (body_of(5), term_of(5), 48 + len(body_of(5)))


def test_sql_view_and_doc_examples(spark: SparkSession, healthy_replicas) -> None:
    paths = ",".join(str(p) for p in healthy_replicas)
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW log USING dledger OPTIONS (paths '{paths}', "
              f"committedOnly 'false', body 'false', partitionEntries '{WIDTH}')")
    per_term = spark.sql("SELECT node, term, count(*) AS entries FROM log "
                         "GROUP BY node, term ORDER BY node, term").collect()
    want = {t: sum(1 for i in range(N_ENTRIES) if term_of(i) == t) for t in (1, 2, 3)}
    assert [(r["node"], r["term"], r["entries"]) for r in per_term] == [
        (n, t, want[t]) for n in ("n0", "n1", "n2") for t in (1, 2, 3)]
    sizes = spark.sql("SELECT percentile_approx(size, 0.5) AS p50, max(size) AS mx, "
                      "min(size) AS mn FROM log WHERE node = 'n0'").collect()[0]
    all_sizes = [48 + len(body_of(i)) for i in range(N_ENTRIES)]
    assert (sizes["mn"], sizes["mx"]) == (min(all_sizes), max(all_sizes))


def test_partitions_are_aligned_on_fixed_index_boundaries(healthy_replicas) -> None:
    stores = parse_stores({"paths": ",".join(str(p) for p in healthy_replicas)})
    parts = plan_partitions(stores, {"partitionEntries": str(WIDTH), "fromIndex": "3"})
    by_node: dict[str, list[StorePartition]] = {}
    for p in parts:
        by_node.setdefault(p.node, []).append(p)
        assert p.from_index // WIDTH == p.to_index // WIDTH  # never crosses a boundary
    assert [(p.from_index, p.to_index) for p in by_node["n0"]] == [
        (3, 31), (32, 63), (64, 95), (96, 127), (128, 159), (160, 179)]
    assert [(p.from_index, p.to_index) for p in by_node["n1"]][-1] == (128, 149)  # lagging node
    cuts = {n: {p.from_index // WIDTH for p in ps} for n, ps in by_node.items()}
    assert cuts["n1"] <= cuts["n0"] == cuts["n2"]


def test_node_names_and_bad_options(spark: SparkSession, healthy_replicas, tmp_path: Path) -> None:
    a, b = healthy_replicas[0], healthy_replicas[1]
    assert [s.node for s in parse_stores({"paths": f"{a},{a}"})] == ["n0", "n0#2"]
    assert [s.node for s in parse_stores({"paths": f"{a},{b}", "nodes": "x,y"})] == ["x", "y"]
    df = spark.read.format("dledger").option("path", str(a)).option("node", "leader").load()
    assert {r["node"] for r in df.select("node").distinct().collect()} == {"leader"}
    with pytest.raises(Exception, match="partitionEntries"):
        spark.read.format("dledger").option("path", str(a)).option("partitionEntries", "x").load().count()
    with pytest.raises(Exception, match="not a directory"):
        spark.read.format("dledger").option("path", str(tmp_path / "nope")).load().count()


def test_partition_width_from_bytes_is_a_power_of_two(healthy_replicas) -> None:
    from node.store.decoder import StoreDecoder
    from tools.pipeline.datasource import partition_entries

    avg = sum(48 + len(body_of(i)) for i in range(N_ENTRIES)) // N_ENTRIES
    with StoreDecoder(healthy_replicas[0]) as r:
        assert partition_entries({"partitionEntries": "10"}, r) == 10
        assert partition_entries({"partitionBytes": str(avg * 1000)}, r) == 1024
        assert partition_entries({"partitionBytes": str(avg * 700)}, r) == 512
        assert partition_entries({"partitionBytes": "1"}, r) == 1
