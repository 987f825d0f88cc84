"""Byte formats of the store: data entries, BLANK padding records and index records.

Everything here is pure (bytes in, values out) so the store, the dispatchers, `dledger dump`
and the Spark decoder all agree on one definition. Layouts are DLedger's (docs/store.md), big-endian:

Data entry, 48-byte header + body::

    off  len  field      notes
      0    4  magic      NORMAL = 1, NOOP = 2, BLANK = -1 (file-end padding, see below)
      4    4  size       header + body
      8    8  index      0-based log index
     16    8  term       term of the leader that wrote it
     24    8  pos        physical offset of the entry in the data list
     32    4  channel    client session id (u32), 0 = none (node/core/sessions.py)
     36    4  chainCrc   the entry's sequence number in that session (u32), 0 without one
     40    4  bodyCrc    CRC-32 of the body (crcmod "crc-32" == zlib.crc32)
     44    4  bodySize   body length
     48    n  body

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

import importlib
import struct
import zlib
from dataclasses import dataclass
from typing import Final

import crcmod.predefined
from crc32c import crc32c as _crc32c  # the push run CRC only: see "Push run CRC" above

MAGIC_NORMAL: Final = 1
MAGIC_NOOP: Final = 2
MAGIC_BLANK: Final = -1
ENTRY_MAGICS: Final = frozenset({MAGIC_NORMAL, MAGIC_NOOP})

HEADER = struct.Struct(">iiqqqIIIi")  # channel, chainCrc unsigned: a session stamp (u32, u32)
HEADER_SIZE: Final = HEADER.size  # 48
INDEX = struct.Struct(">iqiqq")
INDEX_SIZE: Final = INDEX.size  # 32
BLANK = struct.Struct(">ii")
BLANK_SIZE: Final = BLANK.size  # 8, the room every data file keeps for its padding marker

# Offsets inside the header that a follower re-stamps without re-encoding the entry.
POS_OFFSET: Final = 24
INDEX_OFFSET: Final = 8
TERM_OFFSET: Final = 16
_POS = struct.Struct(">q")

# crcmod is the design's CRC library and the reference: `crc32_crcmod` ("crc-32", the same
# polynomial, reflection and final XOR as zlib). The hot path uses zlib.crc32, which computes
# identical values ~5x faster (0.8 vs 4.4 us per KiB here: with crcmod the CRC was over half of
# a batch append's cost). Equality is checked below at import, and on random data by
# tests/unit/test_codec.py. Without crcmod's C extension only the reference gets slow (~30x).
crc32_crcmod = crcmod.predefined.mkCrcFun("crc-32")
# (crcmod/__init__ re-exports names over its submodule, so reach `crcmod.crcmod` via importlib.)
CRC_USES_C_EXTENSION: Final[bool] = bool(
    getattr(importlib.import_module("crcmod.crcmod"), "_usingExtension", False))
crc32 = zlib.crc32
for _probe in (b"", b"123456789", bytes(range(256)) * 5):
    if crc32(_probe) != crc32_crcmod(_probe):  # pragma: no cover - would mean a broken zlib
        crc32 = crc32_crcmod
        break

TYPE_NAMES: Final = {MAGIC_NORMAL: "NORMAL", MAGIC_NOOP: "NOOP"}


class CodecError(ValueError):
    """Bytes that are not a well-formed entry or index record. The one error decoding raises."""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    magic: int
    size: int
    index: int
    term: int
    pos: int
    body_crc: int
    body_size: int

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.magic, f"MAGIC_{self.magic}")


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded data entry. `body` is a bytes-like view; copy it if you keep it."""

    index: int
    term: int
    pos: int
    body: bytes | memoryview
    magic: int = MAGIC_NORMAL

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.magic, f"MAGIC_{self.magic}")

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)


@dataclass(frozen=True, slots=True)
class IndexRecord:
    magic: int
    pos: int
    size: int
    index: int
    term: int


def encode_entry(index: int, term: int, pos: int, body: bytes, magic: int = MAGIC_NORMAL,
                 session: int = 0, seq: int = 0) -> bytes:
    """Encode one entry (header + body) with its body CRC; `session`/`seq` go to the two
    reserved fields (channel, chainCrc): a client session's stamp (node/core/sessions.py)."""
    n = len(body)
    return HEADER.pack(magic, HEADER_SIZE + n, index, term, pos, session, seq, crc32(body), n) + body


def encode_entry_into(buf: bytearray | memoryview, offset: int, index: int, term: int,
                      pos: int, body: bytes, magic: int = MAGIC_NORMAL) -> int:
    """Encode straight into a writable buffer (the mapped file); returns bytes written.

    Writing in place saves one copy per entry on the append path.
    """
    n = len(body)
    HEADER.pack_into(buf, offset, magic, HEADER_SIZE + n, index, term, pos, 0, 0, crc32(body), n)
    buf[offset + HEADER_SIZE: offset + HEADER_SIZE + n] = body
    return HEADER_SIZE + n


def decode_header(buf: bytes | memoryview, offset: int = 0) -> EntryHeader:
    """Decode and sanity-check an entry header. Raises CodecError on anything malformed."""
    if offset < 0 or len(buf) - offset < HEADER_SIZE:
        raise CodecError(f"short header: {len(buf) - offset} bytes at offset {offset}")
    magic, size, index, term, pos, _session, _seq, body_crc, body_size = HEADER.unpack_from(buf, offset)
    if magic not in ENTRY_MAGICS:
        raise CodecError(f"bad magic {magic} at offset {offset}")
    if body_size < 0 or size != HEADER_SIZE + body_size:
        raise CodecError(f"size {size} disagrees with body size {body_size} at offset {offset}")
    if index < 0 or term < 0 or pos < 0:
        raise CodecError(f"negative index/term/pos ({index}/{term}/{pos}) at offset {offset}")
    return EntryHeader(magic, size, index, term, pos, body_crc, body_size)


def decode_entry(buf: bytes | memoryview, offset: int = 0, verify_crc: bool = True) -> Entry:
    """Decode one whole entry at `offset`; the body is a zero-copy memoryview slice."""
    h = decode_header(buf, offset)
    end = offset + h.size
    if end > len(buf):
        raise CodecError(f"entry of {h.size} bytes at offset {offset} runs past the buffer ({len(buf)})")
    body = memoryview(buf)[offset + HEADER_SIZE:end]
    if verify_crc and crc32(body) != h.body_crc:
        raise CodecError(f"body CRC mismatch for index {h.index} at offset {offset}")
    return Entry(h.index, h.term, h.pos, body, h.magic)


def push_run_crc(index_records: bytes | memoryview, entries: bytes | memoryview) -> int:
    """The run CRC of an APPEND push (definition above): records first, then entries."""
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


def iter_entries(buf: bytes | memoryview, verify_crc: bool = True):
    """Decode a run of consecutive entries (e.g. one push frame). Raises CodecError if torn."""
    off, n = 0, len(buf)
    while off < n:
        e = decode_entry(buf, off, verify_crc)
        yield off, e
        off += e.size
