"""Read-only decoding of a store directory: `dledger dump`, the Spark data source, `verify`.

Pure on purpose (stdlib + `codec` + `layout`): it must run inside Spark executors and on a
machine where the node is not installed with its extras, and it must never disturb a running
node. So it maps files read-only, takes no locks, and holds no state beyond the mappings.

Three promises shape the code:

* **Bad data never raises.** A reader exists to *find* damage, so every entry becomes a row.
  A body whose CRC disagrees gives ``crc_ok=False``; a structural problem (magic, index, pos,
  size or term disagreeing between the index record and the data header, a pos outside the
  data files, a zero index record inside the log = a gap) gives an ``error`` string, with the
  fields that could still be read. Errors are ``"; "``-joined and each starts with a stable
  kind (``gap:``, ``index:``, ``pos:``, ``magic:``, ``size:``, ``term:``) so tools can count
  them with a prefix test.
* **Safe on a live store.** The node appends data, then the index record. The reader fixes the
  log end once, when it opens (the last non-zero index record), lists data files *after* that,
  and never reads past it; the last record, if it disagrees with its data header, is left out
  (it is the one the node may be writing right now; `tail_dropped` says so). Files are
  preallocated and never shrink (`node.store.mmap_file`), so a mapping can never SIGBUS.
* **Bounded memory.** Ranges decode in chunks (entry count and body bytes both capped), as
  columns (`decode_columns`) for Spark or rows (`iter_entries`) for dump.
* **Never a replaced file's bytes.** A truncation deletes files and appends re-create them
  under the same names; a mapping taken before holds the old inode (old-term entries that look
  valid). The store generation (`DIR/generation`, node.store.generation) fences it: the
  decoder notes it at open (waiting, bounded, while it is odd) and checks it again after
  every chunk of rows it decodes, before handing them out. When it moved, the decoder re-maps
  the store and decodes the chunk again (at most `MAX_RELOADS` times per pass); if it keeps
  moving, the chunk's rows carry an ``error`` starting with ``stale:``. Callers that decode
  through `index_slices`/`decode_record` themselves check `generation_moved()` likewise.
* **A log that begins after a snapshot** (`SegmentStore.reset_to`): the checkpoint names its
  base (index S, term T, data position P). The log is then [S + 1, end], and empty (begin
  S + 1, end S) until entries come. Data files that end at or before P belong to the log the
  reset replaced (present only when a reset was interrupted and the node has not reopened the
  store since): they are not mapped, so an index record still pointing into them is skipped
  like a record of a file retention deleted.
"""

from __future__ import annotations

import mmap
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.store import codec
from node.store.codec import ENTRY_MAGICS, HEADER, HEADER_SIZE, INDEX, INDEX_SIZE, TYPE_NAMES
from node.store.generation import GenerationView
from node.store.layout import (
    DATA_DIR,
    INDEX_DIR,
    LayoutError,
    LogBase,
    Segment,
    list_segments,
    read_checkpoint,
)

COLUMNS: tuple[str, ...] = (
    "index", "term", "pos", "size", "type", "body_crc", "crc_ok", "error", "body",
)
"""Column order of `decode_columns` and of `DecodedEntry` (the Spark schema adds `node` first)."""

DEFAULT_CHUNK_ENTRIES = 4096
DEFAULT_CHUNK_BYTES = 16 << 20  # body bytes per chunk: bounds memory for large entries

_ZERO_RECORD = bytes(INDEX_SIZE)
_NONZERO = re.compile(rb"[^\x00]")
_PROBE_BLOCK = 4096  # end search granularity: 128 index records per probe
_CHECK_ROWS = 1024  # rows decoded between two generation checks ...
_CHECK_BYTES = 4 << 20  # ... or entry bytes, whichever comes first
MAX_RELOADS = 3  # re-maps per pass when the generation moves, before rows are marked stale
_ODD_WAIT_S = 0.5  # how long opening waits for a destructive change to finish
STALE_ERROR = "stale: the store was truncated or recovered while this entry was read"


def _list(directory: Path) -> list[Segment]:
    """`list_segments`, tolerating a live writer: readdir racing a rename (a new segment
    moved into place) can miss a file and look like a hole, and retention can delete a file
    between listing and stat. Both pass on a second look; a real hole persists and raises."""
    for attempt in range(5):
        try:
            return list_segments(directory)
        except (FileNotFoundError, LayoutError):
            time.sleep(0.001 * (attempt + 1))
    return list_segments(directory)


def _type_name(magic: int) -> str:
    return TYPE_NAMES.get(magic, f"MAGIC_{magic}")


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """One row: what the store holds at `index`, or why it could not be read.

    Fields that could not be read are None (e.g. everything but `index` and `error` for a gap).
    """

    index: int
    term: int | None
    pos: int | None
    size: int | None
    type: str | None
    body_crc: int | None
    crc_ok: bool | None
    error: str | None
    body: bytes | None


class _Mapped:
    """One segment file mapped read-only; empty files (size 0) are not mapped at all."""

    __slots__ = ("seg", "mm", "view")

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.mm: mmap.mmap | None = None
        self.view: memoryview | None = None  # zero-copy slices for CRCs that need no copy
        if seg.size > 0:
            try:
                fd = os.open(seg.path, os.O_RDONLY)
            except FileNotFoundError:
                return  # deleted by retention since it was listed: as if it were not there
            try:
                self.mm = mmap.mmap(fd, seg.size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)  # the mapping keeps the file alive, even if retention deletes it
            self.view = memoryview(self.mm)

    def close(self) -> None:
        if self.view is not None:
            self.view.release()  # raises if a caller still holds a slice: a bug worth seeing
            self.view = None
        if self.mm is not None:
            self.mm.close()
            self.mm = None


class StoreDecoder:
    """A read-only view of one store directory, fixed at the moment it was opened.

    `begin_index`/`end_index` come from the index list (-1/-1 for an empty log, S + 1/S for
    an empty log that begins after a snapshot at S); `committed_index` and `base` (the log
    base, node.store.layout.LogBase, or None) from the checkpoint (-1 and None if there is
    none or it is unreadable, then `checkpoint_error` says why). Raises OSError (or `layout.LayoutError` for segment files
    that overlap or differ in size) only for a directory that is not a readable store.
    """

    def __init__(self, store_dir: str | os.PathLike[str], *,
                 crc: Callable[[Any], int] = codec.crc32) -> None:
        self.store_dir = Path(store_dir)
        if not self.store_dir.is_dir():
            raise NotADirectoryError(f"{self.store_dir}: not a directory")
        if not (self.store_dir / INDEX_DIR).is_dir() and not (self.store_dir / DATA_DIR).is_dir():
            raise FileNotFoundError(f"{self.store_dir}: no {DATA_DIR}/ or {INDEX_DIR}/: not a store directory")
        self._crc = crc
        self._gen = GenerationView(self.store_dir)
        self._index: list[_Mapped] = []
        self._data: list[_Mapped] = []
        self._load()

    def _load(self) -> None:
        """Map the store as it is now, at an even generation if one comes within
        `_ODD_WAIT_S` (a truncation or recovery in progress); `generation` is the value read
        before mapping, so any change after it is seen by `generation_moved()`."""
        deadline = time.monotonic() + _ODD_WAIT_S
        g = self._gen.read()
        while g % 2 and time.monotonic() < deadline:
            time.sleep(0.005)
            g = self._gen.read()
        self.generation = g
        self.checkpoint_error: str | None = None
        self.base: LogBase | None = None
        try:
            cp = read_checkpoint(self.store_dir)
            self.committed_index, self.base = cp.committed_index, cp.base
        except LayoutError as e:  # unreadable checkpoint: the log itself is still readable
            self.committed_index, self.checkpoint_error = -1, str(e)
        self._index = [_Mapped(s) for s in _list(self.store_dir / INDEX_DIR)]
        self.tail_dropped = False
        self.begin_index, self.end_index = self._find_bounds_in_index()
        # Data files are listed only now: every entry the index end covers was written (data
        # first) before we looked, so its file is already in place. Files of a log a reset
        # replaced (ending at or before the base position) are not the log.
        base = self.base
        self._data = [_Mapped(s) for s in _list(self.store_dir / DATA_DIR)
                      if base is None or s.end > base.pos]
        self.data_file_size = self._data[0].seg.size if self._data else 0
        self._data_base = self._data[0].seg.start if self._data else 0
        self._data_limit = self._data[-1].seg.end if self._data else 0
        if self.begin_index >= 0:
            self._drop_torn_tail()
        if self.begin_index >= 0 and self._data:
            self.begin_index = self._skip_retained_records(self.begin_index)
        elif self.begin_index >= 0 and base is not None:
            self.begin_index = self.end_index = -1  # records, but no data file of this log
        if base is not None and self.end_index <= base.index:
            # Nothing of the log after the base (only records of the replaced log, if any):
            # the empty log that begins after it.
            self.begin_index, self.end_index = base.index + 1, base.index
        elif base is not None and self.begin_index <= base.index:
            self.begin_index = base.index + 1  # the log never holds entries at or before its base

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        for m in self._index + self._data:
            m.close()
        self._index, self._data = [], []

    def generation_moved(self) -> bool:
        """True when the writer changed files destructively since this decoder mapped them (or
        is changing them now): rows decoded since may be a replaced file's bytes."""
        return self._gen.read() != self.generation

    def reload(self) -> None:
        """Re-map the store as it is now (new bounds, new files, new generation)."""
        self.close()
        self._load()

    def __enter__(self) -> StoreDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ bounds
    @property
    def data_base(self) -> int:
        """Global offset of the first byte of the first data file (non-zero after retention)."""
        return self._data_base

    @property
    def is_empty(self) -> bool:
        return self.end_index < self.begin_index or self.end_index < 0

    @property
    def count(self) -> int:
        return 0 if self.is_empty else self.end_index - self.begin_index + 1

    def _record(self, i: int) -> bytes | None:
        """The 32 raw bytes of index record `i`, or None if no index file holds it."""
        off = i * INDEX_SIZE
        for m in self._index:
            if m.seg.start <= off and off + INDEX_SIZE <= m.seg.end and m.mm is not None:
                rel = off - m.seg.start
                return m.mm[rel:rel + INDEX_SIZE]
        return None

    def _find_bounds_in_index(self) -> tuple[int, int]:
        maps = [m for m in self._index if m.mm is not None]
        if not maps:
            return -1, -1
        first = maps[0]
        hit = _NONZERO.search(first.mm)  # type: ignore[arg-type]
        if hit is None:
            # A first index file that is all zero: nothing was ever written (files after it
            # would be a store we did not write; treat them as empty too).
            return -1, -1
        begin = (first.seg.start + hit.start()) // INDEX_SIZE
        end = -1
        for m in reversed(maps):
            lo_byte = (begin * INDEX_SIZE - m.seg.start) if m is first else 0
            last = _last_nonzero_byte(m.mm, max(lo_byte, 0))  # type: ignore[arg-type]
            if last >= 0:
                end = (m.seg.start + last) // INDEX_SIZE
                break
        if end < begin:
            return -1, -1
        return begin, end

    def _drop_torn_tail(self) -> None:
        """The last index record may be the one the node is writing right now (struct packs
        field by field: magic, pos, size, index, then term). If it does not agree with its
        data header — which is always complete, being written first — it is not part of the
        log we observed. A CRC mismatch is kept: the body was written before the record."""
        raw = self._record(self.end_index)
        if raw is None:
            return
        row = self.decode_record(self.end_index, INDEX.unpack(raw), False)
        if row[7] is not None:  # error column
            self.tail_dropped = True
            self.end_index -= 1
            if self.end_index < self.begin_index:
                self.begin_index = self.end_index = -1

    def _skip_retained_records(self, begin: int) -> int:
        """Retention deletes whole data files but may keep the index file holding their
        records: the log begins at the first record whose entry is still in a data file."""
        raw = self._record(begin)
        if raw is None or INDEX.unpack(raw)[1] >= self._data_base:
            return begin
        lo, hi = begin, self.end_index + 1  # first record with pos >= data base, in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            r = self._record(mid)
            pos = INDEX.unpack(r)[1] if r is not None and r != _ZERO_RECORD else -1
            if pos >= self._data_base:
                hi = mid
            else:
                lo = mid + 1
        if lo > self.end_index:
            self.end_index = -1
            return -1
        return lo

    def clamp(self, from_index: int | None = None, to_index: int | None = None) -> tuple[int, int]:
        """The inclusive range [from, to] ∩ [begin, end]; empty when to < from."""
        lo = self.begin_index if from_index is None else max(from_index, self.begin_index)
        hi = self.end_index if to_index is None else min(to_index, self.end_index)
        if self.is_empty:
            return 0, -1
        return lo, hi

    # ------------------------------------------------------------------ data access
    def index_slices(self, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
        """Raw index records for [lo, hi] (already clamped) as (first index, bytes) pieces,
        one per index file touched. Records no file holds come back as zeros (= gaps)."""
        i = lo
        while i <= hi:
            off = i * INDEX_SIZE
            m = next((m for m in self._index if m.seg.start <= off < m.seg.end), None)
            if m is None or m.mm is None:
                nxt = min((x.seg.start for x in self._index if x.seg.start > off), default=None)
                last = hi if nxt is None else min(hi, nxt // INDEX_SIZE - 1)
                yield i, bytes((last - i + 1) * INDEX_SIZE)
            else:
                last = min(hi, (m.seg.end // INDEX_SIZE) - 1)
                rel = off - m.seg.start
                yield i, m.mm[rel:rel + (last - i + 1) * INDEX_SIZE]
            i = last + 1

    def locate(self, pos: int) -> tuple[mmap.mmap, memoryview, int, int] | None:
        """(mapping, its memoryview, offset in it, file size) of the data file holding `pos`,
        or None when no data file does."""
        if not self._data or pos < self._data_base or pos >= self._data_limit:
            return None
        m = self._data[(pos - self._data_base) // self.data_file_size]
        if m.mm is None or m.view is None:
            return None
        return m.mm, m.view, pos - m.seg.start, m.seg.size

    def data_file_of(self, pos: int) -> tuple[Path, int] | None:
        """(data file, offset in it) holding global position `pos`: for operators chasing a
        damaged entry to its bytes (and tests that damage one on purpose)."""
        if not self._data or not self._data_base <= pos < self._data_limit:
            return None
        m = self._data[(pos - self._data_base) // self.data_file_size]
        return m.seg.path, pos - m.seg.start

    def index_file_of(self, index: int) -> tuple[Path, int] | None:
        """(index file, offset in it) of entry `index`'s 32-byte index record."""
        off = index * INDEX_SIZE
        m = next((m for m in self._index if m.seg.start <= off < m.seg.end), None)
        return None if m is None else (m.seg.path, off - m.seg.start)

    # ------------------------------------------------------------------ decoding
    def decode_record(self, i: int, rec: tuple[int, int, int, int, int], body: bool) -> tuple:
        """Decode entry `i` given its index record: the one place that judges an entry.

        Returns a row tuple in `COLUMNS` order. Fast when all is well (one header unpack, one
        CRC); only a disagreement takes the slow path that words the error.
        """
        magic, pos, size, idx, term = rec
        if magic == 0 and pos == 0 and size == 0 and idx == 0 and term == 0:
            return (i, None, None, None, None, None, None, "gap: index record is zero", None)
        loc = self.locate(pos)
        if loc is not None:
            mm, view, off, fsize = loc
            if off + HEADER_SIZE <= fsize:
                (h_magic, h_size, h_index, h_term, h_pos, _ch, _chain, h_crc,
                 h_bsize) = HEADER.unpack_from(mm, off)
                if (h_magic == magic and h_size == size and h_index == i and idx == i
                        and h_pos == pos and h_term == term and h_bsize == size - HEADER_SIZE
                        and magic in ENTRY_MAGICS and off + size <= fsize):
                    if body:
                        b = mm[off + HEADER_SIZE:off + size]
                        return (i, term, pos, size, _type_name(magic), h_crc,
                                self._crc(b) == h_crc, None, b)
                    with view[off + HEADER_SIZE:off + size] as bv:
                        ok = self._crc(bv) == h_crc
                    return (i, term, pos, size, _type_name(magic), h_crc, ok, None, None)
        return self._decode_damaged(i, rec, body)

    def _decode_damaged(self, i: int, rec: tuple[int, int, int, int, int], body: bool) -> tuple:
        magic, pos, size, idx, term = rec
        errs: list[str] = []
        if magic not in ENTRY_MAGICS:
            errs.append(f"magic: index record magic {magic}")
        if idx != i:
            errs.append(f"index: index record holds index {idx}")
        if size < HEADER_SIZE:
            errs.append(f"size: index record size {size} is below the header size")
        loc = self.locate(pos)
        if loc is None or loc[2] + HEADER_SIZE > loc[3]:
            errs.append(f"pos: {pos} is outside the data files")
            return (i, term, pos, size, _type_name(magic), None, None, "; ".join(errs), None)
        mm, _view, off, fsize = loc
        (h_magic, h_size, h_index, h_term, h_pos, _ch, _chain, h_crc,
         h_bsize) = HEADER.unpack_from(mm, off)
        if h_magic not in ENTRY_MAGICS:
            # Not an entry header at all: nothing else in it can be trusted.
            errs.append(f"magic: data magic {h_magic} at pos {pos}")
            return (i, term, pos, size, _type_name(magic), None, None, "; ".join(errs), None)
        if h_magic != magic and magic in ENTRY_MAGICS:
            errs.append(f"magic: data magic {h_magic}, index record magic {magic}")
        if h_index != i:
            errs.append(f"index: data header holds index {h_index}")
        if h_pos != pos:
            errs.append(f"pos: data header holds pos {h_pos}")
        if h_term != term:
            errs.append(f"term: data header term {h_term}, index record term {term}")
        if h_size != size:
            errs.append(f"size: data header size {h_size}, index record size {size}")
        crc_ok: bool | None = None
        b: bytes | None = None
        if h_bsize < 0 or h_size != HEADER_SIZE + h_bsize:
            errs.append(f"size: body size {h_bsize} disagrees with entry size {h_size}")
        elif off + h_size > fsize:
            errs.append(f"size: entry of {h_size} bytes runs past the end of its data file")
        else:
            raw = mm[off + HEADER_SIZE:off + h_size]
            crc_ok = self._crc(raw) == h_crc
            b = raw if body else None
        error = "; ".join(errs) if errs else None
        return (i, h_term, pos, size, _type_name(h_magic), h_crc, crc_ok, error, b)

    def iter_rows(self, from_index: int | None = None, to_index: int | None = None, *,
                  body: bool = True) -> Iterator[tuple]:
        """Row tuples (`COLUMNS` order) for [from, to] ∩ [begin, end], in index order.

        Rows come in chunks checked against the store generation before they are handed out
        (module docstring): a chunk read while the writer replaced files is decoded again from
        a fresh mapping, or, if the store keeps changing, marked ``stale:``."""
        lo, hi = self.clamp(from_index, to_index)
        reloads = 0
        i = lo
        while i <= hi:
            rows, nxt = self._decode_chunk(i, hi, body)
            while self.generation_moved() and reloads < MAX_RELOADS:
                reloads += 1
                self.reload()
                i, hi = self.clamp(i, to_index)
                if i > hi:
                    return
                rows, nxt = self._decode_chunk(i, hi, body)
            if self.generation_moved():
                rows = [_stale(r) for r in rows]
            yield from rows
            i = nxt

    def _decode_chunk(self, i: int, hi: int, body: bool) -> tuple[list[tuple], int]:
        """Rows from `i` up to `hi`, at most `_CHECK_ROWS` rows / about `_CHECK_BYTES` bytes;
        returns them and the next index to decode."""
        decode = self.decode_record
        rows: list[tuple] = []
        nbytes = 0
        last = min(hi, i + _CHECK_ROWS - 1)
        for first, raw in self.index_slices(i, last):
            for k, rec in enumerate(INDEX.iter_unpack(raw)):
                row = decode(first + k, rec, body)
                rows.append(row)
                nbytes += row[3] or 0
                if nbytes >= _CHECK_BYTES:
                    return rows, first + k + 1
        return rows, last + 1

    def iter_entries(self, from_index: int | None = None, to_index: int | None = None, *,
                     body: bool = True) -> Iterator[DecodedEntry]:
        """Like `iter_rows`, as `DecodedEntry` objects (what dump prints)."""
        for row in self.iter_rows(from_index, to_index, body=body):
            yield DecodedEntry(*row)

    def decode_columns(self, from_index: int | None = None, to_index: int | None = None, *,
                       body: bool = True, chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
                       chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[dict[str, list]]:
        """Columnar chunks {column: list} for [from, to]: at most `chunk_entries` rows and
        about `chunk_bytes` of entry bytes each (one entry may exceed it)."""
        rows: list[tuple] = []
        nbytes = 0
        for row in self.iter_rows(from_index, to_index, body=body):
            rows.append(row)
            nbytes += row[3] or 0
            if len(rows) >= chunk_entries or nbytes >= chunk_bytes:
                yield rows_to_columns(rows)
                rows, nbytes = [], 0
        if rows:
            yield rows_to_columns(rows)


def _stale(row: tuple) -> tuple:
    """The row with `STALE_ERROR` added to its error column (COLUMNS[7])."""
    err = row[7]
    return row[:7] + (STALE_ERROR if err is None else f"{err}; {STALE_ERROR}",) + row[8:]


def rows_to_columns(rows: list[tuple]) -> dict[str, list]:
    """Transpose row tuples into {column: list} in `COLUMNS` order."""
    if not rows:
        return {c: [] for c in COLUMNS}
    return dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True))


def _last_nonzero_byte(mm: mmap.mmap, lo: int) -> int:
    """Offset of the last non-zero byte at or after `lo`, or -1.

    The used part of an index file is a prefix and the rest is zero, so "block holds a non-zero
    byte" is monotone at block granularity (a one-record gap cannot zero a whole 4 KiB block):
    binary search over blocks, then scan one block. O(log n) page touches instead of reading a
    160 MiB file.
    """
    n = len(mm)
    if lo >= n:
        return -1
    blocks = (n - lo + _PROBE_BLOCK - 1) // _PROBE_BLOCK

    def nonzero(b: int) -> bool:
        a = lo + b * _PROBE_BLOCK
        return _NONZERO.search(mm, a, min(n, a + _PROBE_BLOCK)) is not None  # type: ignore[call-overload]

    if not nonzero(0):
        return -1
    left, right = 0, blocks - 1  # invariant: block `left` is non-zero
    while left < right:
        mid = (left + right + 1) // 2
        if nonzero(mid):
            left = mid
        else:
            right = mid - 1
    a = lo + left * _PROBE_BLOCK
    chunk = mm[a:min(n, a + _PROBE_BLOCK)]
    return a + len(chunk.rstrip(b"\x00")) - 1
