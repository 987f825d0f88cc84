"""The elector's ZeroMQ transport: the sockets `Elector.run` gives the role (the simulator
gives it its own transport with the same four methods, docs/contracts.md C7)."""

from __future__ import annotations

from collections.abc import Callable

import zmq

from ipc.security import ELECTOR_DOMAIN
from ipc.sockets import Redial, dealer, elector_address, from_source, router, send_routed
from node.core.slots import SlotTable
from node.roles.runtime import RoleContext
from node.wiring import channels, fault_hooks

MAX_ELECTOR_FRAME = 64 << 10  # elector messages are tiny; anything bigger is junk


class ZmqElectorTransport:
    """The elector's sockets: ROUTER on the elector port, one IMMEDIATE DEALER per peer, the
    role PUB and the control ROUTER (node.wiring.channels)."""

    def __init__(self, rc: RoleContext, peers: list[str], table: SlotTable) -> None:
        cfg = rc.cfg
        self.rc = rc
        host, port = cfg.address
        self.router = router(rc.zctx, elector_address(host, port), max_msg_size=MAX_ELECTOR_FRAME,
                             curve=rc.curve_server(ELECTOR_DOMAIN))
        self.pub = rc.open(channels.ROLE)
        self.ctl = rc.open(channels.CONTROL)
        self.confirm = rc.bell(channels.CONFIRM_BELL)  # the handler's CONFIRM_LEADERSHIP rings
        self.confirmed = rc.bell(channels.CONFIRMED_BELL)
        self.dealers: dict[str, zmq.Socket] = {}
        self.redials: dict[str, Redial] = {}
        # (peer, old socket, new socket): a dealer made again after a refused handshake; the
        # elector moves its poller registration (set by the elector)
        self.on_replaced: Callable[[str, zmq.Socket, zmq.Socket], None] | None = None
        for peer in peers:
            h, p = table.address_of(peer)  # type: ignore[misc]
            self.connect(peer, h, p)

    def connect(self, peer: str, host: str, port: int) -> zmq.Socket:
        """A DEALER to member `peer`'s elector port (one per member: those of the slot table
        at start, and each one it gains later)."""
        cfg = self.rc.cfg
        source = cfg.address[0] if cfg.connect_from_own_host else None
        r = self.redials[peer] = Redial(
            lambda: dealer(self.rc.zctx, from_source(elector_address(host, port), source),
                           curve=self.rc.peer_curve(peer)),
            enabled=self.rc.server_keys() is not None)
        self.dealers[peer] = r.sock
        return r.sock

    def send(self, peer: str, frame: bytes) -> bool:
        """False = the peer cannot be reached now (its connection is gone: IMMEDIATE)."""
        if fault_hooks.faults.blocked(peer):
            return True  # test-only partition: the message is lost on the way
        s = self.dealers.get(peer)
        if s is None:  # not in this node's slot table (yet): as unreachable
            return False
        r = getattr(self, "redials", {}).get(peer)  # (a test builds a transport by hand)
        try:
            s.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            if r is not None and (old := r.failed()) is not None:  # ipc.sockets.Redial
                self.dealers[peer] = r.sock
                if self.on_replaced is not None:
                    self.on_replaced(peer, old, r.sock)
            return False
        if r is not None:
            r.sent()
        return True

    def reply(self, ident: bytes, frame: bytes) -> None:
        send_routed(self.router, ident, frame)

    def role_changed(self, frame: bytes) -> None:
        try:
            self.pub.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            pass  # a hint only: subscribers also re-read the block on their own timeouts

    def control_reply(self, ident: bytes | str, frame: bytes) -> None:
        if ident == channels.BELL_TOKEN:  # asked by a ring: answered by a ring
            self.confirmed.ring()
        else:
            send_routed(self.ctl, ident, frame)

    def close(self) -> None:
        self.confirm.close()
        self.confirmed.close()
