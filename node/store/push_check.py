"""The follower's checks of a pushed run against the leader's index records, before storing it.

A push (APPEND) carries a run of encoded entries (``mv``, store format: node/store/codec.py)
and the leader's 32-byte index records for it (``recs``, one per entry). Before the follower
copies the run verbatim, every entry is checked (docs/store.md, "Follower append"):

* its record: magic NORMAL/NOOP, size >= 48, index consecutive from the first record, pos
  contiguous from the first (``pos0 + sum of the sizes before it``), term never decreasing,
  the entry inside the run;
* its header against its record: magic, size, index, term, pos equal, body size = size - 48;
* no bytes after the last entry;
* its bytes: either one CRC over the whole run against the leader's run CRC
  (`check_run_crc`, definition: `codec.push_run_crc`) or, without one, the body CRC of every
  entry (``verify_bodies``).

Why two implementations of one check: the Python loop costs ~0.3 µs per entry (two struct
unpacks and a tuple compare); numpy does the same comparisons as whole-array operations
(~0.02 µs per entry at 4096 entries) but costs ~21 µs per call whatever the run length.
Measured (``python -m tools.bench.push_check --implementations``) they break even at 72-80
entries, so `check_run` uses the loop below `NUMPY_MIN_RUN` (80) and numpy from there.
Both raise the same StoreError (UNEXPECTED_ARGUMENT) with the same message: a record or
header fault first (the first entry that has one), then a body CRC (the first bad body);
tests/unit/test_store_push_checks.py holds them to it on random runs.

numpy is imported at module level, not lazily: only the handler imports the store, once, at
start (+~50 ms on a ~90 ms import here); a lazy import would instead stall the first push of
80 entries or more, on the commit path.
"""

from __future__ import annotations

import struct

import numpy as np

from node.store.base import StoreError
from node.store.codec import (
    ENTRY_MAGICS,
    HEADER_SIZE,
    INDEX,
    INDEX_OFFSET,
    INDEX_SIZE,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    crc32,
    push_run_crc,
)

NUMPY_MIN_RUN = 80
"""Runs of at least this many entries are checked with numpy, shorter ones with the loop
(break-even measured at 72-80 entries of 128 B: loop ~0.3 µs/entry, numpy ~21 µs per call)."""

PLAIN_MIN_RUN = 32
"""From this many entries `check_run` first tries `plain_run_ok` (~9 µs + ~0.03 µs/entry
here; the loop costs ~0.33 µs/entry, so they break even near 28 entries)."""

_MAX_START = 1 << 62  # first index / pos beyond this (or negative) is refused: no int64 overflow

# The header fields a record pins down, in header order (channel, chainCrc, bodyCrc skipped):
# magic, size, index, term, pos, bodySize. A tuple compare against it is one C call.
_HDR_CHECK = struct.Struct(">iiqqq12xi")
# From the index field on: index, (term, pos, channel, chainCrc skipped), bodyCrc, bodySize.
_BODY_FIELDS = struct.Struct(">q24xIi")

_REC_DT = np.dtype([("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"),
                    ("term", ">i8")])
_HDR_DT = np.dtype([("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"),
                    ("pos", ">i8"), ("channel", ">i4"), ("chain", ">i4"), ("crc", ">u4"),
                    ("body", ">i4")])
_HDR_RAW = np.dtype(f"V{HEADER_SIZE}")
_NORMAL = struct.pack(">i", MAGIC_NORMAL)
_TERM = struct.Struct(">q")
_min = np.minimum.reduce
assert _REC_DT.itemsize == INDEX_SIZE and _HDR_DT.itemsize == HEADER_SIZE


# ---- the errors: one place builds each message, so both implementations say the same -------

def _record_error(i: int, idx0: int, rec: tuple[int, int, int, int, int]) -> StoreError:
    magic, pos, size, index, term = rec
    return StoreError(f"push index record {i} ({idx0 + i}) is not consecutive or does not fit "
                      f"the run: magic {magic} pos {pos} size {size} index {index} term {term}",
                      "UNEXPECTED_ARGUMENT")


def _header_error(index: int) -> StoreError:
    return StoreError(f"push entry {index}: header disagrees with its index record",
                      "UNEXPECTED_ARGUMENT")


def _body_error(index: int) -> StoreError:
    return StoreError(f"push entry {index}: body CRC mismatch", "UNEXPECTED_ARGUMENT")


def _trailing_error(blen: int, off: int) -> StoreError:
    return StoreError(f"push of {blen} bytes holds {off} bytes of entries", "UNEXPECTED_ARGUMENT")


def _check_start(recs: memoryview | bytes, n: int, blen: int) -> None:
    """The first record's index and pos must leave room for the run in an int64 (so numpy's
    sums cannot wrap where Python's ints would not); `n` records must be there."""
    if n <= 0 or len(recs) < n * INDEX_SIZE:
        raise StoreError(f"push of {len(recs)} bytes of index records for {n} entries",
                         "UNEXPECTED_ARGUMENT")
    rec = INDEX.unpack_from(recs, 0)
    _m, pos0, _s, idx0, _t = rec
    if not (0 <= pos0 <= _MAX_START - blen and 0 <= idx0 <= _MAX_START - n):
        raise _record_error(0, idx0, rec)


# ---- the run CRC --------------------------------------------------------------------------------

def check_run_crc(mv: memoryview | bytes, recs: memoryview | bytes, run_crc: int) -> None:
    """One CRC over the records and the entries (two C calls) against the leader's run CRC:
    it covers every byte the leader sent, so the per-entry body CRCs need not be checked."""
    got = push_run_crc(recs, mv)
    if got != run_crc:
        raise StoreError(f"push run CRC mismatch: {got:#010x} computed over {len(recs)} bytes of "
                         f"index records and {len(mv)} bytes of entries, the leader sent "
                         f"{run_crc:#010x}", "UNEXPECTED_ARGUMENT")


# ---- records and headers --------------------------------------------------------------------

def check_run(mv: memoryview, recs: memoryview, n: int, verify_bodies: bool) -> None:
    """Every entry of the run against its index record (and its body CRC if `verify_bodies`).
    Raises StoreError. Below `PLAIN_MIN_RUN` entries the loop decides; from there a run that
    `plain_run_ok` accepts is done, and any other run (a NOOP, a term change, or a defect) is
    decided by the loop or numpy, which also name the first bad entry."""
    if n >= PLAIN_MIN_RUN and plain_run_ok(mv, recs, n):
        if verify_bodies:
            _check_bodies(mv, n)
        return
    if n < NUMPY_MIN_RUN:
        check_run_loop(mv, recs, n, verify_bodies)
    else:
        check_run_numpy(mv, recs, n, verify_bodies)


def plain_run_ok(mv: memoryview | bytes, recs: memoryview | bytes, n: int) -> bool:
    """True when the run is plain and passes every check of `check_run_loop` but the body
    CRCs: all NORMAL entries of one term, records consecutive and contiguous, each header
    equal to its record, the entries tiling the run. False for anything else, including runs
    that are fine but not plain (a NOOP, a term change): the caller then decides in full.

    Why a second formulation: the bench's pushes are plain runs of ~100-250 entries, and
    `check_run_numpy`'s ~65 numpy calls cost ~21 µs per push here, ~60 µs inside a busy
    follower, enough to move the pipelined bench line. A plain run is described by its
    first record and the sizes alone, so most fields are checked as bytes against the
    expected bytes (one C compare each), ~20 numpy calls in all (~10 µs at 250 entries)."""
    blen = len(mv)
    if n <= 0 or len(recs) < n * INDEX_SIZE:
        return False
    _m, pos0, _s, idx0, term0 = INDEX.unpack_from(recs, 0)
    if not (0 <= pos0 <= _MAX_START - blen and 0 <= idx0 <= _MAX_START - n):
        return False
    rec = np.frombuffer(recs, dtype=_REC_DT, count=n)
    magics, terms = _NORMAL * n, _TERM.pack(term0) * n
    if rec["magic"].tobytes() != magics or rec["term"].tobytes() != terms:
        return False
    size = rec["size"].astype(np.int64)
    if _min(size) < HEADER_SIZE:
        return False
    ends = size.cumsum()
    if int(ends[-1]) != blen:  # sizes are >= 48, so every entry lies inside the run
        return False
    offs = ends - size
    indexes = np.arange(idx0, idx0 + n, dtype=">i8").tobytes()
    positions = (offs + pos0).astype(">i8").tobytes()
    if rec["index"].tobytes() != indexes or rec["pos"].tobytes() != positions:
        return False
    hdr = _headers(mv, offs)
    return (hdr["magic"].tobytes() == magics and hdr["term"].tobytes() == terms
            and hdr["index"].tobytes() == indexes and hdr["pos"].tobytes() == positions
            and hdr["size"].tobytes() == rec["size"].tobytes()
            and hdr["body"].tobytes() == (size - HEADER_SIZE).astype(">i4").tobytes())


def check_run_loop(mv: memoryview, recs: memoryview, n: int, verify_bodies: bool) -> None:
    """`check_run` as one Python loop: per entry one record from `iter_unpack`, one header
    unpack compared as a tuple with what the record says (then, if asked, the body CRCs)."""
    blen = len(mv)
    _check_start(recs, n, blen)
    unpack_hdr, magics = _HDR_CHECK.unpack_from, ENTRY_MAGICS
    _m, pos, _s, index, term = INDEX.unpack_from(recs, 0)
    idx0, off = index, 0
    for rec in INDEX.iter_unpack(recs[:n * INDEX_SIZE]):
        magic, r_pos, size, r_index, r_term = rec
        if (r_index != index or r_pos != pos or r_term < term or magic not in magics
                or not HEADER_SIZE <= size <= blen - off):
            raise _record_error(index - idx0, idx0, rec)
        term = r_term
        if unpack_hdr(mv, off) != (magic, size, index, term, pos, size - HEADER_SIZE):
            raise _header_error(index)
        off += size
        pos += size
        index += 1
    if off != blen:
        raise _trailing_error(blen, off)
    if verify_bodies:
        _check_bodies(mv, n)


def check_run_numpy(mv: memoryview, recs: memoryview, n: int, verify_bodies: bool) -> None:
    """`check_run` as whole-array operations: the records as one big-endian structured array,
    the 48-byte headers gathered with one fancy index at their offsets, the fields compared
    as arrays; the first failing row (argmax) is described as the loop would describe it."""
    blen = len(mv)
    _check_start(recs, n, blen)
    rec = np.frombuffer(recs, dtype=_REC_DT, count=n)
    size = rec["size"].astype(np.int64)
    ends = np.cumsum(size)
    offs = ends - size
    bad = _bad_records(rec, size, offs, ends, blen)
    k = int(bad.argmax()) if bad.any() else n  # rows before k have sane records: inside the run
    hdr = _headers(mv, offs[:k])
    r = rec[:k]
    bad_h = ((hdr["magic"] != r["magic"]) | (hdr["size"] != r["size"]) | (hdr["index"] != r["index"])
             | (hdr["term"] != r["term"]) | (hdr["pos"] != r["pos"])
             | (hdr["body"] != size[:k] - HEADER_SIZE))
    first = int(bad_h.argmax()) if bad_h.any() else k
    if first < k:
        raise _header_error(int(rec["index"][first]))
    if k < n:
        raise _record_error(k, int(rec["index"][0]), INDEX.unpack_from(recs, k * INDEX_SIZE))
    if int(ends[-1]) != blen:
        raise _trailing_error(blen, int(ends[-1]))
    if verify_bodies:
        _check_bodies(mv, n)


def _bad_records(rec: np.ndarray, size: np.ndarray, offs: np.ndarray, ends: np.ndarray,
                 blen: int) -> np.ndarray:
    """Row mask of the loop's record condition. Only the rows up to the first True matter
    (the loop stops there), and for those `offs`/`ends` are exact: every earlier size is sane."""
    n = len(rec)
    magic, term = rec["magic"], rec["term"]
    term_back = np.zeros(n, dtype=bool)
    term_back[1:] = term[1:] < term[:-1]
    return ((rec["index"] != rec["index"][0] + np.arange(n, dtype=np.int64))
            | (rec["pos"] != rec["pos"][0] + offs) | term_back
            | ((magic != MAGIC_NORMAL) & (magic != MAGIC_NOOP)) | (size < HEADER_SIZE) | (ends > blen))


def _headers(mv: memoryview, offs: np.ndarray) -> np.ndarray:
    """The 48-byte headers at byte offsets `offs` of the run, as one structured array: a view
    of the run in which element j is the 48 bytes starting at byte j (stride 1, overlapping),
    indexed once with `offs`, then read as headers. Gathered as plain 48-byte items ("V48"):
    a structured dtype would be copied field by field (~3x slower at 64 entries). Every offset
    must leave 48 bytes (the caller's records say so)."""
    if len(offs) == 0:
        return np.zeros(0, dtype=_HDR_DT)
    starts = np.ndarray(shape=(len(mv) - HEADER_SIZE + 1,), dtype=_HDR_RAW, buffer=mv, strides=(1,))
    return starts[offs].view(_HDR_DT)


def _check_bodies(mv: memoryview, n: int) -> None:
    """Per-entry body CRCs, for pushes without a run CRC: one zlib call per entry, in order.
    Runs after the header checks passed, so the `n` entries are known to tile `mv`."""
    unpack, off = _BODY_FIELDS.unpack_from, 0
    for _ in range(n):
        index, body_crc, body_size = unpack(mv, off + INDEX_OFFSET)
        start = off + HEADER_SIZE
        off = start + body_size
        if crc32(mv[start:off]) != body_crc:
            raise _body_error(index)
