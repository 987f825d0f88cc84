"""`dledger export`: committed entries to Parquet, round trip, refusal to overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from spark_stores import COMMITTED

from tools.cli import main

pytestmark = pytest.mark.spark


def test_export_round_trip_and_overwrite(spark: SparkSession, healthy_replicas, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    n0, out = str(healthy_replicas[0]), str(tmp_path / "n0.parquet")
    assert main(["export", "--store-dir", n0, "--out", out, "--master", "local[2]"]) == 0
    assert capsys.readouterr().out.strip() == f"{COMMITTED + 1} rows written to {out}"
    cols = ["node", "index", "term", "pos", "size", "type", "body_crc", "crc_ok", "error", "body"]
    exported = spark.read.parquet(out)
    assert exported.columns == cols
    source = spark.read.format("dledger").option("path", n0).load()
    assert sorted(exported.collect()) == sorted(source.collect())

    assert main(["export", "--store-dir", n0, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"dledger export: error: {out} exists (use --overwrite to replace it)"
    assert main(["export", "--store-dir", n0, "--out", out, "--overwrite", "--node", "n9"]) == 0
    assert {r["node"] for r in spark.read.parquet(out).select("node").distinct().collect()} == {"n9"}


def test_export_rejects_a_non_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--store-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a store directory" in capsys.readouterr().err
