"""Both file-level ends of an install (docs/snapshots.md "Install, end to end"): the leader reads
bounded chunks of its snapshot, the follower receives them into ``snapshots/.install`` and installs
atomically.

Why chunks rather than DLedger's one message holding the whole file: a multi-GB snapshot must
not be one frame (our frames are capped at 64 MiB) nor sit in memory on either side, and a
dropped connection must not restart the transfer from byte 0.

How the receiver resumes: ``.install`` holds the expected ``meta.json`` (written durably
before the first chunk) and the partial ``data``. Chunks must arrive in order (offset ==
``received_bytes()``), so the partial file's length *is* the progress: a new receiver for the
same meta (after a dropped connection or a restart of the receiving process) reopens the file,
re-reads it once for its running CRC-32C, and asks the sender to continue from there. A
different meta (a newer leader snapshot) discards the partial one. Chunks are not fsynced one
by one: the page cache survives any process crash, and after a power loss a damaged tail is
caught by the whole-file checksum before anything is replaced (the install then restarts).

Nothing here decides *whether* to install (a follower that already has a newer snapshot
should refuse); the Raft core does, the applier/handler wiring calls this.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from crc32c import crc32c

from node.statemachine.snapshot_files import (
    TMP_PREFIX,
    crc_of_fd,
    fsync_dir,
    pread_exact,
    remove_tree,
    write_all,
    write_file_durably,
)
from node.statemachine.snapshot_meta import (
    DATA_FILE,
    INSTALL_DIR,
    META_FILE,
    Snapshot,
    SnapshotChecksumMismatch,
    SnapshotChunkError,
    SnapshotDamaged,
    SnapshotError,
    SnapshotExists,
    SnapshotIncomplete,
    SnapshotMeta,
    SnapshotMetaError,
    SnapshotNotFound,
    io_error,
)

if TYPE_CHECKING:
    from node.statemachine.snapshot_store import SnapshotStore

log = logging.getLogger("dledger.snapshot")

DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB: ~1 ms on the wire at 10 Gbit/s, small next to a frame
MAX_CHUNK_BYTES = 8 << 20  # well under the 64 MiB frame cap, and bounded memory per peer


def read_chunk(snap: Snapshot, offset: int, max_bytes: int = DEFAULT_CHUNK_BYTES) -> bytes:
    """Up to ``max_bytes`` (1..MAX_CHUNK_BYTES) of ``snap``'s data from ``offset``; ``b""`` at
    the end (offset == size). Opens the file per call, so a sender holds nothing between
    chunks; a snapshot pruned meanwhile is SnapshotNotFound (start over with the newest)."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or \
            not 1 <= max_bytes <= MAX_CHUNK_BYTES:
        raise SnapshotChunkError(f"max_bytes={max_bytes!r} is not in 1..{MAX_CHUNK_BYTES}")
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= snap.size:
        raise SnapshotChunkError(f"offset={offset!r} is not in 0..{snap.size} "
                                 f"(snapshot {snap.path.name})")
    n = min(max_bytes, snap.size - offset)
    try:
        fd = os.open(snap.data_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SnapshotNotFound(f"snapshot {snap.path.name} is gone (pruned?)") from None
    except OSError as e:
        raise io_error(e, "reading snapshot data") from e
    try:
        data = pread_exact(fd, offset, n)
    except OSError as e:
        raise io_error(e, f"reading {snap.data_path}") from e
    finally:
        os.close(fd)
    if len(data) < n:
        raise SnapshotDamaged(f"{snap.data_path}: ends at {offset + len(data)}, meta says "
                              f"{snap.size} bytes")
    return data


class SnapshotReceiver:
    """Receives one snapshot's chunks in order and installs it when complete.

    Made by ``SnapshotStore.receive(meta)``; one at a time per store (a newer ``receive``
    supersedes this one). ``install()`` verifies size and CRC-32C *before* it touches the
    snapshot directory, then publishes like a local commit (rename + fsync, then prune)."""

    def __init__(self, store: SnapshotStore, meta: SnapshotMeta) -> None:
        if not isinstance(meta, SnapshotMeta):
            raise SnapshotMetaError(f"receive() needs a SnapshotMeta, not {type(meta).__name__}")
        self.store = store
        self.meta = meta
        self.path = store.dir / INSTALL_DIR
        self._fd = -1
        self._received = 0
        self._crc = 0
        self._state = "receiving"
        # Same index and term is the same committed prefix, hence the same state, even if the
        # bytes differ (a local snapshot, another leader's): refuse now, not after the transfer.
        if store._intact(store.dir / meta.name):
            raise SnapshotExists(f"snapshot {meta.name} is already in {store.dir}")
        previous = store._receiver
        if previous is not None:
            previous._end("superseded by a newer receive()")
        try:
            if not self._resume():
                self._start()
        except OSError as e:
            self._end("failed")
            raise io_error(e, f"preparing to receive snapshot {meta.name}") from e
        store._receiver = self

    def _resume(self) -> bool:
        """Reopen a partial install of this same meta; False (after discarding any other
        partial install) when there is none to resume."""
        if not os.path.lexists(self.path):
            return False
        try:
            on_disk: SnapshotMeta | None = SnapshotMeta.from_json(
                (self.path / META_FILE).read_bytes(), str(self.path / META_FILE))
        except (OSError, SnapshotMetaError):
            on_disk = None
        fd = -1
        if on_disk == self.meta:
            try:
                fd = os.open(self.path / DATA_FILE, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = -1
        if fd >= 0:
            have = os.fstat(fd).st_size
            if have <= self.meta.size:
                self._fd = fd
                self._received, self._crc = crc_of_fd(fd, have)
                log.info("resuming install of snapshot %s at byte %d of %d", self.meta.name,
                         self._received, self.meta.size)
                return True
            os.close(fd)
        what = on_disk.name if on_disk else "unreadable meta"
        log.info("discarding partial install (%s) to receive snapshot %s", what, self.meta.name)
        remove_tree(self.path)
        return False

    def _start(self) -> None:
        """Create ``.install`` with its meta durably in place first (built under a ``.tmp-``
        name and renamed), so a ``.install`` directory always says what it is receiving."""
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}install-", dir=self.store.dir))
        write_file_durably(tmp / META_FILE, self.meta.to_json())
        write_file_durably(tmp / DATA_FILE, b"")
        fsync_dir(tmp)
        os.rename(tmp, self.path)
        fsync_dir(self.store.dir)
        self._fd = os.open(self.path / DATA_FILE, os.O_RDWR | os.O_CLOEXEC)

    def received_bytes(self) -> int:
        """How many bytes are in place: the offset the next chunk must start at."""
        return self._received

    @property
    def complete(self) -> bool:
        return self._received == self.meta.size

    def _require(self, what: str) -> None:
        if self._state != "receiving":
            raise SnapshotError(f"cannot {what}: the receiver of snapshot {self.meta.name} "
                                f"is {self._state}")

    def write_chunk(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append the chunk at ``offset``; return ``received_bytes()`` after it.

        A chunk that does not start exactly at ``received_bytes()`` (a gap, an overlap, a
        resend) or runs past the meta's size is refused with SnapshotChunkError, whose
        ``expected_offset`` tells the sender where to continue; nothing is written then."""
        self._require("write a chunk")
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise SnapshotChunkError(f"chunk data must be bytes-like, not {type(data).__name__}",
                                     self._received) from None
        if not isinstance(offset, int) or isinstance(offset, bool) or offset != self._received:
            raise SnapshotChunkError(f"chunk at offset {offset!r} of snapshot {self.meta.name}, "
                                     f"expected {self._received}", self._received)
        end = offset + len(view)
        if end > self.meta.size:
            raise SnapshotChunkError(f"chunk [{offset}, {end}) runs past snapshot "
                                     f"{self.meta.name}'s size {self.meta.size}", self._received)
        try:
            write_all(self._fd, view, offset)
        except OSError as e:
            try:
                os.ftruncate(self._fd, self._received)  # keep "file length == progress"
            except OSError:
                pass
            raise io_error(e, f"writing {self.path / DATA_FILE}") from e
        self._crc = crc32c(view, self._crc)
        self._received = end
        return end

    def install(self) -> Snapshot:
        """Verify the received bytes, fsync them, publish the snapshot atomically, prune.

        Raises SnapshotIncomplete before the last byte; SnapshotChecksumMismatch when the bytes
        are not the meta's (they are discarded: the sender starts again from offset 0);
        SnapshotExists when a valid copy appeared meanwhile. The snapshot directory is not
        touched unless every check passed."""
        self._require("install")
        if not self.complete:
            raise SnapshotIncomplete(f"snapshot {self.meta.name}: {self._received} of "
                                     f"{self.meta.size} bytes received")
        if self._crc != self.meta.crc32c:
            bad = self._crc
            try:
                os.ftruncate(self._fd, 0)
            except OSError as e:
                self._end("failed")
                raise io_error(e, f"discarding {self.path / DATA_FILE}") from e
            self._received, self._crc = 0, 0
            raise SnapshotChecksumMismatch(f"snapshot {self.meta.name}: received crc32c "
                                           f"{bad:#010x}, meta says {self.meta.crc32c:#010x}; "
                                           "discarded, resend from offset 0")
        try:
            os.fsync(self._fd)
            self._end("installed")
            snap = self.store._publish(self.path, self.meta)
        except OSError as e:  # .install stays: a new receive() of this meta resumes at the end
            self._state = "failed"
            raise io_error(e, f"installing snapshot {self.meta.name}") from e
        except SnapshotExists:  # a valid copy appeared meanwhile: ours is redundant
            self._state = "aborted"
            remove_tree(self.path)
            raise
        log.info("installed snapshot %s from a leader", self.meta.name)
        return snap

    def abort(self) -> None:
        """Give up on this install and delete the partial data. Idempotent."""
        if self._state == "receiving":
            self._end("aborted")
            if os.path.lexists(self.path):
                remove_tree(self.path)

    def _end(self, state: str) -> None:
        self._state = state
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.store._receiver is self:
            self.store._receiver = None
