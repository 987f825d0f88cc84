"""A local client's link to a node on its own machine: two shared-memory rings and two doorbells.

A process beside the node (a broker that embeds the log) gives `DLedgerClient` the node's store
directory (`local_store_dir=`); requests to that node then travel through this link instead of
ZeroMQ over TCP: the same frames, the same sessions, retries and redirects. Requests to the
other members still go over the network.

What a link is, on disk:

* `/dev/shm/dledger-local-PID-TOKEN`: the segment, created and sized once by the client (never
  shrunk: a mapped file must not shrink under a reader): a 64-byte link header, the request
  ring (client -> node) and the reply ring (node -> client), each an `ipc.shm_ring.Ring`.
* `RUN_DIR/local/PID-TOKEN.bell`: the client's doorbell (a named pipe), rung by the handler
  after it put replies; it is also the link's registration: the handler attaches to every
  link whose bell it finds in that directory.
* `RUN_DIR/local.bell`: the handler's doorbell, rung by a client after it put a request.

RUN_DIR is the node's run directory, found in `STORE_DIR/run.json` (written by the supervisor
at start, removed at stop). Who may use a link: whoever can create files in the run directory
and read the store directory, i.e. the node's own user: the same process could read the store
itself. So a local client is trusted like an admin client key, and cannot send Raft traffic
between members (`ipc.security.authorize` with `LOCAL_PRINCIPAL`).

Lifetimes: the client removes its bell and segment at `close`; the handler detaches a link
whose bell is gone or whose process is dead, and removes what a killed client left. A new
node (a restart has a new run directory) finds no registration: the client's request times
out, the client recreates the link (as it recreates a silent DEALER), and the new link
registers with the new run directory.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from pathlib import Path

from ipc.doorbells import Doorbell
from ipc.shm_ring import Ring, ring_size

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "dledger-local-"
LINK_DIR = "local"  # in the run directory: one bell per link
REQUEST_BELL = "local.bell"  # in the run directory: the handler's
RING_CAPACITY = 32 << 20
"""Per direction. Frames up to half of it (16 MiB) cross the link: every answer a node with the
default limits gives (a GET's 4 MiB plus one 4 MiB entry) fits with room to spare. Larger
requests go over the network (`LocalLink.spill`). tmpfs allocates pages as the ring first
reaches them: up to 64 MiB per link, freed when the link closes."""
LINK_HEADER = 64
_LINK = struct.Struct("<4sHHqq")  # magic, version, 0, client pid, handler pid (0: not attached)
LINK_MAGIC = b"DLLK"
LINK_VERSION = 1
IDENT_PREFIX = b"\x00local-"
"""A link's routing identity in the handler. ZeroMQ's own identities are 5 bytes starting with
0 and a peer may not choose one starting with 0, so no network peer can ever hold this one."""
LOCAL_PRINCIPAL = ("client", "local", "admin")
NAME_RE = re.compile(r"^([1-9][0-9]{0,9})-([0-9a-f]{16})$")


class LocalLinkError(OSError):
    """The node's store directory names no running node, or its run directory refuses a link."""


def segment_path(name: str) -> str:
    return f"{SHM_DIR}/{SEGMENT_PREFIX}{name}"


def segment_size() -> int:
    return LINK_HEADER + 2 * ring_size(RING_CAPACITY)


def link_ident(name: str) -> bytes:
    return IDENT_PREFIX + name.encode("ascii")


def is_local_ident(ident: bytes) -> bool:
    return ident[:len(IDENT_PREFIX)] == IDENT_PREFIX


def node_run_info(store_dir: str | os.PathLike[str]) -> dict:
    """What `STORE_DIR/run.json` says about the node running there (run_dir, id, group)."""
    p = Path(store_dir) / "run.json"
    try:
        info = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(info.get("run_dir"), str) or not isinstance(info.get("id"), str):
            raise ValueError("no run_dir or id")
    except FileNotFoundError:
        raise LocalLinkError(f"no node is running on {store_dir} (no run.json)") from None
    except (OSError, ValueError) as e:
        raise LocalLinkError(f"{p}: {e}") from None
    return info


def run_stamp(run_json: Path) -> tuple[int, int] | None:
    """Which start of a node wrote `run_json` (inode and mtime: the supervisor replaces the
    file at each start); None: no node runs there."""
    try:
        st = os.stat(run_json)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class Segment:
    """The mapped segment and its two rings, from either side."""

    def __init__(self, fd: int, *, create: bool) -> None:
        size = segment_size()
        if create:
            os.ftruncate(fd, size)
        elif os.fstat(fd).st_size != size:
            raise LocalLinkError("a local link segment of another size (another version?)")
        self.map = mmap.mmap(fd, size)
        self.view = memoryview(self.map)
        r = ring_size(RING_CAPACITY)
        req = self.view[LINK_HEADER:LINK_HEADER + r]
        rep = self.view[LINK_HEADER + r:LINK_HEADER + 2 * r]
        if create:
            _LINK.pack_into(self.view, 0, LINK_MAGIC, LINK_VERSION, 0, os.getpid(), 0)
            self.requests, self.replies = (Ring(req, init_capacity=RING_CAPACITY),
                                           Ring(rep, init_capacity=RING_CAPACITY))
        else:
            magic, version, _z, _client, _handler = _LINK.unpack_from(self.view, 0)
            if magic != LINK_MAGIC or version != LINK_VERSION:
                raise LocalLinkError(f"not a local link segment (magic {magic!r}, version {version})")
            self.requests, self.replies = Ring(req), Ring(rep)
        self._parts = [req, rep]

    def close(self) -> None:
        for ring in (self.requests, self.replies):
            ring.words.release()
        for v in self._parts:
            v.release()
        self.view.release()
        self.map.close()


class LocalLink:
    """The client's end, shaped like the DEALER it replaces in `ipc.client.connections`:
    `send(frame, flags)` raises `zmq.Again` when the ring is full, `recv(flags)` when nothing
    waits; the client's poller polls `fileno()` (its doorbell). I/O thread only."""

    is_local_link = True

    def __init__(self, store_dir: str | os.PathLike[str], spill: object = None) -> None:
        import zmq  # the client has it; the error type the connection code expects

        self._again = zmq.Again
        self.spill = spill  # the node's DEALER: frames over the rings' limit, and their answers
        self.run_json = Path(store_dir) / "run.json"
        self.started = run_stamp(self.run_json)  # which start of the node this link is to
        info = node_run_info(store_dir)
        self.node_id: str = info["id"]
        run_dir = Path(info["run_dir"])
        self.name = f"{os.getpid()}-{os.urandom(8).hex()}"  # not `secrets`: 4 ms of import in the handler
        self.ident = link_ident(self.name)
        self._seg_path = segment_path(self.name)
        fd = os.open(self._seg_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.bell: Doorbell | None = None
        self.handler_bell: Doorbell | None = None
        try:
            self.segment = Segment(fd, create=True)
        except BaseException:
            os.close(fd)
            os.unlink(self._seg_path)
            raise
        os.close(fd)
        self._pending: list[bytes] = []
        try:
            (run_dir / LINK_DIR).mkdir(mode=0o700, exist_ok=True)
            self.handler_bell = Doorbell.open(run_dir / REQUEST_BELL)
            self.bell = Doorbell.open(run_dir / LINK_DIR / f"{self.name}.bell")  # registers
        except OSError as e:
            self.close()
            raise LocalLinkError(f"cannot link to the node in {run_dir}: {e.strerror or e}") from None
        self.handler_bell.ring()  # "look for new links"

    def stale(self) -> bool:
        """The node this link was made to is gone: stopped (no run.json) or started again (a
        new run.json, in a new run directory, whose handler never sees this link)."""
        return run_stamp(self.run_json) != self.started

    def fileno(self) -> int:
        assert self.bell is not None
        return self.bell.fd

    def send(self, frame: bytes, flags: int = 0) -> None:
        """Put `frame` in the request ring (zmq.Again: full, or too large with no DEALER)."""
        if len(frame) > self.segment.requests.max_frame:
            if self.spill is None:
                raise self._again()
            self.spill.send(frame, flags)  # larger than a ring takes: the network
            return
        if not self.segment.requests.put(frame):
            raise self._again()
        self.handler_bell.ring()

    def recv(self, flags: int = 0) -> bytes:
        """The next answer: from the reply ring, then from the DEALER (zmq.Again: none)."""
        if not self._pending:
            self.bell.drain()  # before taking: a reply put after the take rings again
            self._pending = self.segment.replies.take()
            self._pending.reverse()
            if not self._pending:
                if self.spill is not None:
                    return self.spill.recv(flags)
                raise self._again()
        return self._pending.pop()

    def close(self, linger: int = 0) -> None:
        """Remove the registration first (the handler then detaches), then the segment. The
        DEALER (`spill`) is its owner's to close."""
        if self.bell is not None:
            try:
                os.unlink(self.bell.path)
            except OSError:
                pass
            self.bell.close()
            self.bell = None
        if self.handler_bell is not None:
            self.handler_bell.ring()  # "a link went away": the handler rescans now
            self.handler_bell.close()
            self.handler_bell = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None
            try:
                os.unlink(self._seg_path)
            except OSError:
                pass
