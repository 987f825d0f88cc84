"""METADATA: who this node is, what it holds, who leads (and, asked, its status)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.lease import holds_lease
from node.observe.status import node_status
from node.store.term_vote import TermVoteFile

if TYPE_CHECKING:
    from node.roles.handler import Handler


class Metadata:
    """Answers METADATA."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def _durable_term(self) -> int:
        """The term in this node's `currterm`. A member that lost its term/vote state asks
        (want_end_term) for a term at least as high as any this node voted in, and the block's
        term is 0 until this node's elector has read that file and published it: the handler
        answers first (the elector waits for its first beat). Answered with 0, a member
        restarting beside the asker hid the term it had voted in, the asker voted in it again,
        and the group had two leaders in one term (the simulator's lost-disk fault, seed
        11,314). Read only for those questions, a few at a member's start."""
        return TermVoteFile(self.h.cfg.store_dir, tolerate_damage=True).current.term

    def on_metadata(self, ident: bytes, req: P.MetadataRequest) -> None:
        """A LEADER whose lease lapsed reports itself as CANDIDATE without a leader: it is not
        sure it leads any more (a paused or cut-off elector), and clients must not be sent to it."""
        m = self.h.state.read_member()
        led = self.h.state.read_ledger()
        role, leader = Role(m.role), self.h.slot_id(m.leader_slot)
        if role == Role.LEADER and not holds_lease(m.role, m.last_quorum_heartbeat_ms, self.h.now(), self.h.lease):
            role, leader = Role.CANDIDATE, ""
        # The members of the newest configuration (clients learn members added later from
        # here), and this node, a member or not yet (a node that joins).
        table = self.h.configs.slots
        members = [(x.id, x.host, x.port) for x in self.h.configs.latest.members]
        if all(x[0] != self.h.cfg.id for x in members):
            members.append((self.h.cfg.id, *self.h.cfg.address))
        peers = []
        for pid, host, port in members:
            slot = table.slot_of(pid)
            if pid == self.h.cfg.id:
                match = led.ledger_end_index
            else:
                match = self.h.state.read_peer(slot).match_index if slot is not None else -1
            peers.append(P.PeerInfo(pid, f"{host}:{port}", match))
        status = None
        if req.want_status:
            self.h.ledger.check_disk(self.h.now())
            status = node_status(self.h.state, self.h.cfg.store_dir, self.h.ledger.disk_ratio)
            if req.want_config or req.want_end_term:
                c = self.h.configs.latest
                status.configuration = (c.index, c.voters, c.learners)
            if req.want_end_term:  # from the same ledger snapshot as the end index
                status.ledger_end_term = led.ledger_end_term
        term = m.current_term
        if req.want_end_term:
            term = max(term, self._durable_term())
        self.h.replies.send(ident, P.MetadataResponse(
            RC.SUCCESS, self.h.cfg.group, term, leader, self.h.cfg.id,
            role, led.ledger_begin_index, led.ledger_end_index, led.committed_index, peers,
            req.request_id, status))
