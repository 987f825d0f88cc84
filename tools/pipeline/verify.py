"""Cross-replica verification of committed prefixes (the `dledger verify` job).

Raft promises that replicas agree on every committed index. This job checks it from the files,
without bodies, in two passes:

1. One aggregation over all replicas, grouped by (node, fixed index range): per-node health
   (entries, gaps, CRC failures, structural errors, the first index of each) and, over the
   range every node has committed, a digest per range:
   ``bit_xor(xxhash64(index, term, body_crc, size, type))``. XOR because it is order-free and
   cannot overflow (Spark runs in ANSI mode: a `sum` of 64-bit hashes would fail). `pos` is
   left out: followers re-stamp it to their own file positions.
2. Only for ranges whose digest or count differs between nodes: a row-by-row comparison of
   that range, to name the first divergent index and what each node holds there.

Ranges are the data source's fixed partitions `[k*P, (k+1)*P - 1]`, so pass 2 decodes just
P entries per node, whatever the log length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from node.store.decoder import StoreDecoder
from tools.pipeline.datasource import NodeStore, parse_stores, partition_entries

_KEY_COLUMNS = ("term", "body_crc", "size", "type")


@dataclass
class NodeReport:
    node: str
    path: str
    begin_index: int
    end_index: int
    committed_index: int
    count: int = 0
    gaps: int = 0
    crc_failures: int = 0
    errors: int = 0
    first_gap_index: int | None = None
    first_crc_failure_index: int | None = None
    first_error_index: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.crc_failures or self.errors or self.problems)


@dataclass
class VerifyReport:
    partition_entries: int
    nodes: list[NodeReport]
    common_from: int | None = None
    common_to: int | None = None
    ranges_compared: int = 0
    ranges_diverged: int = 0
    first_divergent_index: int | None = None
    divergent_entries: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.first_divergent_index is None and self.ranges_diverged == 0 and all(
            n.ok for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["common_range"] = (None if self.common_from is None
                             else {"from": self.common_from, "to": self.common_to})
        del d["common_from"], d["common_to"]
        return {"ok": d.pop("ok"), **d}


def _load(spark: SparkSession, stores: list[NodeStore], width: int, **options: str) -> DataFrame:
    r = (spark.read.format("dledger")
         .option("paths", ",".join(s.path for s in stores))
         .option("nodes", ",".join(s.node for s in stores))
         .option("body", "false").option("committedOnly", "true")
         .option("partitionEntries", str(width)))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _snapshot(stores: list[NodeStore], width_option: int | None) -> tuple[list[NodeReport], int]:
    """Bounds of every store as the driver sees them now, and the partition width P."""
    reports: list[NodeReport] = []
    width = width_option
    for st in stores:
        with StoreDecoder(st.path) as r:
            if width is None:
                width = partition_entries({}, r)
            rep = NodeReport(st.node, st.path, r.begin_index, r.end_index, r.committed_index)
            if r.checkpoint_error:
                rep.problems.append(f"unreadable checkpoint: {r.checkpoint_error}")
        if rep.committed_index > rep.end_index:
            rep.problems.append(f"checkpoint says committed up to {rep.committed_index} "
                                f"but the log ends at {rep.end_index}")
        reports.append(rep)
    assert width is not None
    return reports, width


def verify_stores(spark: SparkSession, paths: list[str], *,
                  partition_entries_option: int | None = None) -> VerifyReport:
    stores = parse_stores({"paths": ",".join(paths)})
    reports, width = _snapshot(stores, partition_entries_option)
    report = VerifyReport(width, reports)
    by_node = {r.node: r for r in reports}

    live = [r for r in reports if r.begin_index >= 0]
    lo = max((r.begin_index for r in reports), default=0)
    hi = min((min(r.committed_index, r.end_index) for r in reports), default=-1)
    common = len(live) == len(reports) and len(reports) > 0 and hi >= lo
    if common:
        report.common_from, report.common_to = lo, hi

    idx = F.col("index")
    is_gap = F.coalesce(F.col("error").startswith("gap:"), F.lit(False))
    is_err = F.col("error").isNotNull() & ~is_gap
    is_bad_crc = F.coalesce(F.col("crc_ok") == F.lit(False), F.lit(False))
    in_common = (idx >= lo) & (idx <= hi) if common else F.lit(False)
    digest = F.xxhash64(idx, *[F.col(c) for c in _KEY_COLUMNS])

    df = _load(spark, stores, width).withColumn("rid", F.expr(f"`index` div {width}"))
    rows = df.groupBy("node", "rid").agg(
        F.count(F.lit(1)).alias("n"),
        F.count_if(is_gap).alias("gaps"),
        F.count_if(is_bad_crc).alias("crc"),
        F.count_if(is_err).alias("errs"),
        F.min(F.when(is_gap, idx)).alias("first_gap"),
        F.min(F.when(is_bad_crc, idx)).alias("first_crc"),
        F.min(F.when(is_err, idx)).alias("first_err"),
        F.count_if(in_common).alias("n_common"),
        F.bit_xor(F.when(in_common, digest)).alias("digest"),
    ).collect()

    ranges: dict[int, dict[str, tuple[int, int | None]]] = {}
    for row in rows:
        rep = by_node[row["node"]]
        rep.count += row["n"]
        rep.gaps += row["gaps"]
        rep.crc_failures += row["crc"]
        rep.errors += row["errs"]
        rep.first_gap_index = _min(rep.first_gap_index, row["first_gap"])
        rep.first_crc_failure_index = _min(rep.first_crc_failure_index, row["first_crc"])
        rep.first_error_index = _min(rep.first_error_index, row["first_err"])
        if row["n_common"]:
            ranges.setdefault(row["rid"], {})[row["node"]] = (row["n_common"], row["digest"])

    if common:
        rids = range(lo // width, hi // width + 1)
        report.ranges_compared = len(rids)
        diverged = [k for k in rids
                    if len({ranges.get(k, {}).get(n.node, (0, None)) for n in reports}) > 1]
        report.ranges_diverged = len(diverged)
        for k in diverged:  # ascending: the first range that names an index wins
            first = _first_divergence(spark, stores, width, max(lo, k * width),
                                      min(hi, (k + 1) * width - 1))
            if first is not None:
                report.first_divergent_index, report.divergent_entries = first
                break
    return report


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _first_divergence(spark: SparkSession, stores: list[NodeStore], width: int, lo: int,
                      hi: int) -> tuple[int, dict[str, dict[str, Any] | None]] | None:
    """Row-by-row over [lo, hi]: the first index where nodes disagree (or one lacks it)."""
    df = _load(spark, stores, width, fromIndex=str(lo), toIndex=str(hi))
    keyed = F.struct(*[F.col(c) for c in _KEY_COLUMNS])
    first = (df.groupBy("index")
             .agg(F.count(F.lit(1)).alias("n"), F.size(F.collect_set(keyed)).alias("variants"))
             .where((F.col("n") < len(stores)) | (F.col("variants") > 1))
             .agg(F.min("index").alias("first"))
             .collect()[0]["first"])
    if first is None:
        return None
    held: dict[str, dict[str, Any] | None] = {s.node: None for s in stores}
    for row in df.where(F.col("index") == first).collect():
        held[row["node"]] = {c: row[c] for c in (*_KEY_COLUMNS, "crc_ok", "error")}
    return first, held
