"""The few file-system moves snapshots are built from, each with its durability reason.

The habits are the log store's (docs/store.md): a file's bytes are durable after ``fsync`` of
the file, a name (creation, rename, deletion) only after ``fsync`` of its directory; anything
that must appear whole is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from crc32c import crc32c

TMP_PREFIX = ".tmp-"  # every name starting with it is garbage once no writer is running
READ_BLOCK = 1 << 20  # 1 MiB: large enough that CRC-32C, not the syscall, dominates


def fsync_dir(path: Path) -> None:
    """Make the names in ``path`` durable (a rename or unlink is only journalled on disk once
    its directory is fsynced)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write every byte (``os.write``/``os.pwrite`` may be short on a full or slow disk)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


def write_file_durably(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` and fsync it. No rename: callers write inside a temporary
    directory whose own rename is the atomic step."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete a snapshot directory so that no crash leaves it half-deleted under its name.

    ``rmtree`` unlinks file by file; a crash between ``meta.json`` and ``data`` would leave a
    directory with a valid snapshot name and half its files. Renaming it to a ``.tmp-`` name
    first (one atomic step, made durable) means the name is either whole or gone, and the
    leftover is removed by the next writer's open if ``rmtree`` does not finish.
    """
    aside = path.with_name(f"{TMP_PREFIX}del-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    fsync_dir(path.parent)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside)
    else:  # a stray file under a snapshot's name
        aside.unlink()


def crc_of_fd(fd: int, length: int) -> tuple[int, int]:
    """(bytes read, CRC-32C) of the first ``length`` bytes of ``fd``, reading from offset 0
    with ``pread`` in 1 MiB blocks (bounded memory whatever the size). Fewer bytes than
    ``length`` means the file is shorter."""
    buf = bytearray(min(READ_BLOCK, max(length, 1)))
    view = memoryview(buf)
    done, crc = 0, 0
    while done < length:
        n = os.preadv(fd, [view[: min(len(buf), length - done)]], done)
        if n == 0:
            break
        crc = crc32c(view[:n], crc)
        done += n
    return done, crc


def pread_exact(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset``, fewer only at end of file."""
    parts: list[bytes] = []
    while n > 0:
        b = os.pread(fd, n, offset)
        if not b:
            break
        parts.append(b)
        offset += len(b)
        n -= len(b)
    return b"".join(parts)
