"""Byte formats of the store: data entries, BLANK padding records and index records.

Everything here is pure (bytes in, values out) so the store, the dispatchers, `dledger dump`
and the Spark decoder all agree on one definition. Layouts are DLedger's (docs/store.md), big-endian:

Data entry: a 48-byte header and the body. Its format is defined once, with its field table,
in ipc/entry_codec.py (the client decodes entries too), and re-exported here; the store adds
magic BLANK = -1, the file-end padding below.

BLANK record: ``[int -1][int remaining]`` filling a data file's unused tail, so an entry never
spans two files. Index record, 32 bytes: magic(4) pos(8) size(4) index(8) term(8); entry ``i``
lives at index-list offset ``i * 32``.

Push run CRC (`push_run_crc`), carried by an APPEND push (ipc/protocol.py ``run_crc``): the
CRC-32C (Castagnoli, the `crc32c` package) of the push's index records followed by its entries
blob, ``crc32c(entries, crc32c(index_records))``, an unsigned 32-bit value. With no index
records it is ``crc32c(entries)``. One value over every byte the leader sent lets the follower
check the run with two C calls instead of one body CRC per entry (node/store/push_check.py).
Why CRC-32C and not the store's CRC-32: it is only a wire check (nothing stores it), and the
CPU computes it (SSE4.2/ARMv8 CRC instructions): ~30 GB/s here against zlib's ~5.7, which
took ~0.4 µs per KiB pushed on the leader's dispatchers and again on each follower, enough
to move the pipelined single-append bench line (docs/performance.md). Without those
instructions the package falls back to a table implementation: the same values, slower.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

# The entry format itself is the client's too (it decodes GET answers): it lives in
# ipc/entry_codec.py and is re-exported here, so the store's modules keep importing it from here.
from ipc.entry_codec import (  # noqa: F401
    BODY_CRC_OFFSET,
    CRC_USES_C_EXTENSION,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    INDEX_OFFSET,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    POS_OFFSET,
    TERM_OFFSET,
    TYPE_NAMES,
    CodecError,
    Entry,
    EntryHeader,
    crc32,
    crc32_crcmod,
    decode_entry,
    decode_header,
    encode_entry,
    encode_entry_into,
    iter_entries,
)

MAGIC_BLANK: Final = -1
INDEX = struct.Struct(">iqiqq")
INDEX_SIZE: Final = INDEX.size  # 32
BLANK = struct.Struct(">ii")
BLANK_SIZE: Final = BLANK.size  # 8, the room every data file keeps for its padding marker

_POS = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class IndexRecord:
    magic: int
    pos: int
    size: int
    index: int
    term: int


_crc32c = None
"""`crc32c.crc32c`, imported on first use: the package reads its own distribution metadata when
imported (~15 ms of CPU), which the supervisor and the CLI, who import this module for its
constants, never need. The role zygote imports the package once for every role it forks."""


def push_run_crc(index_records: bytes | memoryview, entries: bytes | memoryview) -> int:
    """The run CRC of an APPEND push (definition above): records first, then entries."""
    global _crc32c
    if _crc32c is None:
        from crc32c import crc32c as _crc32c  # see "Push run CRC" above
    return _crc32c(entries, _crc32c(index_records))


def restamp_pos(buf: bytearray | memoryview, offset: int, pos: int) -> None:
    """Overwrite only the pos field: how a follower stores the leader's bytes without re-encoding."""
    _POS.pack_into(buf, offset + POS_OFFSET, pos)


def encode_blank(remaining: int) -> bytes:
    """The padding marker written where the next entry does not fit in the current file."""
    return BLANK.pack(MAGIC_BLANK, remaining)


def encode_index(magic: int, pos: int, size: int, index: int, term: int) -> bytes:
    return INDEX.pack(magic, pos, size, index, term)


def decode_index(buf: bytes | memoryview, offset: int = 0) -> IndexRecord:
    if offset < 0 or len(buf) - offset < INDEX_SIZE:
        raise CodecError(f"short index record at offset {offset}")
    magic, pos, size, index, term = INDEX.unpack_from(buf, offset)
    if magic not in ENTRY_MAGICS:
        raise CodecError(f"bad index magic {magic} at offset {offset}")
    if size < HEADER_SIZE or pos < 0 or index < 0 or term < 0:
        raise CodecError(f"malformed index record at offset {offset}")
    return IndexRecord(magic, pos, size, index, term)


