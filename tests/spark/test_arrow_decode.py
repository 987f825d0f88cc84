"""The vectorized Arrow path yields exactly the rows of the one-entry-at-a-time decoder."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from spark_stores import flip_body_byte, write_store, zero_index_record

from node.store.decoder import StoreDecoder
from tools.pipeline.arrow_decode import ARROW_SCHEMA, decode_batches, rows_to_batch
from tools.pipeline.datasource import SCHEMA

pytestmark = pytest.mark.spark


def test_arrow_schema_is_what_spark_expects() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


@pytest.mark.parametrize("body", [True, False])
def test_fast_path_equals_row_path_on_a_damaged_store(tmp_path: Path, body: bool) -> None:
    d = tmp_path / "n0"
    write_store(d)
    flip_body_byte(d, 11)
    zero_index_record(d, 50)
    with StoreDecoder(d) as r:
        f, off = r.data_file_of(next(r.iter_entries(120, 120)).pos)
    with open(f, "r+b") as fh:  # a header whose term disagrees with its index record
        fh.seek(off + 16)
        fh.write(struct.pack(">q", 42))
    with StoreDecoder(d) as r:
        want = rows_to_batch("n0", list(r.iter_rows(body=body)))
        for chunk in (7, 64, 4096):
            batches = list(decode_batches(r, "n0", body=body, chunk_entries=chunk))
            assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
            assert all(b.num_rows <= chunk for b in batches)
            got = pa.Table.from_batches(batches)
            assert got.equals(pa.Table.from_batches([want])), chunk
        errors = pa.Table.from_batches([want]).column("error").to_pylist()
    assert [i for i, e in enumerate(errors) if e] == [50, 120]


def test_batches_are_bounded_by_bytes(tmp_path: Path) -> None:
    write_store(tmp_path / "n0")
    with StoreDecoder(tmp_path / "n0") as r:
        batches = list(decode_batches(r, "n0", chunk_bytes=2000))
    assert sum(b.num_rows for b in batches) == 200
    assert all(sum(b.column("size").to_pylist()[:-1]) < 2000 for b in batches)


def test_a_truncation_during_a_pass_never_yields_a_replaced_files_bytes(tmp_path: Path) -> None:
    """The generation fence on the Arrow path: a follower truncates and re-appends (deleting and
    re-creating segment files under the same names) while Spark decodes its store. Every batch
    handed out after that must come from the new files, never from the old mappings."""
    from node.store.base import StoreConfig
    from node.store.segment_store import SegmentStore

    s = SegmentStore(StoreConfig(str(tmp_path / "n0"), data_file_size=4096, index_file_size=8 * 32))
    s.open()
    try:
        for i in range(40):
            s.append_leader(b"old-%02d" % i + b"x" * 300, 1)
        with StoreDecoder(tmp_path / "n0") as r:
            it = decode_batches(r, "n0", chunk_entries=4)
            first = next(it)
            assert first.column("term").to_pylist() == [1] * 4
            s.truncate(6)
            for i in range(6, 40):
                s.append_leader(b"new-%02d" % i + b"y" * 300, 2)
            rest = pa.Table.from_batches(list(it))
        rows = dict(zip(rest.column("index").to_pylist(), rest.column("body").to_pylist(), strict=True))
        assert sorted(rows) == list(range(4, 40))
        for i, body in rows.items():
            want = (b"old-%02d" % i) if i < 6 else (b"new-%02d" % i)
            assert body.startswith(want), (i, body[:6])
    finally:
        s.close()
