"""Snapshot files on disk: take one, keep the newest few, find the newest valid one at start.

Layout under a node's store directory (docs/snapshots.md has the details)::

    STORE/snapshots/00000000000000001234-00000000000000000005/data       the state's bytes
    STORE/snapshots/00000000000000001234-00000000000000000005/meta.json  SnapshotMeta
    STORE/snapshots/.tmp-take-*/        a snapshot being written (garbage after a crash)
    STORE/snapshots/.install/           an install being received (kept: it resumes)
    STORE/snapshots/.lock               the writer lock (flock), never deleted

**Invariant**: a directory whose name is ``<20 digits>-<20 digits>`` is complete: its
``data`` and ``meta.json`` were fsynced, then the directory was, before it got that name by
one ``rename``; the name is removed the same way (renamed aside, then deleted). So a crash at
any point leaves whole snapshots and ``.tmp-`` / ``.install`` leftovers, never a half-written
snapshot under a real name. The checks at start (meta parses and matches the name, data size
and CRC-32C match the meta) are for what the invariant cannot cover: a disk that lost or
flipped bytes, and hands that edited the directory.

One writer process per store (enforced by ``.lock``): the writer's open removes ``.tmp-``
leftovers, which would delete a live writer's work if two could open. Readers (a leader
sending a snapshot to a follower) open with ``writable=False`` and take no lock. No
processes or sockets here: the applier role and the install message use this module.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from node.statemachine.snapshot_files import TMP_PREFIX, crc_of_fd, fsync_dir, remove_tree
from node.statemachine.snapshot_install import (
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    SnapshotReceiver,
    read_chunk,
)
from node.statemachine.snapshot_meta import (
    INSTALL_DIR,
    LOCK_FILE,
    META_FILE,
    SNAPSHOTS_DIR,
    Snapshot,
    SnapshotChecksumMismatch,
    SnapshotChunkError,
    SnapshotDamaged,
    SnapshotError,
    SnapshotExists,
    SnapshotIncomplete,
    SnapshotIOError,
    SnapshotMeta,
    SnapshotMetaError,
    SnapshotNotFound,
    SnapshotStoreBusy,
    check_position,
    io_error,
    parse_dir_name,
)
from node.statemachine.snapshot_take import PendingSnapshot

__all__ = [  # the snapshot API in one import; the other snapshot_* modules are its parts
    "DEFAULT_CHUNK_BYTES", "DEFAULT_MAX_SNAPSHOTS_KEPT", "MAX_CHUNK_BYTES", "PendingSnapshot",
    "Snapshot", "SnapshotChecksumMismatch", "SnapshotChunkError", "SnapshotDamaged",
    "SnapshotError", "SnapshotExists", "SnapshotIOError", "SnapshotIncomplete", "SnapshotMeta",
    "SnapshotMetaError", "SnapshotNotFound", "SnapshotReceiver", "SnapshotStore",
    "SnapshotStoreBusy", "read_chunk",
]

log = logging.getLogger("dledger.snapshot")

DEFAULT_MAX_SNAPSHOTS_KEPT = 3


class SnapshotStore:
    """The ``snapshots`` directory of one node's store: its single writer, or a reader.

    ``max_snapshots_kept`` (>= 1): after each commit or install only the newest that many
    intact-looking snapshots stay. Why keep more than one: the newest can rot on disk, and a
    node that finds it damaged at start restores the next older one and replays more log.
    """

    def __init__(self, store_dir: str | os.PathLike[str], *,
                 max_snapshots_kept: int = DEFAULT_MAX_SNAPSHOTS_KEPT,
                 writable: bool = True, wall_clock: Callable[[], float] = time.time) -> None:
        """`wall_clock` (seconds since the epoch) dates the snapshots it takes (`created`); the
        applier passes its role context's, so a simulated node's snapshots carry virtual time."""
        if not isinstance(max_snapshots_kept, int) or max_snapshots_kept < 1:
            raise SnapshotError(f"max_snapshots_kept must be an integer >= 1, "
                                f"not {max_snapshots_kept!r}")
        self.dir = Path(store_dir) / SNAPSHOTS_DIR
        self.max_snapshots_kept = max_snapshots_kept
        self.writable = writable
        self.wall_clock = wall_clock
        self._lock_fd = -1
        self._receiver: SnapshotReceiver | None = None  # the install in progress, if any
        if writable:
            try:
                self._open_writer()
            except OSError as e:
                self.close()
                raise io_error(e, "opening the snapshot store") from e

    def _open_writer(self) -> None:
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.dir.parent)  # the new directory's name
        self._lock_fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise SnapshotStoreBusy(f"{self.dir}: another process is writing snapshots here") from None
        for p in self.dir.iterdir():
            if p.name.startswith(TMP_PREFIX):  # a crash mid-take or mid-delete
                log.info("removing leftover %s", p)
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()

    def close(self) -> None:
        """Release the writer lock (a SIGKILLed writer releases it too: the kernel drops it)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading -------------------------------------------------------------------------

    def _names(self) -> list[tuple[int, int, Path]]:
        """(last_index, last_term, path) of every snapshot-named directory, oldest first."""
        try:
            entries = list(self.dir.iterdir())
        except FileNotFoundError:
            return []
        except OSError as e:
            raise io_error(e, "listing snapshots") from e
        out = []
        for p in entries:
            pos = parse_dir_name(p.name)
            if pos is not None:
                out.append((*pos, p))
        return sorted(out)

    def load(self, path: Path) -> Snapshot:
        """The Snapshot in ``path``; SnapshotDamaged when meta.json is missing, unreadable or
        disagrees with the directory's name."""
        meta_path = path / META_FILE
        try:
            raw = meta_path.read_bytes()
        except FileNotFoundError:
            raise SnapshotDamaged(f"{meta_path}: missing") from None
        except OSError as e:
            raise SnapshotDamaged(f"{meta_path}: {e.strerror or e}") from None
        try:
            meta = SnapshotMeta.from_json(raw, str(meta_path))
        except SnapshotMetaError as e:
            raise SnapshotDamaged(str(e)) from None
        if meta.name != path.name:
            raise SnapshotDamaged(f"{meta_path}: says index {meta.last_index} term "
                                  f"{meta.last_term}, the directory name says otherwise")
        return Snapshot(meta, path)

    def verify(self, snap: Snapshot, *, checksum: bool = True) -> None:
        """Raise SnapshotDamaged unless ``data`` has the meta's size and (with ``checksum``)
        its CRC-32C. Reads the whole file when checksumming (1 MiB at a time)."""
        try:
            fd = os.open(snap.data_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SnapshotDamaged(f"{snap.data_path}: missing") from None
        except OSError as e:
            raise SnapshotDamaged(f"{snap.data_path}: {e.strerror or e}") from None
        try:
            size = os.fstat(fd).st_size
            if size != snap.size:
                raise SnapshotDamaged(f"{snap.data_path}: {size} bytes, meta says {snap.size}")
            if checksum:
                _, crc = crc_of_fd(fd, size)
                if crc != snap.meta.crc32c:
                    raise SnapshotDamaged(f"{snap.data_path}: crc32c {crc:#010x}, meta says "
                                          f"{snap.meta.crc32c:#010x}")
        except OSError as e:
            raise SnapshotDamaged(f"{snap.data_path}: {e.strerror or e}") from None
        finally:
            os.close(fd)

    def list(self) -> list[Snapshot]:
        """Every snapshot whose meta parses and matches its name, oldest first. Data is not
        read: use ``newest_valid`` (or ``verify``) before trusting one."""
        out = []
        for _, _, p in self._names():
            try:
                out.append(self.load(p))
            except SnapshotDamaged:
                continue
        return out

    def newest_valid(self, *, verify_checksum: bool = True) -> Snapshot | None:
        """The newest snapshot that passes every check, None if there is none. Each damaged one
        skipped on the way is logged as a warning (a node restoring an older snapshot replays
        more log, and an operator should know why).

        Checksumming reads the whole snapshot once per start. We do it by default because the
        restore reads all of it anyway (this read warms the page cache for it: measured here,
        256 MiB cold 0.19 s, warm 0.05 s), and a restore fed corrupt bytes may leave a state
        machine half-built with no way back; a node whose snapshots are too big for that can
        pass ``verify_checksum=False`` (size only)."""
        for _, _, p in reversed(self._names()):
            try:
                snap = self.load(p)
                self.verify(snap, checksum=verify_checksum)
            except SnapshotDamaged as e:
                log.warning("skipping damaged snapshot %s: %s", p.name, e)
                continue
            return snap
        return None

    def open_data(self, snap: Snapshot) -> BinaryIO:
        """The snapshot's data for reading (what ``StateMachine.restore`` gets). The open file
        stays readable even if the snapshot is pruned meanwhile (Linux keeps the inode)."""
        try:
            return open(snap.data_path, "rb")  # the caller closes it
        except FileNotFoundError:
            raise SnapshotNotFound(f"{snap.path.name}: no longer in {self.dir}") from None
        except OSError as e:
            raise io_error(e, "opening snapshot data") from e

    def read_chunk(self, snap: Snapshot, offset: int,
                   max_bytes: int = DEFAULT_CHUNK_BYTES) -> bytes:
        """The sending side of an install: ``snapshot_install.read_chunk``."""
        return read_chunk(snap, offset, max_bytes)

    # ---- writing -------------------------------------------------------------------------

    def _require_writable(self, what: str) -> None:
        if self._lock_fd < 0:
            raise SnapshotError(f"{self.dir}: opened read-only or closed, cannot {what}")

    def _intact(self, path: Path) -> bool:
        """Meta parses and data has its size: the cheap check behind pruning and begin."""
        try:
            self.verify(self.load(path), checksum=False)
        except SnapshotDamaged:
            return False
        return True

    def begin(self, last_index: int, last_term: int, state_machine: str,
              configuration: tuple[int, bytes] | None = None) -> PendingSnapshot:
        """Start a snapshot of the state after applying entry ``last_index`` (of ``last_term``),
        written by ``state_machine`` (its name, recorded in the meta). Raises SnapshotMetaError
        for a bad position or name, SnapshotExists when an intact snapshot is already there
        (checked now, before the state machine writes gigabytes for nothing). ``configuration``
        (index, entry body): the configuration in force at ``last_index``, recorded in the meta."""
        self._require_writable("take a snapshot")
        check_position(last_index, last_term)
        cfg = {} if configuration is None else {
            "configuration_index": configuration[0],
            "configuration": base64.b64encode(configuration[1]).decode()}
        meta = SnapshotMeta(last_index, last_term, 0, 0, state_machine, "", **cfg)  # validates
        if self._intact(self.dir / meta.name):
            raise SnapshotExists(f"snapshot {meta.name} already exists in {self.dir}")
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}take-{meta.name}-", dir=self.dir))
            return PendingSnapshot(self, meta, tmp)
        except OSError as e:
            raise io_error(e, f"starting snapshot {meta.name}") from e

    def receive(self, meta: SnapshotMeta) -> SnapshotReceiver:
        """Start or resume receiving a leader's snapshot (see snapshot_install)."""
        self._require_writable("receive a snapshot")
        return SnapshotReceiver(self, meta)

    def _publish(self, tmp: Path, meta: SnapshotMeta) -> Snapshot:
        """Rename a complete, fsynced temporary directory to its snapshot name (the atomic
        step), fsync the parent, then prune. A *damaged* snapshot already under that name is
        replaced; a valid one is kept and SnapshotExists raised (the caller drops ``tmp``)."""
        final = self.dir / meta.name
        if os.path.lexists(final):
            try:
                self.verify(self.load(final))
            except SnapshotDamaged as e:
                log.warning("replacing damaged snapshot %s: %s", final.name, e)
                remove_tree(final)
            else:
                raise SnapshotExists(f"snapshot {meta.name} already exists in {self.dir}")
        os.rename(tmp, final)
        fsync_dir(self.dir)
        snap = Snapshot(meta, final)
        log.info("snapshot %s published (%d bytes, crc32c %#010x)", meta.name, meta.size,
                 meta.crc32c)
        try:
            self._drop_stale_install(meta)
            self.prune(keep=snap)
        except (OSError, SnapshotError) as e:  # the new snapshot is durable; retry next time
            log.warning("cleaning up after snapshot %s failed: %s", meta.name, e)
        return snap

    def _drop_stale_install(self, published: SnapshotMeta) -> None:
        """Delete a partial install that can no longer be useful: one of a snapshot not newer
        than the one just published (a node never installs an older state than it has).
        Without this an abandoned install (the leader changed, the peer caught up from the
        log) would hold its disk space forever; any other partial install waits for its
        sender, who resumes it or replaces it with a newer one."""
        path = self.dir / INSTALL_DIR
        if not os.path.lexists(path):
            return
        try:
            pending = SnapshotMeta.from_json((path / META_FILE).read_bytes())
        except (OSError, SnapshotMetaError):
            pending = None
        if pending is not None and pending.last_index > published.last_index:
            return
        if self._receiver is not None:
            self._receiver._end(f"superseded by snapshot {published.name}")
        log.info("deleting partial install %s: snapshot %s is as new",
                 pending.name if pending else "(unreadable meta)", published.name)
        remove_tree(path)

    def prune(self, keep: Snapshot | None = None) -> list[str]:
        """Delete snapshots older than the newest ``max_snapshots_kept`` intact ones; return
        the names deleted.

        Only intact snapshots (meta parses, size matches) count toward the quota, so a damaged
        newest one never pushes out the valid one behind it; ``keep`` (the snapshot just
        published) is never deleted. Damaged ones newer than the quota stay (for an operator to
        look at) until newer snapshots push them out too."""
        self._require_writable("prune snapshots")
        kept, removed = 0, []
        for _, _, p in reversed(self._names()):
            if kept >= self.max_snapshots_kept and (keep is None or p != keep.path):
                remove_tree(p)
                removed.append(p.name)
                log.info("deleted old snapshot %s", p.name)
            elif self._intact(p):
                kept += 1
        return removed
