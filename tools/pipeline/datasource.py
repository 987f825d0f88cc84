"""The `dledger` Python data source: node stores as a Spark table, one row per log entry.

    spark.read.format("dledger").option("path", "/data/n0").load()
    CREATE TEMPORARY VIEW log USING dledger OPTIONS (paths '/data/n0,/data/n1,/data/n2')

Schema: ``node string, index long, term long, pos long, size int, type string, body_crc long,
crc_ok boolean, error string, body binary`` (see `node.store.decoder` for what each means).

Options (all strings, names case-insensitive):

=================  =====================================================================
path / paths       one store directory, or several comma-separated (one per node)
node / nodes       node names for those paths (default: each directory's name)
fromIndex/toIndex  inclusive index bounds (default: the whole log)
committedOnly      "true" (default): stop at each node's checkpointed committed index
body               "true" (default) / "false": leave `body` null and skip copying bodies
partitionEntries   entries per partition; default derived from partitionBytes
partitionBytes     target bytes per partition (default 64 MiB)
=================  =====================================================================

Partitions cover FIXED index ranges ``[k*P, (k+1)*P - 1]`` clipped to each node's range, so
every replica is split at the same indexes and per-range results can be compared node to node
(what `dledger verify` does). Planning opens each store on the driver; executors re-open the
store named in their partition, so every executor must see the directories at the same path.

Deliberately no `pushFilters`: in pyspark 4.3.0 pushed filters leak between actions on the
same DataFrame. Index bounds are options instead.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from node.store.codec import INDEX
from node.store.decoder import StoreDecoder

SCHEMA = StructType([
    StructField("node", StringType()),
    StructField("index", LongType()),
    StructField("term", LongType()),
    StructField("pos", LongType()),
    StructField("size", IntegerType()),
    StructField("type", StringType()),
    StructField("body_crc", LongType()),
    StructField("crc_ok", BooleanType()),
    StructField("error", StringType()),
    StructField("body", BinaryType()),
])
SCHEMA_DDL = ("node string, index long, term long, pos long, size int, type string, "
              "body_crc long, crc_ok boolean, error string, body binary")

DEFAULT_PARTITION_BYTES = 128 << 20
_SAMPLE_RECORDS = 1024  # index records read to estimate the average entry size


class OptionError(ValueError):
    """A bad option value; raised at planning time, before any task runs."""


@dataclass(frozen=True)
class NodeStore:
    node: str
    path: str


class StorePartition(InputPartition):
    """One fixed index range of one node's store. Pickled to executors: plain values only."""

    def __init__(self, node: str, path: str, from_index: int, to_index: int, body: bool) -> None:
        super().__init__((node, from_index, to_index))
        self.node, self.path = node, path
        self.from_index, self.to_index, self.body = from_index, to_index, body

    def __repr__(self) -> str:
        return f"StorePartition({self.node}, [{self.from_index}, {self.to_index}])"


class Options(dict[str, str]):
    """Option names are case-insensitive (SQL `OPTIONS (...)` lower-cases them): keys are
    stored lower-cased and looked up that way. A plain dict subclass, so it pickles."""

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(key.lower(), default)


def normalize_options(options: Mapping[str, str]) -> Options:
    return Options({str(k).lower(): str(v) for k, v in options.items()})


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    v = options.get(key)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {key}: expected true/false, got {v!r}")


def _int(options: Mapping[str, str], key: str) -> int | None:
    v = options.get(key)
    if v is None or str(v).strip() == "":
        return None
    try:
        return int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {key}: expected an integer, got {v!r}") from None


def _split(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def parse_stores(options: Mapping[str, str]) -> list[NodeStore]:
    """The node stores named by `path`/`paths` and `node`/`nodes`, with unique node names."""
    options = normalize_options(options)
    paths = _split(options.get("paths")) + _split(options.get("path"))
    if not paths:
        raise OptionError("option path (or paths) is required: a node's store directory")
    names = _split(options.get("nodes")) or _split(options.get("node"))
    if names and len(names) != len(paths):
        raise OptionError(f"{len(names)} node names for {len(paths)} paths")
    if not names:
        names = [os.path.basename(os.path.normpath(p)) or p for p in paths]
    seen: dict[str, int] = {}
    unique = []
    for n in names:  # two stores both called "store": keep them apart, deterministically
        seen[n] = seen.get(n, 0) + 1
        unique.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return [NodeStore(n, os.path.abspath(p)) for n, p in zip(unique, paths, strict=True)]


def partition_entries(options: Mapping[str, str], reader: StoreDecoder | None) -> int:
    """P, the fixed partition width in entries.

    `partitionEntries` wins; else partitionBytes / average entry size of the FIRST store,
    rounded to the nearest power of two. One value for the whole read, so all replicas align.
    """
    options = normalize_options(options)
    explicit = _int(options, "partitionEntries")
    if explicit is not None:
        if explicit < 1:
            raise OptionError("option partitionEntries must be >= 1")
        return explicit
    target = _int(options, "partitionBytes") or DEFAULT_PARTITION_BYTES
    if target < 1:
        raise OptionError("option partitionBytes must be >= 1")
    avg = 1024
    if reader is not None and not reader.is_empty:
        sizes = [rec[2] for _, raw in reader.index_slices(
            reader.begin_index, min(reader.end_index, reader.begin_index + _SAMPLE_RECORDS - 1))
            for rec in INDEX.iter_unpack(raw) if rec[2] > 0]
        if sizes:
            avg = max(1, sum(sizes) // len(sizes))
    # The nearest power of two (in log scale): boundaries that read well in reports, and no
    # halving of the partition size that rounding down would cause (Python tasks cost ~50 ms
    # each to start, so partitions should not be small).
    return 1 << max(0, round(math.log2(max(1.0, target / avg))))


def plan_partitions(stores: list[NodeStore], options: Mapping[str, str]) -> list[StorePartition]:
    """Open each store once (driver side) and cut its range at multiples of P."""
    options = normalize_options(options)
    from_index = _int(options, "fromIndex")
    to_index = _int(options, "toIndex")
    committed_only = _bool(options, "committedOnly", True)
    body = _bool(options, "body", True)
    parts: list[StorePartition] = []
    width: int | None = None
    for st in stores:
        with StoreDecoder(st.path) as r:
            if width is None:
                width = partition_entries(options, r)
            lo, hi = r.clamp(from_index, to_index)
            if committed_only:
                hi = min(hi, r.committed_index)
        k = lo // width
        while lo <= hi:
            end = min(hi, (k + 1) * width - 1)
            parts.append(StorePartition(st.node, st.path, lo, end, body))
            lo, k = end + 1, k + 1
    return parts


class DLedgerReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = normalize_options(options)
        self.stores = parse_stores(self.options)
        _bool(self.options, "committedOnly", True)  # fail at analysis time on a bad value
        _bool(self.options, "body", True)

    def partitions(self) -> list[InputPartition]:
        return list(plan_partitions(self.stores, self.options))

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, StorePartition):
            return  # Spark's placeholder partition for an empty plan
        # Imported here: pyarrow/numpy are only needed where data is decoded.
        from tools.pipeline.arrow_decode import decode_batches

        with StoreDecoder(partition.path) as r:
            yield from decode_batches(r, partition.node, partition.from_index,
                                      partition.to_index, body=partition.body)


class DLedgerDataSource(DataSource):
    """`format("dledger")`: store files (`path`/`paths`, this module) or a running group over
    the network (`peers`: net_source.py, stream_source.py, sink.py). One name, dispatched on
    the options; giving both or neither is one clear error."""

    @classmethod
    def name(cls) -> str:
        return "dledger"

    def _network(self) -> bool:
        from tools.pipeline.net_source import check_mode

        return check_mode(self.options) == "network"

    def schema(self) -> StructType:
        if self._network():
            from tools.pipeline.net_source import NET_SCHEMA, check_read_options

            check_read_options(self.options)
            return NET_SCHEMA
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if self._network():
            from tools.pipeline.net_source import NetBatchReader

            return NetBatchReader(self.options)
        return DLedgerReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if not self._network():
            raise OptionError("a dledger stream reads a running group: option peers is required "
                              "(store files are read with spark.read, not readStream)")
        from tools.pipeline.stream_source import DLedgerStreamReader

        return DLedgerStreamReader(self.options)

    def _sink_check(self) -> None:
        o = normalize_options(self.options)
        if (o.get("path") or o.get("paths")) and not o.get("peers"):
            raise OptionError("the dledger sink appends to a running group: option peers is "
                              "required (store files are never written)")
        if not (o.get("peers") or "").strip():
            raise OptionError("the dledger sink needs option peers (the group's members)")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        self._sink_check()
        if overwrite:
            raise OptionError("a log is append-only: write with mode append, not overwrite")
        from tools.pipeline.sink import DLedgerBatchWriter

        return DLedgerBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        self._sink_check()
        from tools.pipeline.sink import DLedgerStreamWriter

        return DLedgerStreamWriter(self.options, schema)
