"""Spark test fixtures: ONE local[2] session for the whole run, and replica stores.

Store builders and fault injectors live in `spark_stores` (importable by the test files).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from spark_stores import N_ENTRIES, write_store

from tools.pipeline.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # C1-only JIT: the test queries are tiny, so JVM start-up and warm-up dominate.
    session = build_session("local[2]", app_name="dledger-tests", shuffle_partitions=4,
                            java_options="-XX:TieredStopAtLevel=1")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def healthy_replicas(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three identical replicas n0..n2 (n1 lags: committed 149). Read-only: copy to damage."""
    base = tmp_path_factory.mktemp("replicas")
    write_store(base / "n0")
    shutil.copytree(base / "n0", base / "n1")
    shutil.copytree(base / "n0", base / "n2")
    (base / "n1" / "checkpoint").write_text(f"committedIndex=149\nendIndex={N_ENTRIES - 1}\n")
    return [base / "n0", base / "n1", base / "n2"]


@pytest.fixture
def replica_copies(healthy_replicas: list[Path], tmp_path: Path) -> Callable[[], list[Path]]:
    """Fresh writable copies of the healthy replicas, for one test to damage."""
    def copy() -> list[Path]:
        out = []
        for p in healthy_replicas:
            shutil.copytree(p, tmp_path / p.name)
            out.append(tmp_path / p.name)
        return out
    return copy
