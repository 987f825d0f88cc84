"""ZeroMQ socket conventions, in one place, so every role process behaves the same.

Rules these helpers encode (after the zguide and circus):

- One context per process, created after the process started (`make_context`); never
  inherited across fork, never shared between processes.
- LINGER 0: a closing socket drops unsent messages instead of blocking shutdown. Nothing we
  send is precious: requests are retried, wake-ups are hints (docs/contracts.md C24).
- Bounded queues (SNDHWM/RCVHWM): backpressure by not polling, never unbounded memory.
- Sockets that face the network get ZMQ_MAXMSGSIZE, so an oversized frame from a stranger is
  dropped by libzmq (the peer is disconnected) before Python allocates it.
- DEALERs set IMMEDIATE: a message is only queued to a *connected* peer, so a send to a dead
  peer fails at once with ``zmq.Again`` (with ``zmq.NOBLOCK``) instead of silently waiting
  for a reconnect. The elector reports that as "no answer" without waiting for a deadline.
- Short reconnect intervals: a restarted peer is found again within ~100 ms (failover budget).
- TCP keepalive so half-open connections after a host vanishes are eventually noticed.
- Servers bind the host given in their own peer address (e.g. 127.0.0.1), never 0.0.0.0
  unless asked: nothing listens on a public interface by accident (docs/operations.md "Trust and
  membership").
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

import zmq

from ipc.peers import PeersError, format_peers, parse_peers  # noqa: F401 - re-exported
from ipc.peers import host_literal as _host
from ipc.protocol import DEFAULT_MAX_FRAME
from ipc.security import ClientCurve, ServerKeys, curve_server

DEFAULT_HWM = 10_000
"""Per-socket queue bound in messages (each direction)."""
RECONNECT_IVL_MS = 50
RECONNECT_IVL_MAX_MS = 500
MAX_IPC_PATH = 100
"""Longest ipc:// socket path we create (Linux sun_path holds 107 bytes + NUL)."""


def make_context(io_threads: int = 1) -> zmq.Context:
    """A fresh context for this process. Call after fork/spawn, once per process."""
    ctx = zmq.Context(io_threads=io_threads)
    ctx.setsockopt(zmq.LINGER, 0)  # default for every socket created from it
    return ctx


def _common(sock: zmq.Socket, hwm: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)


def _network(sock: zmq.Socket, max_msg_size: int | None) -> None:
    """Options for a socket whose other end is another host/process over TCP."""
    if max_msg_size is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


def _is_network(addr: str) -> bool:
    return addr.startswith("tcp://")


def router(ctx: zmq.Context, bind_addr: str, *, hwm: int = DEFAULT_HWM,
           max_msg_size: int | None = DEFAULT_MAX_FRAME,
           curve: tuple[ServerKeys, str] | None = None) -> zmq.Socket:
    """Server socket (handler's data port, elector port). Replies go to the sender's identity.

    An unroutable reply (client gone) is dropped silently, never blocks the server.
    `curve` = (the node's keys, ZAP domain): a CURVE server; the process must run a ZAP
    handler (`ipc.security.Zap`) or libzmq admits every key.
    """
    sock = ctx.socket(zmq.ROUTER)
    _common(sock, hwm)
    if _is_network(bind_addr):
        _network(sock, max_msg_size)
    if curve is not None:
        curve_server(sock, *curve)
    sock.bind(bind_addr)
    return sock


def dealer(ctx: zmq.Context, connect_addr: str, identity: bytes | str | None = None, *,
           hwm: int = DEFAULT_HWM,
           max_msg_size: int | None = DEFAULT_MAX_FRAME,
           curve: tuple[ClientCurve, str] | None = None) -> zmq.Socket:
    """Client socket to one server; pipelines requests matched by request id.

    `identity` (e.g. the node id) makes the peer's ROUTER see a stable name across reconnects.
    `curve` = (our CURVE identity, the member id we connect to): a CURVE client that accepts
    only that member's key (KeyFileError when it is not known: nothing is opened).
    """
    sock = ctx.socket(zmq.DEALER)
    _common(sock, hwm)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode() if isinstance(identity, str) else identity)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    if _is_network(connect_addr):
        _network(sock, max_msg_size)
    try:
        if curve is not None:
            curve[0].apply(sock, curve[1])
        sock.connect(connect_addr)
    except (zmq.ZMQError, ValueError):
        sock.close(linger=0)  # an address libzmq refuses, a member without a key: no half-made socket left behind
        raise
    return sock


def pull(ctx: zmq.Context, bind_addr: str, *, hwm: int = DEFAULT_HWM) -> zmq.Socket:
    """Fan-in end of a one-way wake-up channel (binds; many PUSHes connect)."""
    sock = ctx.socket(zmq.PULL)
    _common(sock, hwm)
    sock.bind(bind_addr)
    return sock


def push(ctx: zmq.Context, connect_addr: str, *, hwm: int = DEFAULT_HWM) -> zmq.Socket:
    """Sending end of a one-way wake-up channel. Use ``zmq.NOBLOCK``: a full queue means the
    receiver is behind and will read the truth from shared state anyway."""
    sock = ctx.socket(zmq.PUSH)
    _common(sock, hwm)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.connect(connect_addr)
    return sock


def pub(ctx: zmq.Context, bind_addr: str, *, hwm: int = DEFAULT_HWM) -> zmq.Socket:
    """Broadcast end (elector role changes, handler "appended up to i"). Drops on HWM."""
    sock = ctx.socket(zmq.PUB)
    _common(sock, hwm)
    sock.bind(bind_addr)
    return sock


def sub(ctx: zmq.Context, connect_addr: str, topics: tuple[bytes, ...] = (b"",), *,
        hwm: int = DEFAULT_HWM, conflate: bool = False) -> zmq.Socket:
    """Subscriber. `conflate=True` keeps only the newest message: right for "latest value"
    hints (single-frame only), wrong for anything that must be counted."""
    sock = ctx.socket(zmq.SUB)
    _common(sock, hwm)
    if conflate:
        sock.setsockopt(zmq.CONFLATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    for t in topics:
        sock.setsockopt(zmq.SUBSCRIBE, t)
    sock.connect(connect_addr)
    return sock


def ipc_path(run_dir: str | os.PathLike[str], name: str) -> str:
    """``ipc://`` endpoint for `name` under `run_dir`, always within the socket path limit.

    If ``run_dir/name`` is too long (deep pytest tmp dirs), fall back to a short path in the
    system temp dir derived from a hash of the full path, so every process of the node computes
    the same endpoint without talking to each other.
    """
    if not name or "/" in name or "\0" in name:
        raise ValueError(f"bad ipc socket name {name!r}")
    path = os.path.join(os.fspath(run_dir), name)
    if len(os.fsencode(path)) <= MAX_IPC_PATH:
        return "ipc://" + path
    digest = hashlib.sha1(os.fsencode(os.path.abspath(path))).hexdigest()[:16]
    short = os.path.join("/tmp", f"dl-{digest}-{name}")
    if len(os.fsencode(short)) > MAX_IPC_PATH:
        short = os.path.join("/tmp", f"dl-{digest}")
    return "ipc://" + short


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port`` for bind or connect (IPv6 hosts bracketed)."""
    return f"tcp://{_host(host)}:{port}"


def from_source(endpoint: str, source_host: str | None) -> str:
    """`endpoint` (``tcp://host:port``) connected from `source_host` (any free port) when one
    is given: ZeroMQ's ``tcp://source;endpoint`` form. Used for peer connections of a node
    configured with `connect_from_own_host`."""
    if source_host is None:
        return endpoint
    return f"tcp://{_host(source_host)}:0;{endpoint.removeprefix('tcp://')}"


def data_address(host: str, port: int) -> str:
    """The node's data port endpoint (handler: clients and pushes): the port in the peers string."""
    return tcp_endpoint(host, port)


def elector_address(host: str, port: int) -> str:
    """The node's elector endpoint: data port + 1 (a public convention: every node of a group relies
    on it)."""
    if not 1 <= port <= 65534:
        raise ValueError(f"port {port} leaves no room for the elector port")
    return tcp_endpoint(host, port + 1)


def drain(sock: zmq.Socket) -> None:
    """Discard every message waiting on `sock`: wake-up sockets carry hints only (the shared
    block is the truth), so one wake-up per burst is all a role needs."""
    while True:
        try:
            sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return


def recv_routed(sock: zmq.Socket, flags: int = 0) -> tuple[bytes, bytes] | None:
    """(identity, frame) from a ROUTER, or None for a message with the wrong frame count
    (a DEALER sends exactly one frame; REQ-style empty delimiters or extra frames are junk
    and are dropped: docs/contracts.md C23)."""
    parts = sock.recv_multipart(flags)
    if len(parts) != 2:
        return None
    return parts[0], parts[1]


def send_routed(sock: zmq.Socket, identity: bytes, frame: bytes) -> bool:
    """Reply through a ROUTER without ever blocking; False if it could not be queued."""
    try:
        sock.send_multipart((identity, frame), zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


__all__ = [
    "DEFAULT_HWM",
    "MAX_IPC_PATH",
    "PeersError",
    "data_address",
    "dealer",
    "elector_address",
    "format_peers",
    "ipc_path",
    "make_context",
    "parse_peers",
    "pub",
    "pull",
    "push",
    "recv_routed",
    "router",
    "send_routed",
    "sub",
    "tcp_endpoint",
]


REDIAL_MS = 1_000
"""How long a CURVE dealer may fail every send before it is made again (`Redial`)."""


class Redial:
    """A member's DEALER that is made again when it cannot send for `REDIAL_MS`.

    Why: libzmq does not reconnect a CURVE client whose handshake the server's ZAP refused (a
    node the others did not know yet: a machine that joins, before its `member add` reaches
    them). The socket stays unconnected for good, and an IMMEDIATE dealer refuses every send.
    A new socket shakes hands again, and is admitted once the server knows the key. A peer
    that is simply down costs one socket made per `REDIAL_MS`. Plain sockets reconnect by
    themselves and are never remade (`enabled` False)."""

    def __init__(self, make: Callable[[], zmq.Socket], enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make, self.enabled, self._clock = make, enabled, clock
        self.sock = make()
        self._failing_since: float | None = None

    def sent(self) -> None:
        self._failing_since = None

    def failed(self) -> zmq.Socket | None:
        """A send was refused (not connected): the replaced socket (closed) when a new one was
        made, else None. The caller re-registers `sock` in its poller."""
        if not self.enabled:
            return None
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
            return None
        if (now - self._failing_since) * 1000 < REDIAL_MS:
            return None
        old, self.sock = self.sock, self._make()
        self._failing_since = now
        old.close(linger=0)
        return old
