"""The handler's replies: sent at once, or held for a peer that speaks MULTI and sent as one
MULTI_RESPONSE per loop turn (`flush`, called before every poll)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

MAX_MULTI_PEERS = 4096  # peers remembered as speaking MULTI (bounded: the others get plain replies)


class Replies:
    """Every reply of the handler goes through `send` (it is counted for /metrics here)."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.multi_idents: set[bytes] = set()  # peers that speak MULTI: their replies coalesce
        self.outbox: dict[bytes, list[bytes]] = {}  # held replies, sent by `flush`

    def speaks_multi(self, ident: bytes) -> None:
        """From now on this peer's replies are coalesced into MULTI_RESPONSE frames."""
        if ident not in self.multi_idents:
            if len(self.multi_idents) >= MAX_MULTI_PEERS:
                self.multi_idents.clear()  # bounded: the others just get plain replies again
            self.multi_idents.add(ident)

    def send(self, ident: bytes, msg: P.Message) -> None:
        self.h.metrics.requests.count_reply(msg)
        if ident in self.multi_idents:
            self.outbox.setdefault(ident, []).append(P.encode(msg))
        else:
            self.h.transport.reply(ident, P.encode(msg))

    def flush(self) -> None:
        """Send what `send` held back for MULTI-speaking peers: one frame per peer (per
        MAX_MULTI_COUNT replies) instead of one per reply. Called before every poll."""
        if not self.outbox:
            return
        for ident, frames in self.outbox.items():
            for i in range(0, len(frames), P.MAX_MULTI_COUNT):
                self.h.transport.reply(ident, P.encode_multi(frames[i:i + P.MAX_MULTI_COUNT], response=True))
        self.outbox.clear()

    def error(self, ident: bytes, req: P.Message | bytes, code: RC, reason: str = "",
               m: MemberView | None = None) -> None:
        m = m if m is not None else self.h.state.read_member()
        self.send(ident, P.error_reply(req, code, group=self.h.cfg.group, term=m.current_term,
                                         leader_id=self.h.slot_id(m.leader_slot), reason=reason))
