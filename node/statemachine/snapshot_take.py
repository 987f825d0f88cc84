"""Taking a snapshot: a temporary directory, a writer that checksums as it writes, and the
commit that makes it durable and visible in one rename.

Why stream the CRC-32C through the writer: commit then knows size and checksum without reading
back a file that may be gigabytes. ``SnapshotStore.begin`` makes a PendingSnapshot; the
store's ``_publish`` does the rename, shared with installs (snapshot_install).
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

from crc32c import crc32c

from node.statemachine.snapshot_files import READ_BLOCK, fsync_dir, write_file_durably
from node.statemachine.snapshot_meta import (
    DATA_FILE,
    META_FILE,
    Snapshot,
    SnapshotError,
    SnapshotMeta,
    io_error,
    utc_iso,
)

if TYPE_CHECKING:
    from node.statemachine.snapshot_store import SnapshotStore


class _CrcWriter(io.RawIOBase):
    """Append-only raw file that keeps the size and CRC-32C of what went through it, so commit
    never re-reads the data. Not seekable on purpose: a seek would invalidate the running CRC.
    ``close()`` leaves the descriptor to PendingSnapshot (a state machine that closes the
    writer it was given must not lose the fsync)."""

    def __init__(self, fd: int, label: str) -> None:
        super().__init__()
        self._fd = fd
        self._label = label
        self.size = 0
        self.crc = 0
        self.failed: SnapshotError | None = None  # a write error, even if user code swallowed it

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        view = memoryview(b).cast("B")  # type: ignore[arg-type]
        try:
            n = os.write(self._fd, view)
        except OSError as e:
            self.failed = io_error(e, f"writing {self._label}")
            raise self.failed from e
        self.crc = crc32c(view[:n], self.crc)
        self.size += n
        return n

    def tell(self) -> int:
        return self.size


class PendingSnapshot:
    """A snapshot being written: ``file`` (a buffered, append-only binary file) goes to the
    state machine's ``snapshot(writer)``; then ``commit()`` or ``abort()``.

    As a context manager it commits on a clean exit and aborts on an exception, so user code
    that raises never leaves a published snapshot. ``result`` holds the committed Snapshot.
    """

    def __init__(self, store: SnapshotStore, meta: SnapshotMeta, tmp: Path) -> None:
        self._store = store
        self._meta = meta  # size and crc32c are placeholders until commit
        self.path = tmp
        self._fd = os.open(tmp / DATA_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                           0o644)
        self._raw = _CrcWriter(self._fd, str(tmp / DATA_FILE))
        self.file: BinaryIO = io.BufferedWriter(self._raw, buffer_size=READ_BLOCK)  # type: ignore[assignment]
        self.result: Snapshot | None = None
        self._state = "open"

    @property
    def last_index(self) -> int:
        return self._meta.last_index

    @property
    def last_term(self) -> int:
        return self._meta.last_term

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self.file.write(data)

    def commit(self) -> Snapshot:
        """Flush and fsync data, write and fsync meta.json, fsync the directory, rename it into
        place, fsync the parent, prune older snapshots. Any failure removes the temporary
        directory and raises (SnapshotIOError, SnapshotExists); nothing is half-published."""
        if self._state != "open":
            raise SnapshotError(f"snapshot {self._meta.name} already {self._state}")
        try:
            if not self.file.closed:
                self.file.flush()
            if self._raw.failed is not None:  # never publish a silently truncated state
                raise self._raw.failed
            os.fsync(self._fd)
            meta = replace(self._meta, size=self._raw.size, crc32c=self._raw.crc,
                           created=utc_iso(self._store.wall_clock()))
            write_file_durably(self.path / META_FILE, meta.to_json())
            fsync_dir(self.path)
            self._close()
            self.result = self._store._publish(self.path, meta)
        except OSError as e:
            self.abort()
            raise io_error(e, f"committing snapshot {self._meta.name}") from e
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        return self.result

    def abort(self) -> None:
        """Drop the snapshot: close the file, remove the temporary directory. Idempotent; a
        no-op after a successful commit."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._close()
        shutil.rmtree(self.path, ignore_errors=True)  # a leftover is removed at the next open

    def _close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.file.close()  # flushes; a failure here was already seen by commit's flush
        except (OSError, SnapshotError):
            pass
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> PendingSnapshot:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.commit()
