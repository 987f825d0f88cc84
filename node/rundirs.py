"""Temporary directories that the next start reclaims when their owner was killed.

A node's run directory (`/tmp/dl-n0-*`: its ipc:// sockets and config.json) and the stores of
the local groups the tools start (`dledger-cluster-*`, `dledger-local-*`) are removed by their
owner when it stops. An owner killed with SIGKILL (or by the OOM killer) cannot: 184 run
directories piled up in /tmp during one test run. So each such directory holds an owner file,
`owner.lock`, that its owner keeps locked (flock) for as long as it lives and in which it wrote
its pid. Making a new directory first sweeps the old ones with the same prefix: one whose lock
can be taken has no living owner, and is removed.

Why a lock and not "is that pid still running": pids are reused (a busy machine or a container
restarting from pid 1 hands the dead owner's pid to someone else), a lock dies with its owner,
and taking it is the check. The pid in the file is for people.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

OWNER_FILE = "owner.lock"


def claim(directory: Path) -> int:
    """Lock `directory`'s owner file for this process's lifetime and write our pid in it.
    Returns the fd: keep it open (close it only after removing the directory). Not inherited
    by child processes (O_CLOEXEC), so a role outliving its supervisor does not keep it."""
    fd = os.open(directory / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # Blocking: a sweeper may hold it for a moment, sees the file still empty and lets go.
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def sweep_stale(prefix: str, parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove this user's directories `parent/prefix*` whose owner is gone; returns them.
    A directory without an owner file (not ours, or made by an older version) is left alone,
    as is one whose owner file is still empty (its owner is between creating and locking it)."""
    base = Path(parent or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = list(base.glob(f"{prefix}*"))
    except OSError:
        return removed
    for d in candidates:
        try:
            st = d.lstat()
            if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid():
                continue
            fd = os.open(d / OWNER_FILE, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its owner is alive
            if not os.pread(fd, 32, 0).strip():
                continue
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


def make_owned_tempdir(prefix: str, parent: str | os.PathLike[str] | None = None,
                       sweep_prefix: str | None = None) -> tuple[Path, int]:
    """A new `parent/prefix*` directory claimed by this process (see `claim`), after sweeping
    stale ones (`sweep_prefix`, default `prefix`). Returns (path, owner fd)."""
    sweep_stale(sweep_prefix or prefix, parent)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    return path, claim(path)


def release(directory: Path | None, fd: int | None) -> None:
    """Remove `directory` and then let go of its owner lock (in that order: a sweeper must not
    see an unlocked directory that its owner is still removing)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
    if fd is not None:
        os.close(fd)
