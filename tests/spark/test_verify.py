"""`dledger verify`: exit 0 on identical replicas, 1 on each fault, naming the right index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from spark_stores import WIDTH, body_of, flip_body_byte, write_store, zero_index_record

from tools.cli import main

pytestmark = pytest.mark.spark


def verify(capsys: pytest.CaptureFixture[str], stores: list[Path], *extra: str) -> tuple[int, dict]:
    args = ["verify", "--json", "--master", "local[2]", "--partition-entries", str(WIDTH)]
    for s in stores:
        args += ["--store-dir", str(s)]
    rc = main([*args, *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_identical_replicas_pass(spark, healthy_replicas, capsys) -> None:  # noqa: ANN001
    rc, rep = verify(capsys, healthy_replicas)
    assert rc == 0 and rep["ok"] is True
    assert rep["common_range"] == {"from": 0, "to": 149}  # n1 lags at 149
    assert rep["ranges_compared"] == 5 and rep["ranges_diverged"] == 0
    assert rep["first_divergent_index"] is None
    assert [(n["node"], n["count"], n["committed_index"]) for n in rep["nodes"]] == [
        ("n0", 180, 179), ("n1", 150, 149), ("n2", 180, 179)]
    assert all(n["gaps"] == n["crc_failures"] == n["errors"] == 0 for n in rep["nodes"])


def test_diverged_replica_is_named(spark, healthy_replicas, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    other = tmp_path / "n3"
    write_store(other, overrides={97: b"a different entry at 97", 150: b"and 150"})
    rc, rep = verify(capsys, [healthy_replicas[0], other])
    assert rc == 1 and rep["ok"] is False
    assert rep["first_divergent_index"] == 97 and rep["ranges_diverged"] == 2
    assert rep["divergent_entries"]["n3"]["size"] == 48 + len(b"a different entry at 97")
    assert rep["divergent_entries"]["n0"]["size"] == 48 + len(body_of(97))
    assert all(n["crc_failures"] == n["gaps"] == 0 for n in rep["nodes"])


def test_crc_flip_is_named(spark, replica_copies, capsys) -> None:  # noqa: ANN001
    stores = replica_copies()
    flip_body_byte(stores[2], 33)
    rc, rep = verify(capsys, stores)
    assert rc == 1
    n2 = rep["nodes"][2]
    assert (n2["crc_failures"], n2["first_crc_failure_index"]) == (1, 33)
    assert rep["first_divergent_index"] is None  # same stored CRC: damage, not divergence


def test_gap_is_named(spark, replica_copies, capsys) -> None:  # noqa: ANN001
    stores = replica_copies()
    zero_index_record(stores[1], 64)
    rc, rep = verify(capsys, stores)
    assert rc == 1
    assert (rep["nodes"][1]["gaps"], rep["nodes"][1]["first_gap_index"]) == (1, 64)
    assert rep["first_divergent_index"] == 64 and rep["divergent_entries"]["n1"]["term"] is None


def test_human_output(spark, replica_copies, capsys) -> None:  # noqa: ANN001
    stores = replica_copies()
    flip_body_byte(stores[0], 5)
    rc = main(["verify", "--master", "local[2]", "--store-dir", str(stores[0]),
               "--store-dir", str(stores[2])])
    out = capsys.readouterr().out
    assert rc == 1
    assert "n0: CRC failure at index 5 (1 entry)" in out
    assert out.rstrip().endswith("FAILED")


def test_checkpoint_beyond_the_log_is_a_problem(spark, replica_copies, capsys) -> None:  # noqa: ANN001
    stores = replica_copies()
    (stores[2] / "checkpoint").write_text("committedIndex=500\nendIndex=500\n")
    rc, rep = verify(capsys, stores)
    assert rc == 1 and rep["first_divergent_index"] is None
    assert rep["nodes"][2]["problems"] == ["checkpoint says committed up to 500 but the log ends at 199"]
