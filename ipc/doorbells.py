"""Doorbells: the in-node wake-ups that carry no data, as named pipes in the run directory.

Why not ZeroMQ: a hint that only says "look at the block again" (docs/contracts.md C24) paid,
per send, a hand-off to the sender's ZeroMQ I/O thread, a unix socket, and a hand-off from the
receiver's I/O thread: 45 µs per round trip on an idle machine against 5 µs for a pipe, and the
trace of one commit (docs/performance.md) crosses several such hops
(`python -m tools.bench.wakeup`). A pipe's read end is a plain fd that the role's `zmq.Poller`
polls beside its sockets: no second wait, no thread.

Why a named pipe (FIFO) in the run directory, not an eventfd inherited at fork: every process
of the node finds it by name, whether the role was forked from the zygote (which closes every
inherited fd) or started as a fresh interpreter, and a role the supervisor restarts opens the
same pipe again. Each end opens it O_RDWR (Linux): the open never blocks, and the pipe never
sees end-of-file, so a ring made while the waiter restarts stays in it until the new waiter
drains it.

One doorbell per waiting process: a pipe drained by one reader wakes that reader only. A ring
is one byte written without blocking; a full pipe (64 KiB of rings nobody drained) already
wakes its reader, so a ring that does not fit is dropped. Lost, duplicated or early rings cost
latency, never correctness: the waiter decides from the block and the store, and its loop has a
poll timeout (C24).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_RING = b"\x01"
_DRAIN_CHUNK = 4096


class DoorbellError(OSError):
    """The doorbell's path exists and is not a named pipe (something else took the name)."""


class Doorbell:
    """One end of a named pipe: `ring` to wake its waiter, `fileno` to poll, `drain` after."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Doorbell:
        """Open (creating it if missing) the doorbell at `path`. Safe to race: whichever process
        creates the FIFO first, every opener gets the same pipe."""
        p = os.fspath(path)
        try:
            os.mkfifo(p, 0o600)
        except FileExistsError:
            pass
        fd = os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise DoorbellError(errno.EEXIST, "not a named pipe (a doorbell)", p)
        return cls(fd, p)

    def fileno(self) -> int:
        return self.fd

    def ring(self) -> None:
        """Wake the waiter; never blocks."""
        try:
            os.write(self.fd, _RING)
        except BlockingIOError:
            pass  # full: it is rung already

    def drain(self) -> int:
        """Consume every ring waiting (one wake-up per burst is all a waiter needs); how many."""
        n = 0
        while True:
            try:
                got = os.read(self.fd, _DRAIN_CHUNK)
            except BlockingIOError:
                return n
            n += len(got)
            if len(got) < _DRAIN_CHUNK:
                return n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def bell_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    """Where doorbell `name` of the node whose run directory is `run_dir` lives."""
    if not name or "/" in name or "\0" in name:
        raise ValueError(f"bad doorbell name {name!r}")
    return Path(run_dir) / name
