"""Leadership transfer, relayed: the elector runs transfers (it owns the member state); the
handler forwards a client's request on the control socket under its own id and routes the
answer back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role

if TYPE_CHECKING:
    from node.roles.handler import Handler


class TransferRelay:
    """Transfers in flight, by forwarded id."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.transfers: dict[int, tuple[bytes, int]] = {}  # forwarded id → (client ident, its id)
        self.next_transfer_id = 1

    def on_control_frame(self, frame: bytes) -> None:
        """A transfer's answer from the elector: back to the client that asked, under its id."""
        try:
            msg = P.decode(frame)
        except P.ProtocolError:
            return
        dest = self.transfers.pop(msg.request_id, None)
        if dest is not None and isinstance(msg, (P.TransferResponse, P.ErrorResponse)):
            msg.request_id = dest[1]
            self.h.replies.send(dest[0], msg)

    def on_transfer(self, ident: bytes, req: P.LeadershipTransferRequest) -> None:
        """The elector runs transfers (it owns the member state); we only relay."""
        m = self.h.state.read_member()
        if m.role != Role.LEADER:
            self.h.replies.error(ident, req, RC.NOT_LEADER, m=m)
            return
        fid = self.next_transfer_id
        self.next_transfer_id += 1
        frame = P.encode(P.LeadershipTransferRequest(req.group, req.remote_id, req.transferee_id, req.term, fid))
        if not self.h.transport.control(frame):  # the elector is restarting: a definite, retryable refusal
            self.h.replies.error(ident, req, RC.LEADER_TRANSFERRING, "elector unavailable, retry", m=m)
            return
        self.transfers[fid] = (ident, req.request_id)
