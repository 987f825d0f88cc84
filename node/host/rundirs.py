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

Run directories made before owner files existed are reclaimed too, more carefully (see
`legacy_run_dir_is_stale`): only a directory named and filled exactly as a supervisor makes
them, at least 10 minutes old, whose store does not name it as the run directory of a live
supervisor.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

OWNER_FILE = "owner.lock"
RUN_DIR_NAME = re.compile(r"dl-[^-/]+-[a-z0-9_]{8}")
"""What the supervisor's mkdtemp(prefix=f"dl-{node}-") makes; nothing else is a legacy run dir."""
LEGACY_MIN_AGE_S = 600


def legacy_run_dir_is_stale(d: Path, now: float | None = None) -> bool:
    """A run dir without an owner file (an older version made it) that no node uses: named
    `dl-ID-xxxxxxxx`, holding only config.json, ipc sockets and fatal-* files, untouched for
    LEGACY_MIN_AGE_S, and its store's run.json (kept by a running supervisor) does not point at
    it with a live pid. Anything unexpected means "not ours": keep it."""
    if not RUN_DIR_NAME.fullmatch(d.name):
        return False
    try:
        if (now or time.time()) - d.stat().st_mtime < LEGACY_MIN_AGE_S:
            return False
        for entry in os.scandir(d):
            if entry.name != "config.json" and not entry.name.startswith("fatal-") \
                    and not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                return False
        store = json.loads((d / "config.json").read_text(encoding="utf-8"))["store_dir"]
        run = Path(store) / "run.json"
        if not run.exists():
            return True  # no supervisor runs on that store (or the store is gone)
        info = json.loads(run.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if info.get("run_dir") != str(d):
        return True  # that store's node runs with another run dir
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return False


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


def sweep_stale(prefix: str, parent: str | os.PathLike[str] | None = None,
                legacy_run_dirs: bool = False) -> list[Path]:
    """Remove this user's directories `parent/prefix*` whose owner is gone; returns them.
    A directory without an owner file is left alone (unless `legacy_run_dirs` and
    `legacy_run_dir_is_stale`), as is one whose owner file is still empty (its owner is
    between creating and locking it)."""
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
        except FileNotFoundError:
            if legacy_run_dirs and legacy_run_dir_is_stale(d):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
            continue
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
                       sweep_prefix: str | None = None, legacy_run_dirs: bool = False,
                       ) -> tuple[Path, int]:
    """A new `parent/prefix*` directory claimed by this process (see `claim`), after sweeping
    stale ones (`sweep_prefix`, default `prefix`). Returns (path, owner fd)."""
    sweep_stale(sweep_prefix or prefix, parent, legacy_run_dirs)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    return path, claim(path)


def release(directory: Path | None, fd: int | None) -> None:
    """Remove `directory` and then let go of its owner lock (in that order: a sweeper must not
    see an unlocked directory that its owner is still removing)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
    if fd is not None:
        os.close(fd)
