"""`net_arrow.blob_to_batch` on GET answers built with the real entry encoder: the same rows
`decode_entries` gives, and the same refusals for damage (never a damaged row)."""

from __future__ import annotations

import pytest

from ipc.client import DLedgerError
from ipc.client.results import decode_entries
from ipc.entry_codec import MAGIC_NOOP, encode_entry
from tools.pipeline.net_arrow import blob_to_batch


def _blob(first: int, n: int) -> bytes:
    return b"".join(encode_entry(i, 1 + i // 5, 100 * i, b"" if i == first else b"body-%d" % i,
                                 MAGIC_NOOP if i == first else 1) for i in range(first, first + n))


def test_rows_equal_decode_entries() -> None:
    blob = _blob(7, 12)
    batch, last = blob_to_batch(blob, 7, "n1", include_noop=True)
    assert last == 18
    want = decode_entries(blob, 7, 12)
    rows = batch.to_pylist()
    assert [(r["index"], r["term"], r["pos"], r["type"], r["body"]) for r in rows] == \
        [(e.index, e.term, e.pos, e.type, e.body) for e in want]
    assert {r["node"] for r in rows} == {"n1"} and rows[1]["size"] == 48 + len(b"body-8")
    normal, last = blob_to_batch(blob, 7, "n1", include_noop=False)
    assert last == 18 and normal.column("index").to_pylist() == list(range(8, 19))
    assert blob_to_batch(b"", 3, "n1", True) == (None, 2)


def test_damage_is_refused() -> None:
    blob = bytearray(_blob(0, 4))
    blob[-1] ^= 0xFF  # last body byte
    with pytest.raises(DLedgerError, match="CRC") as ei:
        blob_to_batch(bytes(blob), 0, "n0", True)
    assert ei.value.name == "DISK_ERROR"
    with pytest.raises(DLedgerError, match="expected index 1") as ei:
        blob_to_batch(_blob(0, 1) + _blob(2, 2)[len(_blob(2, 1)):], 0, "n0", True)
    assert ei.value.name == "INCONSISTENT_INDEX"
    with pytest.raises(DLedgerError, match="runs past"):
        blob_to_batch(_blob(0, 3)[:-2], 0, "n0", True)
