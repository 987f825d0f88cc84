"""The store generation fence: `DIR/generation`, one 8-byte counter shared through a mapping.

Why it exists: a truncation deletes segment files and later appends re-create them under the
same names. A long-lived reader in another process (a dispatcher, the ack checker, `dledger
dump`) that still maps the *old* inode would read old-term entries whose index records look
perfectly valid (same index, same file name), so no per-record check can catch it. Instead the
writer moves this counter around every destructive change, and readers compare it with the
value they started from:

* the writer makes it **odd before** any destructive change (truncate, recovery at open, a
  deleted-and-re-created file, a rollback that deletes a file) and **even again after** it;
* a reader reads only while the counter is even and equal to the generation published with
  the ledger end it is serving, and checks again after reading and before using what it read
  (seqlock style). A changed counter means "refresh your mappings and retry".

Retention's deletion of *front* files does not move it: those names never come back.

Layout: 8 bytes, a signed 64-bit integer in the machine's byte order (little-endian on every
platform we run on), written with one aligned 8-byte store through a shared mapping so a
reader never sees a torn value. It is created once (temp file + rename, so a reader never maps
a short file) and never deleted. A store written by an older version has no file: its
generation starts at 0. Values are not durable across a power loss and need not be: every
reader dies with the node, and every open bumps the counter anyway.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from node.store.mmap_file import fsync_dir

GENERATION_FILE = "generation"
# "@q": native order, native size. Unlike "<q"/"=q" (packed byte by byte) the native format is
# packed with one fixed-size memcpy, i.e. one aligned 8-byte store: readers never see half of it.
_WORD = struct.Struct("@q")


class GenerationCounter:
    """The writer's side: open (creating if absent) and move the counter.

    `begin_change`/`end_change` nest: only the outermost pair moves the counter, so a truncate
    that calls a file deletion that also fences still makes one odd..even transition.
    """

    def __init__(self, store_dir: str | os.PathLike[str], durable: bool = False) -> None:
        self.path = Path(store_dir) / GENERATION_FILE
        self._depth = 0
        if not self.path.exists():
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, _WORD.pack(0))
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if durable:
                fsync_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < _WORD.size:
                os.ftruncate(fd, _WORD.size)  # a damaged (short) file: start over from 0
            self._mm = mmap.mmap(fd, _WORD.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    @property
    def value(self) -> int:
        return _WORD.unpack_from(self._mm, 0)[0]

    def _set(self, v: int) -> None:
        _WORD.pack_into(self._mm, 0, v)

    def begin_change(self) -> None:
        """Make the counter odd (and different from any value a reader may hold)."""
        if self._depth == 0:
            v = self.value
            self._set(v + 1 if v % 2 == 0 else v + 2)
        self._depth += 1

    def end_change(self) -> None:
        """Make the counter even again: the files are consistent under the new value."""
        self._depth -= 1
        if self._depth == 0:
            v = self.value
            self._set(v + 1 if v % 2 else v + 2)

    def __enter__(self) -> GenerationCounter:
        self.begin_change()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end_change()

    def close(self) -> None:
        self._mm.close()


class GenerationView:
    """The reader's side: a read-only mapping of the counter, opened lazily.

    No file (a store an older version wrote, or a writer that has not opened yet) reads as 0.
    """

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.path = Path(store_dir) / GENERATION_FILE
        self._mm: mmap.mmap | None = None

    def _map(self) -> mmap.mmap | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size < _WORD.size:
                return None
            return mmap.mmap(fd, _WORD.size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)

    def read(self) -> int:
        mm = self._mm
        if mm is None:
            mm = self._mm = self._map()
            if mm is None:
                return 0
        return _WORD.unpack_from(mm, 0)[0]

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
