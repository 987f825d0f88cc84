"""The dispatcher's transport: what `Dispatcher` sends through (the simulator gives it its
own, docs/contracts.md C7), and the real ZeroMQ one `Dispatcher.run` builds."""

from __future__ import annotations

from typing import Protocol

import zmq

from node.wiring import channels, fault_hooks


class DispatcherTransport(Protocol):
    def send(self, frame: bytes) -> bool: ...
    def ack(self, slot: int, match_index: int) -> None: ...


class ZmqDispatcherTransport:
    """The real sockets: a DEALER to the follower's data port and the PUSH to the ack checker."""

    def __init__(self, sock: zmq.Socket, ack: zmq.Socket, peer: str) -> None:
        self.sock, self.ack_sock, self.peer = sock, ack, peer

    def send(self, frame: bytes) -> bool:
        if fault_hooks.faults.drop_push() or fault_hooks.faults.blocked(self.peer):
            return True  # lost on the wire: the core's timeouts resend
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # follower unreachable (IMMEDIATE)
            return False
        return True

    def ack(self, slot: int, match_index: int) -> None:
        try:
            self.ack_sock.send(channels.ACK_MSG.pack(slot, match_index), zmq.NOBLOCK)
        except zmq.Again:
            pass
