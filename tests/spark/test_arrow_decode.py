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
