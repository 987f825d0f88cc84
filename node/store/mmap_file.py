"""Fixed-size memory-mapped segment files and the list that makes them one continuous space.

RocketMQ's MappedFile / MmapFileList, reduced to what DLedger uses. Two rules shape it:

* **A mapped file never shrinks.** A reader in another process that touches a page past EOF
  dies of SIGBUS, so every file is created at its full size (reserved with posix_fallocate,
  so a full disk fails at creation with ENOSPC instead of SIGBUS on a page fault) and renamed
  into place only once complete. Truncation moves write positions and zeroes what was written
  after them; only whole files are ever deleted.
* **Bytes past the write position are zero.** Recovery and readers find the end of the log by
  the first zero magic, and a truncated-then-crashed tail can never resurrect old entries,
  because truncation zeroes what it drops before anything new is written.

The writer owns wrote/flushed positions; readers (`readonly=True`) only map and slice.

Writes go through the file descriptor (`write`/`writev`: pwrite/pwritev), reads through the
mapping. Both see the one page cache, so readers in any process see what was written. Writing
through the mapping instead would take a write fault per fresh 4 KiB page (on ext4 the costly
page_mkwrite path): measured 90 us vs 22 us to store 66 KB, and pwrite releases the GIL.

Every OSError leaving this module names the file it concerns (fd-based calls such as pwrite,
fdatasync and posix_fallocate raise errors without one); the store turns them into
DISK_FULL / DISK_ERROR store errors (node.store.base.store_error_from_os).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
from pathlib import Path
from typing import Protocol

from node.store.layout import SEGMENT_NAME, Segment, list_segments, segment_name

log = logging.getLogger("dledger.store")

_ZERO_CHUNK = bytes(1 << 20)
_IOV_MAX = 1024


ZERO_RANGE_MIN = 4 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_ZERO_RANGE = 0x10
_fallocate = None


def _zero_range(fd: int, offset: int, length: int) -> bool:
    """fallocate(FALLOC_FL_ZERO_RANGE | KEEP_SIZE) of [offset, offset + length); False where
    the system or file system does not support it (the caller then writes zeroes)."""
    global _fallocate
    if _fallocate is None:
        try:
            f = ctypes.CDLL(None, use_errno=True).fallocate
            f.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            f.restype = ctypes.c_int
            _fallocate = f
        except (OSError, AttributeError):
            _fallocate = False
    if not _fallocate:
        return False
    return _fallocate(fd, _FALLOC_FL_ZERO_RANGE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0


class StoreIOError(OSError):
    """A file-level failure (cannot create, map or sync a segment)."""


class FileSizeMismatch(StoreIOError):
    """The store's files were made with another segment size than the one configured: no
    retry can change that (node/config.py `adopt_store_file_sizes` prevents it for `dledger
    server`)."""


class Fence(Protocol):
    """What a file list needs of the store generation (node.store.generation)."""

    def begin_change(self) -> None: ...
    def end_change(self) -> None: ...


def _named(e: OSError, path: Path) -> OSError:
    """The same error, naming the file it concerns: a "No space left on device" that does not
    say where is no help to an operator."""
    if e.filename is not None:
        return e
    return OSError(e.errno, e.strerror or str(e), str(path))


def _preallocate(path: Path, size: int) -> None:
    """Create `path` at exactly `size` bytes, atomically (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        raise _named(e, path) from e
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise _named(e, path) from e
            os.ftruncate(fd, size)  # filesystem without fallocate: sparse, still fixed-size
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise _named(e, path) from e
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a create, rename or unlink in directory `path` durable (flush_mode=sync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise _named(e, Path(path)) from e


class MappedFile:
    """One segment: a file of fixed size mapped in full."""

    __slots__ = ("path", "start", "size", "fd", "mm", "view", "wrote", "flushed", "readonly", "dirty")

    def __init__(self, path: Path, start: int, size: int, readonly: bool = False) -> None:
        self.path, self.start, self.size, self.readonly = path, start, size, readonly
        flags = os.O_RDONLY if readonly else os.O_RDWR
        self.fd = os.open(path, flags)
        try:
            actual = os.fstat(self.fd).st_size
            if actual != size:
                raise StoreIOError(f"{path}: size {actual}, expected {size}")
            prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, prot)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.mm)
        self.wrote = 0
        self.flushed = 0
        # `flushed < wrote` says bytes below the write position are not durable yet; `dirty`
        # covers what it cannot: a truncation zeroed bytes at or *past* the write position.
        self.dirty = False

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, rel: int, data: bytes | bytearray | memoryview) -> None:
        """Write at offset `rel` of this file (never past its end)."""
        if rel < 0 or rel + len(data) > self.size:
            raise StoreIOError(f"write of {len(data)} at {rel} outside {self.path.name}")
        done = 0
        try:
            while done < len(data):  # pwrite may be short in theory; loop until all is written
                done += os.pwrite(self.fd, memoryview(data)[done:], rel + done)
        except OSError as e:
            raise _named(e, self.path) from e

    def writev(self, rel: int, parts: list) -> int:
        """Write consecutive `parts` at `rel` with as few syscalls as possible; returns bytes."""
        total = sum(map(len, parts))
        if rel < 0 or rel + total > self.size:
            raise StoreIOError(f"write of {total} at {rel} outside {self.path.name}")
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i:i + _IOV_MAX]
            try:
                n = os.pwritev(self.fd, chunk, rel)
            except OSError as e:
                raise _named(e, self.path) from e
            want = sum(map(len, chunk))
            if n != want:  # short write: finish it the slow way
                self.write(rel + n, b"".join(bytes(p) for p in chunk)[n:])
            rel += want
        return total

    def zero(self, begin: int, end: int) -> None:
        """Zero [begin, end) of this file, skipping chunks that are zero already (cheap scan).
        Marks the file dirty, so the next `sync` makes the zeroes durable too.

        A range of ZERO_RANGE_MIN bytes or more (recovery zeroes from the log's end to the end
        of the last file: up to a whole 1 GiB file) is zeroed with one
        fallocate(FALLOC_FL_ZERO_RANGE) where the file system has it (ext4, xfs): it turns the
        range into allocated, unwritten extents and drops its cached pages, without reading
        them -- the scan reads ~1 ms per MiB, over a second for a 1 GiB file at every open.
        The blocks stay allocated (no ENOSPC later), and a reader's mapping sees zeroes."""
        if end - begin >= ZERO_RANGE_MIN and _zero_range(self.fd, begin, end - begin):
            self.dirty = True
            return
        pos = begin
        while pos < end:
            n = min(len(_ZERO_CHUNK), end - pos)
            if self.mm[pos:pos + n] != _ZERO_CHUNK[:n]:
                self.dirty = True
                self.write(pos, _ZERO_CHUNK[:n])
            pos += n

    def sync(self) -> None:
        """Make written pages durable. fdatasync on the fd covers pages dirtied via the mapping
        (Linux has one page cache) and, unlike mmap.flush, releases the GIL while it waits."""
        wrote = self.wrote  # read first: bytes written during the sync are not claimed
        if self.flushed < wrote or self.dirty:
            self.dirty = False  # cleared first: a zeroing during the sync marks it again
            try:
                os.fdatasync(self.fd)
            except OSError as e:
                self.dirty = True
                raise _named(e, self.path) from e
            self.flushed = max(self.flushed, wrote)

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            # A caller still holds a zero-copy slice; the mapping is freed with its last view.
            log.debug("%s: mapping still referenced at close", self.path)
        finally:
            os.close(self.fd)


def _same_inode(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class MappedFileList:
    """A directory of equal-size segments addressed by one global offset.

    `wrote_position` is the global offset just past the last byte written. Every file before
    the last is full (its tail after the last entry holds a BLANK record in the data list).

    Writer side: `fence` (the store generation) is moved around every deletion of a file whose
    name may come back; `durable` (flush_mode=sync) fsyncs the directory after a file is
    created or deleted, so the list of files survives a power loss like the data in them.
    """

    def __init__(self, directory: str | os.PathLike[str], file_size: int, readonly: bool = False,
                 fence: Fence | None = None, durable: bool = False) -> None:
        if file_size <= 0:
            raise ValueError("file_size must be positive")
        self.dir = Path(directory)
        self.file_size = file_size
        self.readonly = readonly
        self.files: list[MappedFile] = []
        self.fence = fence
        self.durable = durable
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True)

    # ---- loading -------------------------------------------------------------------------
    def load(self) -> None:
        """Map every segment present. The caller (recovery) then sets the write position.
        Nothing loaded counts as durable yet (a killed process may have left dirty pages):
        the first sync covers every file once."""
        self.close()
        for seg in list_segments(self.dir):
            if seg.size != self.file_size:
                raise FileSizeMismatch(
                    f"{seg.path}: size {seg.size} but the store is configured for {self.file_size}; "
                    "start with the file size the store was created with")
            f = MappedFile(seg.path, seg.start, seg.size, self.readonly)
            f.dirty = not self.readonly
            self.files.append(f)

    def load_salvaging(self, derived: bool = False, size_known: bool = False) -> tuple[str | None, list[Path]]:
        """Recovery's `load` for a list that may be damaged: map the longest run of files
        from the first that is contiguous and of the configured size, and return (what is
        wrong, the files after it) instead of raising. The caller decides what the lost range
        means and deletes the leftovers (after recording that it lost them).

        One case stays an error for the data list: every file has the same size and it is not
        the configured one. That is a configuration mistake (the store was created with another
        file size), and reading it as damage would throw a healthy log away. A `derived` list
        (the index: recovery rewrites it from the data) reports it as a problem instead, and so
        does a store whose recorded sizes (`size_known`: layout.read_segment_sizes) say the
        configured size is the one it was created with."""
        self.close()
        segs = sorted((Segment(int(p.name), p, p.stat().st_size) for p in self.dir.iterdir()
                       if SEGMENT_NAME.match(p.name)), key=lambda s: s.start) if self.dir.is_dir() else []
        if not derived and not size_known and segs and all(sg.size == segs[0].size != self.file_size for sg in segs):
            raise FileSizeMismatch(
                f"{segs[0].path}: size {segs[0].size} but the store is configured for "
                f"{self.file_size}; start with the file size the store was created with")
        problem: str | None = None
        for k, seg in enumerate(segs):
            if seg.size != self.file_size:
                problem = f"{seg.path.name}: size {seg.size}, expected {self.file_size} (truncated or damaged)"
            elif self.files and seg.start != self.files[-1].end:
                problem = (f"{self.dir.name}/ has no file at offset {self.files[-1].end} "
                           f"(a segment file is missing; next is {seg.path.name})")
            if problem is not None:
                return problem, [sg.path for sg in segs[k:]]
            f = MappedFile(seg.path, seg.start, seg.size, self.readonly)
            f.dirty = not self.readonly
            self.files.append(f)
        return None, []

    def refresh(self) -> None:
        """Reader side: pick up files created or deleted by the writer since the last look.

        A file deleted and re-created under the same name (a truncation, then appends) is a
        different inode: the old mapping is closed and the new file mapped in the same call.
        (The inode number cannot be reused meanwhile: our open fd keeps the old inode alive.)
        """
        present = {s.start: s for s in list_segments(self.dir)}
        keep = []
        for f in self.files:
            seg = present.get(f.start)
            if seg is not None and _same_inode(seg.path, f.fd):
                keep.append(f)
                del present[f.start]
            else:
                f.close()  # deleted, or deleted and re-created: the new file is mapped below
        for start in sorted(present):
            seg = present[start]
            if seg.size == self.file_size:
                try:
                    keep.append(MappedFile(seg.path, seg.start, seg.size, readonly=True))
                except FileNotFoundError:
                    continue  # deleted since it was listed
        self.files = sorted(keep, key=lambda f: f.start)

    # ---- geometry ------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files[0].start if self.files else 0

    @property
    def wrote_position(self) -> int:
        if not self.files:
            return 0
        last = self.files[-1]
        return last.start + last.wrote

    def find(self, offset: int) -> MappedFile | None:
        """The file holding global `offset` (O(1): files are contiguous and equal-size). A
        reader's list can have a hole for a moment (a file deleted between listing and
        mapping): the file found is checked to really hold `offset`."""
        if not self.files:
            return None
        i = (offset - self.files[0].start) // self.file_size
        if 0 <= i < len(self.files):
            f = self.files[i]
            if f.start <= offset < f.start + f.size:
                return f
        return None

    def read(self, offset: int, size: int) -> memoryview:
        """A zero-copy view of [offset, offset+size); raises if it crosses a file end."""
        f = self.find(offset)
        if f is None:
            raise StoreIOError(f"offset {offset} not in {self.dir}")
        rel = offset - f.start
        if rel + size > f.size:
            raise StoreIOError(f"read of {size} at {offset} crosses the end of {f.path.name}")
        return f.view[rel:rel + size]

    # ---- writing -------------------------------------------------------------------------
    def _begin(self) -> None:
        if self.fence is not None:
            self.fence.begin_change()

    def _end(self) -> None:
        if self.fence is not None:
            self.fence.end_change()

    def _new_file(self, start: int) -> MappedFile:
        path = self.dir / segment_name(start)
        if path.exists():
            # Only possible if a previous roll was interrupted after the rename: the file is
            # ours and beyond the log end, so its content is stale by definition. A reader
            # may have mapped it, so the deletion is fenced.
            self._begin()
            try:
                path.unlink()
            except OSError as e:
                raise _named(e, path) from e
            finally:
                self._end()
        _preallocate(path, self.file_size)
        try:
            f = MappedFile(path, start, self.file_size)
        except OSError as e:
            path.unlink(missing_ok=True)
            raise _named(e, path) from e
        self.files.append(f)
        if self.durable:
            fsync_dir(self.dir)
        return f

    def last_file_for_append(self, start_if_empty: int = 0) -> MappedFile:
        if not self.files:
            base = start_if_empty - start_if_empty % self.file_size
            f = self._new_file(base)
            f.wrote = f.flushed = start_if_empty - base
            return f
        last = self.files[-1]
        if last.wrote >= last.size:
            return self._new_file(last.end)
        return last

    def set_wrote_position(self, offset: int, dirty_end: int | None = None) -> None:
        """Recovery/truncation: everything before `offset` is the log; files after it go.

        Files wholly before `offset` are marked full; the file containing it gets its write
        position there and its stale tail zeroed (up to `dirty_end` when the caller knows how
        far it had written — truncation does — else to the file end, as recovery must); later
        files are deleted (never shrunk), fenced. The zeroed range stays dirty until the next
        `sync`, which makes it durable with the rest.
        """
        keep: list[MappedFile] = []
        doomed: list[MappedFile] = []
        for f in self.files:
            if f.end <= offset:
                f.wrote = f.size
                keep.append(f)
            elif f.start <= offset:
                rel = offset - f.start
                stop = f.size if dirty_end is None else min(f.size, max(rel, dirty_end - f.start))
                f.zero(rel, stop)
                f.wrote = rel
                f.flushed = min(f.flushed, rel)
                keep.append(f)
            else:
                doomed.append(f)
        self.files = keep
        self._delete(doomed, fenced=True)

    def _delete(self, doomed: list[MappedFile], fenced: bool) -> None:
        """Unmap and delete files, then (durable) fsync the directory so a power loss cannot
        bring them back. Fenced deletions (names that may come back: truncation, rollback)
        raise the first failure after trying every file; retention's (not fenced) only log
        it: a front file left behind is harmless (recovery reads it as the log's start) and
        retention tries again."""
        if not doomed:
            return
        if fenced:
            self._begin()
        first_error: OSError | None = None
        try:
            for f in doomed:
                f.close()
            for f in doomed:
                try:
                    f.path.unlink(missing_ok=True)
                except OSError as e:
                    first_error = first_error or _named(e, f.path)
            if self.durable:
                try:
                    fsync_dir(self.dir)
                except OSError as e:
                    first_error = first_error or e
        finally:
            if fenced:
                self._end()
        if first_error is not None:
            if fenced:
                raise first_error
            log.error("could not delete %s: %s", first_error.filename, first_error.strerror)

    def delete_all(self) -> None:
        doomed, self.files = self.files, []
        self._delete(doomed, fenced=True)

    def delete_files_before(self, offset: int) -> int:
        """Delete whole files that end at or before `offset` (retention). Never the last file.
        Not fenced: a front file's name never comes back (offsets only grow)."""
        doomed: list[MappedFile] = []
        while len(self.files) > 1 and self.files[0].end <= offset:
            doomed.append(self.files.pop(0))
        self._delete(doomed, fenced=False)
        return len(doomed)

    def sync(self) -> None:
        for f in self.files:
            if f.flushed < f.wrote or f.dirty:
                f.sync()

    def needs_sync(self) -> bool:
        """Would `sync` call fdatasync (anything written or zeroed since the last one)?"""
        return any(f.flushed < f.wrote or f.dirty for f in self.files)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
