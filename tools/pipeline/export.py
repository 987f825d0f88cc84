"""Committed entries of one node's store, or of a running group, → Parquet (`dledger export`).

Only the committed prefix is exported: the uncommitted tail may still be truncated by a new
leader, and an export is meant to be a fact, not a guess. Rows keep the data source's schema,
including `crc_ok`/`error`, so damage shows up in the export instead of being dropped silently.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from pyspark.sql import SparkSession


def local_path(out: str) -> str | None:
    """The local file-system path of `out`, or None for a remote URL (hdfs://, s3a://, ...)."""
    u = urlparse(out)
    if u.scheme in ("", "file"):
        return u.path if u.scheme == "file" else out
    return None


def output_exists(out: str) -> bool:
    """True if `out` exists. Checked locally before Spark starts, so refusing is instant;
    remote paths are left to Spark's own errorifexists mode."""
    p = local_path(out)
    return p is not None and os.path.lexists(p)


def export_committed(spark: SparkSession, store_dir: str, out: str, *, overwrite: bool = False,
                     node: str | None = None) -> int:
    """Write the committed entries of `store_dir` to Parquet at `out`; returns rows written.

    The count is read back from the written files (Parquet footers, no re-decoding), so it is
    what a consumer will actually find there.
    """
    reader = spark.read.format("dledger").option("path", store_dir).option("committedOnly", "true")
    if node:
        reader = reader.option("node", node)
    df = reader.load()
    df.write.mode("overwrite" if overwrite else "errorifexists").parquet(out)
    return spark.read.parquet(out).count()


def export_network(spark: SparkSession, peers: str, out: str, *, group: str = "default",
                   overwrite: bool = False, from_index: int | None = None,
                   to_index: int | None = None, key_file: str | None = None) -> int:
    """Write a running group's committed entries ([from, to], default the whole committed log
    when the job is planned) to Parquet at `out`, read from its members by the executors;
    returns rows written (read back from the files)."""
    reader = spark.read.format("dledger").option("peers", peers).option("group", group)
    if key_file is not None:
        reader = reader.option("keyFile", key_file)
    if from_index is not None:
        reader = reader.option("fromIndex", str(from_index))
    if to_index is not None:
        reader = reader.option("toIndex", str(to_index))
    reader.load().write.mode("overwrite" if overwrite else "errorifexists").parquet(out)
    return spark.read.parquet(out).count()
