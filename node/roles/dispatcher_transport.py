"""The dispatcher's transport: what `Dispatcher` sends through (the simulator gives it its
own, docs/contracts.md C7), and the real one `Dispatcher.run` builds (ZeroMQ to the follower,
the ack checker's doorbell in the node)."""

from __future__ import annotations

from typing import Protocol

import zmq

from ipc.sockets import Redial
from node.wiring import fault_hooks
from node.wiring.doorbells import Doorbell


class DispatcherTransport(Protocol):
    def send(self, frame: bytes) -> bool: ...
    def ack(self, slot: int, match_index: int) -> None: ...


class ZmqDispatcherTransport:
    """The real ends: a DEALER to the follower's data port and the ack checker's doorbell."""

    def __init__(self, sock: zmq.Socket | Redial, ack: Doorbell, peer: str,
                 poller: zmq.Poller | None = None) -> None:
        self.redial = sock if isinstance(sock, Redial) else None
        self.sock = sock.sock if isinstance(sock, Redial) else sock
        self.ack_bell, self.peer, self.poller = ack, peer, poller

    def send(self, frame: bytes) -> bool:
        if fault_hooks.faults.drop_push() or fault_hooks.faults.blocked(self.peer):
            return True  # lost on the wire: the core's timeouts resend
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # follower unreachable (IMMEDIATE)
            if self.redial is not None and (old := self.redial.failed()) is not None:
                if self.poller is not None:  # a refused handshake: made again (ipc.sockets.Redial)
                    self.poller.unregister(old)
                    self.poller.register(self.redial.sock, zmq.POLLIN)
                self.sock = self.redial.sock
            return False
        if self.redial is not None:
            self.redial.sent()
        return True

    def ack(self, slot: int, match_index: int) -> None:
        """Wake the ack checker; the match index itself is in the block (the peer's slot)."""
        self.ack_bell.ring()
