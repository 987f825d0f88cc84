"""The cross-process member-state lock: DLedger's ``synchronized(memberState)`` for a process group.

In DLedger the vote/term decisions (elector) and "am I leader of term T -> append with term T ->
publish ledgerEnd" (handler) run under one monitor, so a vote is never granted by comparing
against a ledger end that is about to grow (docs/contracts.md C17). Here those two live in different
processes, so the monitor becomes an exclusive ``flock`` on ``<store_dir>/member.lock``:

* the kernel drops a ``flock`` when the last descriptor of the open file description closes, so
  a holder that dies (even SIGKILL) cannot wedge the node;
* the lock file is created on demand and never deleted: unlinking a lock file while someone may
  hold or be opening it lets two processes "hold" locks on two different inodes;
* the store dir must be on a local filesystem (flock over NFS is emulated or absent).

Critical sections are short (a compare and a store or a vote-file write), so waiting with a
timeout polls ``LOCK_NB`` with a capped back-off (50 us .. 2 ms); without a timeout it blocks in
the kernel and wakes the moment the holder releases.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Final

_FIRST_BACKOFF_S: Final = 50e-6
_MAX_BACKOFF_S: Final = 0.002


class LockTimeout(TimeoutError):
    """The member lock was not obtained in time (its holder is slow, stopped or deadlocked)."""


class MemberLock:
    """Exclusive, re-entrant, fork-aware lock on a lock file shared by the node's processes.

    Why re-entrant: ``flock`` locks belong to the open file description, not to a call, so a
    nested ``with lock:`` would "re-lock" for free and its exit would unlock the *outer*
    critical section too -- another process could then slip into the middle of it. A depth
    counter makes only the outermost release call ``LOCK_UN``. A ``threading.RLock`` in front
    keeps threads of one process out of each other's sections as well (they share the
    descriptor, so ``flock`` alone would not separate them).

    Why the descriptor is opened lazily and re-opened after fork: a child that inherited the
    descriptor would share the parent's open file description, hence the parent's lock -- its
    ``acquire`` would succeed while the parent holds it and its ``release`` would free the
    parent's. So the file is opened (``O_CLOEXEC``) on first use in each process, identified by
    pid.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = None) -> None:
        """``timeout`` (seconds, None = wait forever) is the default for ``with lock:``."""
        self.path = os.fspath(path)
        self.timeout = timeout
        self._fd = -1
        self._pid = -1
        self._depth = 0
        self._rlock = threading.RLock()

    # ---- descriptor ---------------------------------------------------------------------------

    def _ensure_fd(self) -> int:
        pid = os.getpid()
        if self._pid != pid:
            # First use here, or we are a forked child holding a copy of the parent's state.
            # Closing the inherited copy does not release the parent's lock (the parent still has
            # a descriptor for that open file description).
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._pid = pid
            self._depth = 0
            self._rlock = threading.RLock()
        return self._fd

    # ---- lock ---------------------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock, waiting at most ``timeout`` seconds (None: forever; 0: one try).

        Raises :class:`LockTimeout` when the time is up; nothing is held then.
        """
        fd = self._ensure_fd()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._rlock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise LockTimeout(f"{self.path}: another thread of this process holds the lock")
        try:
            if self._depth == 0:
                self._flock(fd, deadline)
            self._depth += 1
        except BaseException:
            self._rlock.release()
            raise

    def _flock(self, fd: int, deadline: float | None) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel wakes us when the holder lets go
            return
        delay = _FIRST_BACKOFF_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise LockTimeout(f"{self.path}: member lock held by another process")
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, _MAX_BACKOFF_S)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                continue

    def release(self) -> None:
        """Leave one level; the outermost release unlocks the file."""
        if self._pid != os.getpid() or self._depth == 0:
            raise RuntimeError(f"{self.path}: release() without a matching acquire()")
        self._depth -= 1
        try:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._rlock.release()

    @property
    def held(self) -> bool:
        """True if this process holds the lock (at any depth)."""
        return self._pid == os.getpid() and self._depth > 0

    def close(self) -> None:
        """Close the descriptor (which also drops the lock if still held)."""
        if self._fd >= 0:  # in a forked child this closes only the inherited copy
            os.close(self._fd)
        self._fd, self._pid, self._depth = -1, -1, 0

    def __enter__(self) -> MemberLock:
        self.acquire(self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
