"""The leader's linearizable reads: GET, a state-machine query, a follower's READ_INDEX.

A read is answered at the committed index only once leadership is confirmed for it
(`LeaderCore.read_path` / `parked_read`): under a lease read at once; else parked until a quorum
heartbeat round that started after it arrived lands (the elector's LEADERSHIP_CONFIRMED wakes
the handler, and the block is the truth: `serve_parked` decides on one member snapshot). A
query goes to the applier at once and its answer is held (`EarlyReads`) until the round lands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.leader import (
    ReadPath,
)
from node.core.reads import EarlyReads
from node.roles.handling.applier_link import QUERY_TIMEOUT_MS
from node.roles.handling.common import store_error_code
from node.store import codec
from node.store.base import CorruptEntry, StoreError
from node.wiring import channels

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

MAX_GET_BYTES = 4 << 20

ReadRequest = P.GetRequest | P.QueryRequest | P.ReadIndexRequest


@dataclass(slots=True)
class ParkedRead:
    """A linearizable read (a GET, a query, a follower's READ_INDEX) waiting for a quorum
    heartbeat round that started after it arrived."""

    ident: bytes
    req: ReadRequest
    arrived_ms: int
    term: int
    deadline_ms: int


class ReadFailed(Exception):
    """A committed range could not be read here: the code and reason to answer with."""

    def __init__(self, code: RC, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def committed_blob(h: Handler, index: int, count: int, max_bytes: int) -> bytes:
    """Up to `count` committed entries from `index` (at least one, at most ~`max_bytes`), as
    store-format bytes, every header and CRC verified: never serve garbage (entries below the
    checkpoint may not have been checked since open: docs/store.md "Recovery"). A damaged
    entry marks its range for repair from peers (`DamageRepair`) and raises DISK_ERROR; the
    caller makes sure the range is committed and in the log."""
    s = h.store
    parts, i, left, size = [], index, count, 0
    try:
        while left > 0 and size < max_bytes:
            blob, n = s.get_checked(i, left, max_bytes - size)
            parts.append(bytes(blob))
            size += len(blob)
            i += n
            left -= n
    except (StoreError, codec.CodecError, OSError) as e:
        if isinstance(e, (CorruptEntry, codec.CodecError)):
            h.damage.store_damaged(i, min(index + count, s.committed_index + 1), str(e))
            e = StoreError(f"entry damaged on this node, repairing from peers: {e}", "DISK_ERROR")  # noqa: PLW2901
        raise ReadFailed(RC[getattr(e, "code_name", store_error_code(e))], str(e)[:200]) from None
    return b"".join(parts)


class LeaderReads:
    """Parked reads and early-forwarded queries of this leader."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.parked: list[ParkedRead] = []
        # queries sent to the applier on arrival, answers held until leadership is confirmed
        self.early: EarlyReads[tuple[int, int, int, bytes]] = EarlyReads()

    def waiting(self) -> bool:
        """A read waits for leadership to be confirmed (the loop looks at the block soon)."""
        return bool(self.parked) or bool(len(self.early))

    def on_get(self, ident: bytes, req: P.GetRequest) -> None:
        """Committed entries only, a range per request (DLedger returns one, unchecked). A
        linearizable GET is parked until a quorum heartbeat round that started after it arrived
        confirms this leader (`serve_parked`)."""
        now = self.h.now()
        m = self.h.state.read_member()
        if not self.h.leader.leading(m, now):
            self.h.replies.error(ident, req, RC.NOT_LEADER, m=m)
            return
        if req.count <= 0 or req.index < 0:
            self.h.replies.error(ident, req, RC.UNEXPECTED_ARGUMENT, "index must be >= 0 and count > 0", m=m)
            return
        if req.linearizable:
            self.linearizable(ident, req, m, now)
            return
        self._serve_get(ident, req, m)

    def on_read_index(self, ident: bytes, req: P.ReadIndexRequest) -> None:
        """A follower serving a client's read asks for a read index: confirmed like a read of
        our own (a heartbeat round that started after it arrived, or the lease with
        `read_lease`), answered with the committed index (`read_now`)."""
        now = self.h.now()
        m = self.h.state.read_member()
        if not self.h.leader.leading(m, now):
            self.h.replies.error(ident, req, RC.NOT_LEADER, m=m)
            return
        self.linearizable(ident, req, m, now)

    def linearizable(self, ident: bytes, req: ReadRequest, m: MemberView, now: int) -> None:
        """Serve at once under a lease (`read_lease`), else park the read until a quorum round
        that started after it arrived confirms this leader (`serve_parked`)."""
        path = self.h.leader.read_path(m, now, self.h.store.committed_index, isinstance(req, P.QueryRequest))
        if path is ReadPath.SERVE:
            self.read_now(ident, req, m)
            return
        if path is ReadPath.EARLY and self._forward_early(ident, req, m, now):
            return
        self.parked.append(ParkedRead(ident, req, now, m.current_term, now + self.h.read_timeout_ms))
        self.h.transport.control(channels.CONFIRM_LEADERSHIP)  # lost: the next round serves too

    def _forward_early(self, ident: bytes, req: P.QueryRequest, m: MemberView, now: int) -> bool:
        """Send a query to the applier now, at the committed index as its read index, while the
        elector confirms leadership (node/core/reads.py: the two waits overlap); its answer is
        held until a round that started after it arrived lands. Only once this term's NOOP is
        committed (`LeaderCore.read_path` says EARLY). True: sent (or refused and answered)."""
        tag = self.h.applier.to_applier(ident, req, self.h.store.committed_index, bytes(req.request),
                                        QUERY_TIMEOUT_MS, m)
        if tag is not None:
            self.early.add(tag, now, m.current_term, now + self.h.read_timeout_ms)
            self.h.transport.control(channels.CONFIRM_LEADERSHIP)
        return True

    def read_now(self, ident: bytes, req: ReadRequest, m: MemberView) -> None:
        """Leadership is confirmed for this read: answer a GET from the log, send a query to
        the applier with the committed index as its read index, give a follower that index."""
        if isinstance(req, P.QueryRequest):
            self.h.applier.forward_query(ident, req, m)
        elif isinstance(req, P.ReadIndexRequest):
            self.h.replies.send(ident, P.ReadIndexResponse(RC.SUCCESS, self.h.cfg.group, m.current_term, self.h.cfg.id,
                                                   self.h.store.committed_index, req.request_id))
        else:
            self._serve_get(ident, req, m)

    def _serve_get(self, ident: bytes, req: P.GetRequest, m: MemberView) -> None:
        self.h.state.incr("gets")
        s = self.h.store
        if s.ledger_begin_index < 0 or req.index < s.ledger_begin_index or req.index > s.committed_index:
            self.h.replies.error(ident, req, RC.INDEX_OUT_OF_RANGE,
                        f"committed range is [{s.ledger_begin_index}, {s.committed_index}]", m=m)
            return
        try:
            blob = committed_blob(self.h, req.index, min(req.count, s.committed_index - req.index + 1),
                                  MAX_GET_BYTES)
        except ReadFailed as e:
            self.h.replies.error(ident, req, e.code, e.reason, m=m)
            return
        self.h.replies.send(ident, P.GetResponse(RC.SUCCESS, self.h.cfg.group, m.current_term,
                                         self.h.slot_id(m.leader_slot), blob, req.request_id))

    def serve_parked(self, m: MemberView, now: int) -> None:
        """Serve parked linearizable reads on what one member snapshot says
        (`LeaderCore.parked_read`: LEADER of their term with a quorum heartbeat round that
        *started* after they arrived, and this term's NOOP committed); NOT_LEADER when the
        role or term changed; TIMEOUT after ~2 election timeouts."""
        if len(self.early):
            self.settle_early(m, now)
        if not self.parked:
            return
        keep = []
        for r in self.parked:
            # The committed index is read per read: only this process writes it, and serving a
            # read moves nothing a later decision reads.
            path = self.h.leader.parked_read(r.term, r.arrived_ms, r.deadline_ms, m, now, self.h.store.committed_index)
            if path is ReadPath.NOT_LEADER:
                self.h.replies.error(r.ident, r.req, RC.NOT_LEADER, m=m)
            elif path is ReadPath.SERVE:
                self.read_now(r.ident, r.req, m)
            elif path is ReadPath.TIMEOUT:
                self.h.replies.error(r.ident, r.req, RC.TIMEOUT, "leadership not confirmed in time", m=m)
            else:
                keep.append(r)
        self.parked = keep

    def settle_early(self, m: MemberView, now: int) -> None:
        """Release the held answers of early-forwarded queries the block now confirms; fail the
        ones whose term is over (NOT_LEADER) or that waited too long (TIMEOUT)."""
        release, failed = self.early.settle(self.h.leader.leading_term(m), m.last_quorum_heartbeat_ms, now)
        for got in release:
            self.h.applier.answer_query(got)
        for tag, code in failed:
            q = self.h.applier.queries.pop(tag, None)
            if q is not None:
                reason = "" if code == "NOT_LEADER" else "leadership not confirmed in time"
                self.h.replies.error(q[0], q[1], RC[code], reason, m=m)

    def fail_all(self, code: RC) -> None:
        reads, self.parked = self.parked, []
        for r in reads:
            self.h.replies.error(r.ident, r.req, code)
        for tag in self.early.fail_all():
            q = self.h.applier.queries.pop(tag, None)
            if q is not None:
                self.h.replies.error(q[0], q[1], code)
