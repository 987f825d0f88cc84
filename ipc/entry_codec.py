"""The byte format of one log entry: what a node stores and sends, and what a client reading
entries back (GET) decodes and verifies.

Both ends of the wire need it, so it lives on the wire side and the store (node/store/codec.py,
which adds the store-only records: index records, file-end padding, the push run CRC)
re-exports it. Pure: bytes in, values out. Layout (DLedger's), big-endian, 48-byte header +
body::

    off  len  field      notes
      0    4  magic      NORMAL = 1, NOOP = 2 (BLANK = -1 is the store's file-end padding)
      4    4  size       header + body
      8    8  index      0-based log index
     16    8  term       term of the leader that wrote it
     24    8  pos        physical offset of the entry in the data list
     32    4  channel    client session id (u32), 0 = none (ipc/client/sessions.py)
     36    4  chainCrc   the entry's sequence number in that session (u32), 0 without one
     40    4  bodyCrc    CRC-32 of the body (crcmod "crc-32" == zlib.crc32)
     44    4  bodySize   body length
     48    n  body
"""

from __future__ import annotations

import importlib
import struct
import zlib
from dataclasses import dataclass
from typing import Final

import crcmod.predefined

MAGIC_NORMAL: Final = 1
MAGIC_NOOP: Final = 2
ENTRY_MAGICS: Final = frozenset({MAGIC_NORMAL, MAGIC_NOOP})

HEADER = struct.Struct(">iiqqqIIIi")  # channel, chainCrc unsigned: a session stamp (u32, u32)
HEADER_SIZE: Final = HEADER.size  # 48

# Offsets inside the header that a follower re-stamps without re-encoding the entry.
POS_OFFSET: Final = 24
INDEX_OFFSET: Final = 8
TERM_OFFSET: Final = 16
# Where the body CRC sits (damage tests and the simulator's fault `rot` flip it: a damaged entry
# whatever its body, an empty NOOP's too).
BODY_CRC_OFFSET: Final = 40

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


def encode_entry(index: int, term: int, pos: int, body: bytes, magic: int = MAGIC_NORMAL,
                 session: int = 0, seq: int = 0) -> bytes:
    """Encode one entry (header + body) with its body CRC; `session`/`seq` go to the two
    reserved fields (channel, chainCrc): a client session's stamp (ipc/seq.py)."""
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


def iter_entries(buf: bytes | memoryview, verify_crc: bool = True):
    """Decode a run of consecutive entries (e.g. one push frame). Raises CodecError if torn."""
    off, n = 0, len(buf)
    while off < n:
        e = decode_entry(buf, off, verify_crc)
        yield off, e
        off += e.size
