"""A GET answer's entries (store format, as the node serves them) → one Arrow record batch of
the network schema, checked as arrays.

Why: turning an answer into `Entry` objects (`ipc.client.results.decode_entries`) and then
into Arrow columns costs ~20 µs of interpreter work per entry, a third of a core at 50k
entries/s. Here the entry offsets come from one pass over the size fields, the 48-byte headers
are gathered with one numpy fancy index, and every check `decode_entries` makes — magic, size
vs. body size, index continuity from the asked index — is one vector comparison. Only the CRC
(a C call per body) stays per entry. Any failed check raises DLedgerError(DISK_ERROR or
INCONSISTENT_INDEX) like `decode_entries`: a damaged entry is never turned into a row.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from ipc.client import DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.entry_codec import HEADER_SIZE, MAGIC_NOOP, MAGIC_NORMAL, crc32

_HEADER_DT = np.dtype([("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"),
                       ("pos", ">i8"), ("channel", ">u4"), ("chain_crc", ">u4"),
                       ("body_crc", ">u4"), ("body_size", ">i4")])
assert _HEADER_DT.itemsize == HEADER_SIZE
_SPAN = np.arange(HEADER_SIZE, dtype=np.int64)
_SIZE = struct.Struct(">i")
_TYPES = pa.array(["NORMAL", "NOOP"], pa.string())
NAMES = ["node", "index", "term", "pos", "size", "type", "body"]


def offsets_of(blob: bytes) -> np.ndarray:
    """Start offset of each entry in `blob` (walks the size fields; a torn run raises)."""
    out, off, n, unpack = [], 0, len(blob), _SIZE.unpack_from
    while off < n:
        if n - off < HEADER_SIZE:
            raise DLedgerError(RC.DISK_ERROR, f"entry failed verification: short header at offset {off}")
        out.append(off)
        size = unpack(blob, off + 4)[0]
        if size < HEADER_SIZE:
            raise DLedgerError(RC.DISK_ERROR, f"entry failed verification: size {size} at offset {off}")
        off += size
    if off != n:
        raise DLedgerError(RC.DISK_ERROR, "entry failed verification: the last entry runs past the answer")
    return np.asarray(out, dtype=np.int64)


def blob_to_batch(blob: bytes, start: int, node: str, include_noop: bool) -> tuple[pa.RecordBatch | None, int]:
    """(the rows, the last index in `blob`) for consecutive entries from index `start`."""
    offs = offsets_of(blob)
    k = len(offs)
    if k == 0:
        return None, start - 1
    raw = np.frombuffer(blob, dtype=np.uint8)
    h = raw[(offs[:, None] + _SPAN).ravel()].view(_HEADER_DT)
    magic, size, body_size = h["magic"], h["size"].astype(np.int64), h["body_size"].astype(np.int64)
    index = h["index"].astype(np.int64)
    if not np.all((magic == MAGIC_NORMAL) | (magic == MAGIC_NOOP)):
        raise DLedgerError(RC.DISK_ERROR, "entry failed verification: bad magic")
    if not np.all((body_size >= 0) & (size == HEADER_SIZE + body_size)):
        raise DLedgerError(RC.DISK_ERROR, "entry failed verification: size disagrees with body size")
    expected = np.arange(start, start + k, dtype=np.int64)
    if not np.array_equal(index, expected):
        bad = int(np.argmax(index != expected))
        raise DLedgerError(RC.INCONSISTENT_INDEX, f"expected index {start + bad}, the node sent {int(index[bad])}")
    mv = memoryview(blob)
    body_start = (offs + HEADER_SIZE).tolist()
    body_end = (offs + size).tolist()
    crcs = h["body_crc"].tolist()
    bodies = [mv[a:b] for a, b in zip(body_start, body_end, strict=True)]
    for i, (b, c) in enumerate(zip(bodies, crcs, strict=True)):
        if crc32(b) != c:
            raise DLedgerError(RC.DISK_ERROR, f"entry failed verification: body CRC mismatch for index {start + i}")
    last = start + k - 1
    keep = None if include_noop else np.flatnonzero(magic == MAGIC_NORMAL)
    if keep is not None:
        if len(keep) == 0:
            return None, last
        if len(keep) < k:
            bodies = [bodies[i] for i in keep.tolist()]
            h, body_size = h[keep], body_size[keep]
    n = len(bodies)
    value_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(body_size, out=value_offsets[1:])
    body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets),
                                                  pa.py_buffer(b"".join(bodies))])
    type_codes = pa.array((h["magic"] == MAGIC_NOOP).astype(np.int8))
    return pa.RecordBatch.from_arrays([
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)), pa.array([node], pa.string()))
        .dictionary_decode(),
        pa.array(h["index"].astype(np.int64)),
        pa.array(h["term"].astype(np.int64)),
        pa.array(h["pos"].astype(np.int64)),
        pa.array(h["size"].astype(np.int32)),
        pa.DictionaryArray.from_arrays(type_codes, _TYPES).dictionary_decode(),
        body,
    ], names=NAMES), last
