"""Read-only access to a live store from another process (dispatchers, GET helpers).

The handler is the only writer. A reader maps the same files read-only and reads entries only
up to an end the writer has *published* (the ledger end in the shared block): the writer puts
data, then the index record, then publishes, so everything at or below a published end is
complete. Files the writer created or deleted since the last look are picked up by `refresh`.
A reader never trusts bytes blindly: every record is checked against the index it was asked
for, and a mismatch (a truncation racing the read) is reported as `StaleRead`, never served.

Record checks cannot catch a file that a truncation deleted and an append re-created under the
same name: the old inode still mapped here holds entries with the right index and a valid
record, of an old term. The store generation (node.store.generation) fences that:

    reader.begin(led.store_generation)   # StaleRead unless the files are that generation
    blob, n, recs = reader.get_run(...)  # (refreshes mappings first when it moved)
    reader.validate(led.store_generation)  # StaleRead if a change started meanwhile
    send(blob, recs)                     # only now use what was read

A log that begins after a snapshot (`SegmentStore.reset_to`) has no entry at its base S: the
reader takes (S, T) from the checkpoint at every refresh, so `term_at(S)` answers T (the
dispatcher's COMPARE at S needs it). A reset moves the generation, so the next `begin` refreshes
and sees the new base; an empty log has no files at all, and reads of it are StaleRead like any
read past the published end.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from node.store import codec
from node.store.codec import INDEX, INDEX_SIZE
from node.store.generation import GenerationView
from node.store.layout import (
    DATA_DIR,
    INDEX_DIR,
    LayoutError,
    LogBase,
    list_segments,
    longest_fitting_run,
    read_checkpoint,
)
from node.store.mmap_file import MappedFileList


class StaleRead(Exception):
    """What the reader found does not match what it was asked for; refresh and retry, or
    give up until the writer publishes a consistent end."""


class StoreReader:
    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(store_dir)
        self._data: MappedFileList | None = None
        self._index: MappedFileList | None = None
        self._seen_begin = -1
        self._gen = GenerationView(self.dir)
        self._seen_gen: int | None = None  # the generation the mappings were last refreshed at
        self._base: LogBase | None = None  # the log base as of the last refresh
        try:
            self.refresh()
        except StaleRead:
            pass  # the writer is changing files right now: the first read refreshes again

    # ------------------------------------------------------------------ generation fence
    @property
    def generation(self) -> int:
        """The store's generation counter as it is now (odd while the writer changes files)."""
        return self._gen.read()

    def begin(self, generation: int) -> None:
        """Start a read for the ledger state published with `generation` (the handler publishes
        it with the ledger end). Raises StaleRead when the files are not that generation (the
        writer is changing them, or changed them after publishing): try again on the next
        snapshot. When the generation moved since this reader last refreshed, its mappings are
        refreshed first (closing replaced inodes and mapping their replacements)."""
        g = self._gen.read()
        if g != generation or g % 2:
            raise StaleRead(f"{self.dir}: store generation is {g}, the snapshot is of {generation}")
        if g != self._seen_gen:
            self.refresh()
            self._seen_gen = g  # the value read *before* the refresh: a later move refreshes again

    def validate(self, generation: int) -> None:
        """After reading, before using what was read: raise StaleRead when the generation is no
        longer `generation` (a destructive change started meanwhile: what was read may be a
        replaced file's bytes)."""
        g = self._gen.read()
        if g != generation:
            raise StaleRead(f"{self.dir}: store generation moved from {generation} to {g} during the read")

    def _lists(self) -> tuple[MappedFileList, MappedFileList]:
        if self._data is None or self._index is None:
            raise StaleRead(f"{self.dir}: store has no files yet")
        return self._data, self._index

    def follow_begin(self, ledger_begin_index: int) -> None:
        """Call with the published ledger begin: when retention has moved it, drop the mappings
        of the deleted files. Until a process unmaps a deleted file the kernel cannot give its
        space back, so every long-lived reader calls this on its loop.

        It also refreshes when the store generation moved (to an even value) since the last
        refresh, so a mapping of a replaced file never outlives one loop. That alone does not
        make a read safe (a truncation can start during it): `begin`/`validate` do."""
        g = self._gen.read()
        if ledger_begin_index != self._seen_begin or (g != self._seen_gen and g % 2 == 0):
            self._seen_begin = ledger_begin_index
            try:
                self.refresh()
            except StaleRead:
                return  # files changing under the listing: the next loop looks again
            self._seen_gen = g

    @property
    def log_base(self) -> LogBase | None:
        """The log base (node.store.layout.LogBase) as of the last refresh, or None."""
        return self._base

    def refresh(self) -> None:
        """Map files created since the last look, unmap deleted ones, re-map replaced ones, and
        re-read the log base. A listing that races the writer (a file half-way through being
        deleted) is StaleRead."""
        try:
            # The checkpoint is replaced by rename: this sees the old or the new one whole. A
            # damaged one only costs term_at of the base (StaleRead, as if unknown).
            self._base = read_checkpoint(self.dir).base
        except (LayoutError, OSError):
            self._base = None
        try:
            for name, attr in ((DATA_DIR, "_data"), (INDEX_DIR, "_index")):
                lst = getattr(self, attr)
                if lst is None:
                    segs = list_segments(self.dir / name)
                    if not segs:
                        continue
                    lst = MappedFileList(self.dir / name, segs[0].size, readonly=True)
                    setattr(self, attr, lst)
                lst.refresh()
        except (LayoutError, FileNotFoundError) as e:
            self._seen_gen = None  # whatever is mapped now, look again next time
            raise StaleRead(f"{self.dir}: files changed while listing them: {e}") from e

    def _record(self, index: int) -> tuple[int, int, int, int, int]:
        _data, idx = self._lists()
        f = idx.find(index * INDEX_SIZE)
        if f is None:
            raise StaleRead(f"index record {index} not mapped")
        rel = index * INDEX_SIZE - f.start
        rec = INDEX.unpack_from(f.mm, rel)
        if rec[0] not in codec.ENTRY_MAGICS or rec[3] != index:
            raise StaleRead(f"index record {index} not (yet) valid: {rec}")
        return rec

    def term_at(self, index: int) -> int:
        """The term of entry `index`, or of the log base when `index` is its index (a log that
        begins after a snapshot holds no entry there). StaleRead when neither is known."""
        b = self._base
        if b is not None and index == b.index:
            return b.term
        return self._with_refresh(lambda: self._record(index)[4])

    def get_raw(self, index: int, end_index: int, max_count: int, max_bytes: int) -> tuple[memoryview, int]:
        """Consecutive encoded entries [index, ...] as one zero-copy slice of a data file, at most
        `max_count` entries / `max_bytes` bytes (at least one entry), never past `end_index`
        (the published ledger end) nor across a data file end."""
        blob, n, _recs = self.get_run(index, end_index, max_count, max_bytes)
        return blob, n

    def get_run(self, index: int, end_index: int, max_count: int,
                max_bytes: int) -> tuple[memoryview, int, memoryview]:
        """`get_raw` plus the run's index records (a zero-copy slice of the index file): what a
        dispatcher pushes, so the follower can store the run without parsing every entry."""
        if index > end_index:
            raise StaleRead(f"index {index} beyond published end {end_index}")
        return self._with_refresh(lambda: self._get_run(index, end_index, max_count, max_bytes))

    def _get_run(self, index: int, end_index: int, max_count: int,
                 max_bytes: int) -> tuple[memoryview, int, memoryview]:
        data, idx = self._lists()
        _m, pos, size, _i, term = self._record(index)
        f = data.find(pos)
        if f is None:
            raise StaleRead(f"data for entry {index} (pos {pos}) not mapped")
        rel = pos - f.start
        if size < codec.HEADER_SIZE or rel + size > f.size:
            raise StaleRead(f"entry {index} (pos {pos}, size {size}) does not fit its data file")
        h = codec.HEADER.unpack_from(f.mm, rel)
        if h[2] != index or h[3] != term or h[1] != size:
            raise StaleRead(f"entry at pos {pos} is index {h[2]}/term {h[3]}, expected {index}/{term}")
        xf = idx.find(index * INDEX_SIZE)
        if xf is None:
            raise StaleRead(f"index record {index} not mapped")
        xrel = index * INDEX_SIZE - xf.start
        # Candidates: up to max_count, the published end, and the end of this index file.
        k = min(max(max_count, 1), end_index - index + 1, (xf.size - xrel) // INDEX_SIZE)

        def fits(j: int) -> bool:  # do entries index .. index+j-1 form one run within bounds?
            m, p, sz, i, _t = INDEX.unpack_from(xf.mm, xrel + (j - 1) * INDEX_SIZE)
            return (m in codec.ENTRY_MAGICS and i == index + j - 1 and p >= pos
                    and p + sz <= f.end and p + sz - pos <= max_bytes)

        k = longest_fitting_run(k, fits)
        _m, p, sz, _i, t = INDEX.unpack_from(xf.mm, xrel + (k - 1) * INDEX_SIZE)
        # Read again, so a truncation that rewrote the record since `fits` saw it (or since
        # `_record`) can hand us anything: a record outside this run is a stale read, never an
        # offset out of the mapping (seen: a reader process died on struct.error).
        if not (pos <= p and sz >= codec.HEADER_SIZE and p + sz <= f.end) or (k == 1 and (p, sz) != (pos, size)):
            raise StaleRead(f"index record {index + k - 1} changed under the read")
        if k > 1:  # check the last header too: both ends must be what the index says
            hl = codec.HEADER.unpack_from(f.mm, p - f.start)
            if hl[2] != index + k - 1 or hl[3] != t or hl[1] != sz:
                raise StaleRead(f"entry at pos {p} is not index {index + k - 1}")
        end = p + sz - f.start
        return f.view[rel:end], k, xf.view[xrel: xrel + k * INDEX_SIZE]

    def get(self, index: int, end_index: int) -> codec.Entry:
        blob, _n = self.get_raw(index, end_index, 1, 1)
        try:
            return codec.decode_entry(blob)
        except codec.CodecError as e:
            raise StaleRead(str(e)) from e

    def _with_refresh(self, fn):  # noqa: ANN001, ANN202 - tiny retry helper
        try:
            return _stale_on_torn(fn)
        except StaleRead:
            self.refresh()
            return _stale_on_torn(fn)

    def close(self) -> None:
        for lst in (self._data, self._index):
            if lst is not None:
                lst.close()
        self._data = self._index = None
        self._gen.close()


def _stale_on_torn(fn):  # noqa: ANN001, ANN202
    """Run a read of files another process may be truncating: bytes that do not decode as
    what the index says (struct.error, an index out of range) are a stale read like any other
    -- the caller's generation check decides what they were -- never a crash of the reader."""
    try:
        return fn()
    except (struct.error, IndexError) as e:
        raise StaleRead(f"torn read: {e}") from e
