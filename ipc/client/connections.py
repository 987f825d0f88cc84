"""The client's sockets: one DEALER per node (and its monitor), registered in the I/O
thread's poller, plus the wake-up file descriptor callers use to reach that thread.

Why a separate piece: everything here is about a socket's life (open, watch, drop, recreate),
not about what a request means. Lazy Pirate (zguide): a node that let a deadline pass is
*suspect*; once nothing is in flight on its socket the DEALER is closed (LINGER 0, so frames
queued to a stalled peer are dropped) and recreated. I/O thread only, except `Waker.wake`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping

import zmq
from zmq.utils.monitor import parse_monitor_message

from ipc import protocol as P
from ipc.security import ClientCurve
from ipc.sockets import data_address, dealer

log = logging.getLogger("dledger.client")

LOCAL_CHECK_S = 1.0  # how often the local node's link is checked against its current start


HANDSHAKE_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
"""Monitor events of a CURVE handshake that failed: remembered per node, so a call that gives
up says "n0 refused our key" instead of only "no reachable leader"."""


class Node:
    """One member as the client sees it: its socket, and what its recent silence says."""

    __slots__ = ("id", "address", "endpoint", "sock", "mon", "inflight", "suspect", "unresponsive",
                 "refused")

    def __init__(self, node_id: str, host: str, port: int) -> None:
        self.id = node_id
        self.address = f"{host}:{port}"
        self.endpoint = data_address(host, port)
        self.sock: zmq.Socket | None = None
        self.mon: zmq.Socket | None = None  # the DEALER's monitor: its connection dropped
        self.inflight = 0
        self.suspect = False  # its socket is to be recreated once nothing is in flight on it
        self.unresponsive = False  # let a deadline pass and has not answered anything since
        self.refused = ""  # why its last CURVE handshake failed ("" = it did not): said on give-up


class Waker:
    """Cross-thread wake-up for the I/O thread's poller: an eventfd (a pipe where there is none).

    A zmq PAIR/PUSH per caller thread would also work, but callers are arbitrary threads and
    sockets are not thread-safe; a file descriptor write is, and the poller watches fds too.
    """

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.rfd = self.wfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - non-Linux
            self.rfd, self.wfd = os.pipe()
            os.set_blocking(self.rfd, False)
            os.set_blocking(self.wfd, False)

    def wake(self) -> None:
        try:
            os.write(self.wfd, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except BlockingIOError:  # pipe full: it is readable anyway
            pass

    def drain(self) -> None:
        try:
            os.read(self.rfd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.rfd)
        if self.wfd != self.rfd:
            os.close(self.wfd)


class Connections:
    """Every node's DEALER and monitor, and the map back from a polled socket to its node.

    `peers` is replaced, never mutated, when members are learned: caller threads iterate it.
    """

    def __init__(self, ctx: zmq.Context, peers: Mapping[str, tuple[str, int]],
                 curve: ClientCurve | None = None, local_store_dir: str | None = None) -> None:
        self.ctx = ctx
        self.curve = curve  # None: plain connections; else CURVE, each member's own key
        # A node on this machine reached through shared memory (ipc.local_link) instead of a
        # DEALER: the store directory it runs on; its id is read from there at each open.
        self.local_store_dir = local_store_dir
        self._next_local_check = 0.0
        missing = [nid for nid in peers if curve is not None and nid not in curve.server_keys]
        if missing:
            raise ValueError(f"no public key for member(s) {', '.join(missing)} (expected "
                             f"{missing[0]}.key beside the key file, or server_keys=)")
        self.peers = {nid: (h, p) for nid, (h, p) in peers.items()}
        self.nodes = {nid: Node(nid, h, p) for nid, (h, p) in self.peers.items()}
        self.order = list(self.nodes.values())
        self.poller = zmq.Poller()
        self.sock_node: dict[zmq.Socket, Node] = {}
        self.mon_node: dict[zmq.Socket, Node] = {}  # monitor socket -> its DEALER's node
        self.suspects: set[Node] = set()

    def open_all(self) -> None:
        for node in self.order:
            self.open(node)

    def close_all(self) -> None:
        for node in self.order:
            if node.sock is not None:
                self.close(node)

    def open(self, node: Node) -> None:
        node.sock = dealer(self.ctx, node.endpoint,
                           curve=None if self.curve is None else (self.curve, node.id))
        self.sock_node[node.sock] = node
        self.poller.register(node.sock, zmq.POLLIN)
        node.mon = node.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.mon_node[node.mon] = node
        self.poller.register(node.mon, zmq.POLLIN)
        if self.local_store_dir is not None:
            self._open_local(node)

    def _open_local(self, node: Node) -> None:
        """Put a shared-memory link in front of `node`'s DEALER if it is the node running on the
        local store directory now (its `run.json`); else leave the DEALER (the node is not
        running there, or it is another member). The DEALER stays, polled as before: it
        carries the frames too large for the link's rings (`LocalLink.spill`)."""
        from ipc.local_link import LocalLink, LocalLinkError, node_run_info

        try:
            if node_run_info(self.local_store_dir).get("id") != node.id:
                return
            link = LocalLink(self.local_store_dir, spill=node.sock)
        except (LocalLinkError, OSError) as e:
            log.info("no local link to %s, using the network: %s", node.id, e)
            return
        node.sock = link
        self.sock_node[link.fileno()] = node  # zmq.Poller answers a polled object by its fd
        self.poller.register(link.fileno(), zmq.POLLIN)

    def check_local(self, now: float) -> None:
        """Once a second: move the local node's traffic to a link to its current start. A link
        to a node that stopped or started again is never answered (the new node has a new run
        directory), and a node that was not running when its socket was opened got a DEALER;
        waiting for a timeout to notice either would leave the local node on TCP, or silent,
        for as long as nothing was sent to it. Reopened once nothing is in flight on it (no
        live call loses its answer), as a suspect socket is."""
        if self.local_store_dir is None or now < self._next_local_check:
            return
        self._next_local_check = now + LOCAL_CHECK_S
        from ipc.local_link import LocalLink, LocalLinkError, node_run_info

        try:
            local_id = node_run_info(self.local_store_dir).get("id")
        except LocalLinkError:
            local_id = None  # not running: a link to it is stale
        for node in self.order:
            if isinstance(node.sock, LocalLink):  # imported above: only with a local node
                if not node.sock.stale():
                    continue
            elif node.sock is None or node.id != local_id:
                continue
            if node.inflight == 0:
                self.close(node)
                self.open(node)
            else:
                node.suspect = True
                self.suspects.add(node)

    def close(self, node: Node) -> None:
        if getattr(node.sock, "is_local_link", False):
            link = node.sock
            self.poller.unregister(link.fileno())
            self.sock_node.pop(link.fileno(), None)
            node.sock = link.spill
            link.close()
        if node.mon is not None:
            self.poller.unregister(node.mon)
            self.mon_node.pop(node.mon, None)
            try:
                node.sock.disable_monitor()
            except zmq.ZMQError:  # pragma: no cover - already gone
                pass
            node.mon.close(linger=0)
            node.mon = None
        if node.sock is not None:
            self.poller.unregister(node.sock)
            self.sock_node.pop(node.sock, None)
            node.sock.close(linger=0)
            node.sock = None

    def try_send(self, node: Node, frame: bytes) -> bool:
        """Queue `frame` to `node`; False if it could not be (no connection: nothing sent)."""
        try:
            node.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def receive(self, sock: zmq.Socket) -> Iterator[tuple[Node, P.Message]]:
        """The answers waiting on `sock`, decoded (a MULTI's one by one), with the node they
        came from. Bounded, so timers and submissions get their turn; an undecodable frame is
        logged and skipped. A generator: each answer is handled before the next is read."""
        node = self.sock_node.get(sock)
        if node is None:
            return
        src = node.sock  # a DEALER, or a LocalLink (the same calls; its DEALER's answers too)
        for _ in range(4096):
            try:
                frame = src.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = P.decode(frame)
            except P.ProtocolError as e:
                log.warning("undecodable reply from %s: %s", node.id, e)
                continue
            if type(msg) is P.Multi:
                for inner in msg.frames:
                    try:
                        inner_msg = P.decode(inner)
                    except P.ProtocolError as e:
                        log.warning("undecodable reply from %s: %s", node.id, e)
                        continue
                    yield node, inner_msg
                continue
            yield node, msg

    def dropped(self, mon: zmq.Socket) -> Node | None:
        """Read `mon`'s events; the node whose connection dropped, if it did."""
        node = self.mon_node.get(mon)
        dropped = False
        for _ in range(64):
            try:
                event = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                kind = parse_monitor_message(event)["event"]
                dropped = dropped or kind == zmq.EVENT_DISCONNECTED
                if kind & HANDSHAKE_FAILED and node is not None:
                    node.refused = ("it refused our key" if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                    else "the handshake failed: a secure node and a plain client, "
                                         "or the other way round")
            except (ValueError, KeyError, IndexError):  # pragma: no cover - a libzmq we do not know
                continue
        return node if dropped else None

    def mark_suspect(self, node: Node) -> None:
        node.suspect = True
        node.unresponsive = True
        self.suspects.add(node)

    def answered(self, node: Node) -> None:
        """`node` answered something: it is neither silent nor due for a new socket."""
        node.unresponsive = False
        node.refused = ""
        if node.suspect:
            node.suspect = False
            self.suspects.discard(node)

    def reset_suspects(self) -> None:
        """Lazy Pirate: recreate the DEALER of a node that let a deadline pass, once nothing
        else is in flight on it (so no live call loses its reply)."""
        for node in list(self.suspects):
            if node.inflight == 0:
                self.suspects.discard(node)
                node.suspect = False
                self.close(node)
                self.open(node)
                log.debug("recreated the socket to %s after a timeout", node.id)

    def add_members(self, new: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
        """Open a socket to each new member; the ones added (an address libzmq refuses — a
        node's misconfigured --peers, a hostile answer — is left out, never fatal)."""
        for nid, (host, port) in list(new.items()):
            node = Node(nid, host, port)
            try:
                self.open(node)
            except (zmq.ZMQError, ValueError) as e:  # ValueError: no public key for it
                self.close(node)
                del new[nid]
                log.warning("member %s named in METADATA has an unusable address %r: %s", nid,
                            f"{host}:{port}", e)
                continue
            self.nodes[nid] = node
            self.order.append(node)
        if new:
            self.peers = {**self.peers, **new}
        return new
