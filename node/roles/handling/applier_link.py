"""The handler's link to its node's applier (a node with a state machine only).

Queries at a read index, `dledger snapshot`, install chunks go to the applier under a tag; its
answers come back here. A follower serving a read (FLAG_ANY_MEMBER) asks the leader for a read
index first (READ_INDEX to the leader's data port)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.wiring import channels
from node.wiring.doorbells import Doorbell

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

QUERY_TIMEOUT_MS = 10_000  # a read forwarded to the applier and not answered by then: TIMEOUT
SNAPSHOT_TIMEOUT_MS = 120_000  # `dledger snapshot` of a large state takes a while


class StateMachineLink:
    """The handler's ends to its node's applier: its doorbell, rung when the committed index
    moves, and the sockets for the results of applied entries and reads at a read index."""

    def __init__(self, hint: Doorbell, results: zmq.Socket, query: zmq.Socket) -> None:
        self.hint, self.results, self.query = hint, results, query

    def committed_moved(self) -> None:
        self.hint.ring()  # the applier also looks at the block on its own timer

    def send_query(self, frame: bytes) -> bool:
        try:
            self.query.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True


@dataclass(slots=True)
class FollowerRead:
    """A client's query this follower serves: waiting for the leader's read index."""

    ident: bytes
    req: P.QueryRequest
    leader_id: str
    deadline_ms: int


class ApplierLink:
    """Requests to the applier by tag, and follower reads."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        # requests forwarded to the applier: tag -> (client ident, request, deadline)
        self.queries: dict[int, tuple[bytes, P.QueryRequest | P.SnapshotRequest | P.InstallRequest, int]] = {}
        self.next_query_tag = 1
        # follower reads (FLAG_ANY_MEMBER): READ_INDEX requests sent to the leader, by tag
        self.follower_reads: dict[int, FollowerRead] = {}

    def on_query(self, ident: bytes, req: P.QueryRequest) -> None:
        """A read of the state machine: sent to the applier at once with the committed index as
        its read index, its answer held until a quorum heartbeat round that started after it
        arrived confirms this leader (`LeaderReads._forward_early`; parked like a linearizable GET until
        this term's NOOP commits); at once under a lease (`read_lease`)."""
        now = self.h.now()
        m = self.h.state.read_member()
        if self.h.sm_link is None:
            self.h.replies.error(ident, req, RC.UNSUPPORTED, "this group has no state machine", m=m)
            return
        if not self.h.leader.leading(m, now):
            if not (req.any_member and self._ask_read_index(ident, req, m, now)):
                self.h.replies.error(ident, req, RC.NOT_LEADER, m=m)
            return
        self.h.reads.linearizable(ident, req, m, now)

    def on_snapshot(self, ident: bytes, req: P.SnapshotRequest) -> None:
        """`dledger snapshot`: this node (any role) snapshots its state machine now."""
        if self.h.sm_link is None:
            self.h.replies.error(ident, req, RC.UNSUPPORTED, "this group has no state machine")
            return
        self.to_applier(ident, req, 0, b"", SNAPSHOT_TIMEOUT_MS, kind=channels.QueryKind.SNAPSHOT)

    def _ask_read_index(self, ident: bytes, req: P.QueryRequest, m: MemberView, now: int) -> bool:
        """Follower read (FLAG_ANY_MEMBER): ask the leader the block names for a
        read index; `on_peer_reply` then sends the query to our applier at that index, which
        answers once it applied it. Everything committed before the read arrived at the
        leader is at or below that index, and every replica's prefix up to it is the same, so
        the answer is as linearizable as the leader's. False: no leader known or reachable."""
        to_peer = getattr(self.h.transport, "to_peer", None)
        leader = self.h.slot_id(m.leader_slot)
        if to_peer is None or m.role != Role.FOLLOWER or not leader or leader == self.h.cfg.id:
            return False
        tag = self.next_query_tag
        self.next_query_tag += 1
        if not to_peer(leader, P.encode(P.ReadIndexRequest(self.h.cfg.group, leader, tag))):
            return False
        self.follower_reads[tag] = FollowerRead(ident, req, leader, now + self.h.read_timeout_ms)
        return True

    def on_peer_reply(self, frame: bytes) -> None:
        """Input: the leader's answer to one of our READ_INDEX requests."""
        try:
            msg = P.decode(frame, max_frame=self.h.cfg.max_frame_size)
        except P.ProtocolError:
            self.h.state.incr("bad_frames")
            return
        fr = self.follower_reads.pop(msg.request_id, None)
        if fr is None:
            return  # timed out already, or not ours
        code = getattr(msg, "code", RC.UNKNOWN)
        if isinstance(msg, P.ReadIndexResponse) and code == RC.SUCCESS:
            self.to_applier(fr.ident, fr.req, msg.read_index, bytes(fr.req.request), QUERY_TIMEOUT_MS)
            return
        if code == RC.SUCCESS:
            code = RC.UNKNOWN  # a success that is not a read index: not an answer we can use
        m = self.h.state.read_member()
        self.h.replies.send(fr.ident, P.error_reply(fr.req, code, group=self.h.cfg.group, term=m.current_term,
                                            leader_id=self.h.slot_id(m.leader_slot),
                                            reason=getattr(msg, "reason", "") or f"read index from {fr.leader_id}"))

    def forward_query(self, ident: bytes, req: P.QueryRequest, m: MemberView) -> None:
        self.to_applier(ident, req, self.h.store.committed_index, bytes(req.request), QUERY_TIMEOUT_MS, m)

    def to_applier(self, ident: bytes, req: P.QueryRequest | P.SnapshotRequest, read_index: int,
                    request: bytes, timeout_ms: int, m: MemberView | None = None,
                    kind: channels.QueryKind = channels.QueryKind.READ) -> int | None:
        """Send a request to the applier under a fresh tag (returned; None: refused, and the
        client answered); its reply (`on_query_reply`) or `timeout_ms` answers the client."""
        tag = self.next_query_tag
        self.next_query_tag += 1
        if not self.h.sm_link.send_query(channels.encode_query(tag, read_index, request, kind)):
            self.h.replies.error(ident, req, RC.LEADER_PENDING_FULL, "the applier is not taking requests", m=m)
            return None
        self.queries[tag] = (ident, req, self.h.now() + timeout_ms)
        return tag

    def on_query_reply(self, frame: bytes) -> None:
        """Input: the applier's answer to a query; held while its read is not confirmed yet
        (`LeaderReads._forward_early`), else sent."""
        got = channels.decode_query_reply(frame)
        if got is None:
            return
        if self.h.reads.early.hold(got[0], got):
            self.h.reads.settle_early(self.h.state.read_member(), self.h.now())  # the round may have landed first
            return
        self.answer_query(got)

    def answer_query(self, got: tuple[int, int, int, bytes]) -> None:
        tag, status, applied, answer = got
        q = self.queries.pop(tag, None)
        if q is None:
            return  # timed out already
        ident, req, _deadline = q
        if isinstance(req, P.InstallRequest):
            self.h.install.on_progress(ident, req, status, answer)
            return
        m = self.h.state.read_member()
        if isinstance(req, P.SnapshotRequest) and status == channels.QUERY_OK:
            last_index, last_term = channels.SNAPSHOT_POSITION.unpack(answer)
            self.h.replies.send(ident, P.SnapshotResponse(RC.SUCCESS, self.h.cfg.group, m.current_term,
                                                  self.h.slot_id(m.leader_slot), last_index, last_term,
                                                  req.request_id))
        elif status == channels.QUERY_OK:
            self.h.replies.send(ident, P.QueryResponse(RC.SUCCESS, self.h.cfg.group, m.current_term,
                                               self.h.slot_id(m.leader_slot), applied, answer, req.request_id))
        elif status == channels.QUERY_UNSUPPORTED:
            self.h.replies.error(ident, req, RC.UNSUPPORTED, answer.decode(errors="replace")[:200], m=m)
        else:
            self.h.replies.error(ident, req, RC.STATE_MACHINE_ERROR, answer.decode(errors="replace")[:200], m=m)

    def expire_queries(self, now: int) -> None:
        if self.follower_reads:
            for tag in [t for t, fr in self.follower_reads.items() if now >= fr.deadline_ms]:
                fr = self.follower_reads.pop(tag)
                self.h.replies.error(fr.ident, fr.req, RC.TIMEOUT,
                                     f"no read index from the leader {fr.leader_id} in time")
        if not self.queries:
            return
        for tag in [t for t, (_i, _r, d) in self.queries.items() if now >= d]:
            ident, req, _d = self.queries.pop(tag)
            self.h.replies.error(ident, req, RC.TIMEOUT, "the state machine did not answer in time")
