"""The handler role: the store's single writer and the node's data port.

It opens (and so recovers) the store, publishes ledger begin/end/term and the committed index
to the shared block, and serves the data port: client requests and the leader's pushes. Every
frame is untrusted: anything that does not decode, or names another group or member, gets an
error reply with a code and is counted — the loop never dies of input (SPEC §7).

A MULTI frame (several requests in one, from a pipelining client) is served request by request;
consecutive single APPENDs in it share one store write, and replies to a peer that speaks MULTI
are coalesced into one MULTI_RESPONSE per loop turn (`_flush_replies`).

As leader (DLedgerServer.handleAppend): validate in DLedger's order (member, group, leader, not
transferring), refuse with LEADER_PENDING_FULL / DISK_FULL / REQUEST_WITH_EMPTY_BODYS, append
under the member lock (so "I lead term T → append with T → publish the ledger end" cannot
interleave with the elector raising the term or granting a vote), register the reply as
pending under (term, last index), and wake the dispatchers. The ack checker's "quorum moved"
wake-up advances the committed index and completes pending replies; pending replies time out
with WAIT_QUORUM_ACK_TIMEOUT and fail with TERM_CHANGED when leadership is lost (both
indeterminate: the entry may still commit). On becoming leader it appends a NOOP entry, so
entries of earlier terms commit without waiting for a client write (DLedger #305).

As follower (EntryHandler): pushes are answered in order of index. An APPEND whose first index
is ledgerEnd + 1 is stored at once (after Raft's check that the entry before it matches the
leader's); one further ahead waits in a bounded queue keyed by first index (a duplicate key →
REPEATED_PUSH); one already stored is acknowledged if it matches (never stuck on it: DLedger
#331). COMPARE/TRUNCATE/COMMIT are handled immediately — the process never blocks on the queue
(DLedger #282). Once a second queued pushes are checked: a gap that never fills is answered
INCONSISTENT_STATE so the leader compares again. committed = min(leader's commit, the end this
follower has verified against the current leader).

A store that refuses to open (a damaged committed entry) is fatal: exit EXIT_FATAL, and the
supervisor stops the node with that message instead of restarting it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.sockets import (
    data_address,
    dealer,
    drain,
    pub,
    pull,
    recv_routed,
    router,
    send_routed,
    sub,
)
from node import channels
from node.core.replication import decide_compare, follower_commit
from node.member_lock import MemberLock
from node.roles.retention import RetentionService
from node.roles.runtime import EXIT_FATAL, RoleContext, role_main
from node.shared_state import NO_SLOT, monotonic_ms
from node.store import codec
from node.store.base import StoreCorruptError, StoreError
from node.store.layout import LOCK_FILE
from node.store.segment_store import SegmentStore, disk_usage_ratio

MAX_GET_BYTES = 4 << 20
ABNORMAL_CHECK_MS = 1000
DISK_CHECK_MS = 1000
MAX_MULTI_PEERS = 4096


@dataclass(slots=True)
class Pending:
    ident: bytes
    request_id: int
    first_index: int
    positions: list[int] | None  # None for a single APPEND
    pos: int
    deadline_ms: int


@dataclass(slots=True)
class QueuedPush:
    ident: bytes
    req: P.PushRequest
    frame: bytes  # keeps the zero-copy blob alive
    arrived_ms: int


class Handler:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer_ids = self.cfg.peer_ids
        self.peer_map = self.cfg.peer_map
        self.single = len(self.peer_ids) == 1
        self.store = SegmentStore(self.cfg.store_config())
        self.lock = MemberLock(f"{self.cfg.store_dir}/{LOCK_FILE}")
        self.sock: zmq.Socket | None = None
        self.appended_pub: zmq.Socket | None = None
        # leader side
        self.leader_term = -1
        self.pending: OrderedDict[tuple[int, int], Pending] = OrderedDict()
        self.pending_entries = 0
        # follower side
        self.follow_key: tuple[int, int] | None = None  # (term, leader slot) being followed
        self.verified_end = -1  # my log matches the current leader's up to here
        self.queue: dict[int, QueuedPush] = {}
        self.next_abnormal_check = 0
        self.disk_ratio = 0.0  # disk_usage_ratio(store dir), measured at most once a second
        self.disk_full = False
        self.next_disk_check = 0
        self.ctl: zmq.Socket | None = None  # DEALER to the elector's control socket
        self.transfers: dict[int, tuple[bytes, int]] = {}  # forwarded id → (client ident, its id)
        self.next_transfer_id = 1
        self._appended = False
        self.multi_idents: set[bytes] = set()  # peers that speak MULTI: their replies coalesce
        self.outbox: dict[bytes, list[bytes]] = {}  # held replies, sent by _flush_replies
        self.retention = RetentionService(self.cfg, self.store, self.state, self.log)

    # ------------------------------------------------------------------ shared state
    def publish_ledger(self) -> None:
        s = self.store
        self.state.write_ledger(ledger_begin_index=s.ledger_begin_index, ledger_end_index=s.ledger_end_index,
                                ledger_end_term=s.ledger_end_term, committed_index=s.committed_index)

    def _wake_dispatchers(self) -> None:
        """Mark new entries; the loop publishes once per burst of requests (`_flush_wake`).
        On 2 cores every ZeroMQ send costs a context switch to the I/O thread, so one wake-up
        per burst instead of one per append is most of what single appends cost."""
        self._appended = True

    def _flush_wake(self) -> None:
        if self._appended:
            self._appended = False
            try:
                self.appended_pub.send(channels.encode_appended(self.store.ledger_end_index), zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _slot_id(self, slot: int) -> str:
        return self.peer_ids[slot] if 0 <= slot < len(self.peer_ids) else ""

    # ------------------------------------------------------------------ replies
    def _reply(self, ident: bytes, msg: P.Message) -> None:
        if ident in self.multi_idents:
            self.outbox.setdefault(ident, []).append(P.encode(msg))
        else:
            send_routed(self.sock, ident, P.encode(msg))

    def _flush_replies(self) -> None:
        """Send what `_reply` held back for MULTI-speaking peers: one frame per peer (per
        MAX_MULTI_COUNT replies) instead of one per reply. Called before every poll."""
        if not self.outbox:
            return
        for ident, frames in self.outbox.items():
            for i in range(0, len(frames), P.MAX_MULTI_COUNT):
                send_routed(self.sock, ident, P.encode_multi(frames[i:i + P.MAX_MULTI_COUNT], response=True))
        self.outbox.clear()

    def _error(self, ident: bytes, req: P.Message | bytes, code: RC, reason: str = "") -> None:
        m = self.state.read_member()
        self._reply(ident, P.error_reply(req, code, group=self.cfg.group, term=m.current_term,
                                         leader_id=self._slot_id(m.leader_slot), reason=reason))

    def _push_reply(self, ident: bytes, req: P.PushRequest, code: RC, term: int, *, x_term: int = -1,
                    x_index: int = -1) -> None:
        s = self.store
        self._reply(ident, P.PushResponse(code, self.cfg.group, term, self._slot_id(self._leader_slot()),
                                          s.ledger_end_index, s.ledger_begin_index, s.ledger_end_index,
                                          x_term, x_index, req.request_id))

    def _leader_slot(self) -> int:
        return self.follow_key[1] if self.follow_key else NO_SLOT

    # ------------------------------------------------------------------ dispatch
    def handle_frame(self, ident: bytes, frame: bytes) -> None:
        msg = self._decode_checked(ident, frame)
        if msg is None:
            return
        if isinstance(msg, P.Multi):
            self.on_multi(ident, msg)
        else:
            self._serve(ident, msg, frame)

    def _decode_checked(self, ident: bytes, frame: bytes) -> P.Message | None:
        """Decode one frame and check it is a request for this member of this group; anything
        else is answered with an error (and counted) here, and None returned."""
        try:
            msg = P.decode(frame, max_frame=self.cfg.max_frame_size, max_body=self.cfg.max_body_size)
        except P.ProtocolError as e:
            self.state.incr("bad_frames")
            code = RC.UNEXPECTED_ARGUMENT
            self._error(ident, frame, code, str(e)[:200])
            return None
        if isinstance(msg, P.Multi) and not msg.response:
            return msg  # an envelope: its inner frames are checked one by one (on_multi)
        if P.is_response(msg) or not hasattr(msg, "group"):
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNEXPECTED_ARGUMENT, "not a request")
            return None
        if msg.remote_id != self.cfg.id:
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNKNOWN_MEMBER, f"this is {self.cfg.id!r}")
            return None
        if msg.group != self.cfg.group:
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNKNOWN_GROUP, f"this is group {self.cfg.group!r}")
            return None
        return msg

    def _serve(self, ident: bytes, msg: P.Message, frame: bytes) -> None:
        fn = self._dispatch.get(type(msg))
        if fn is None:
            self._error(ident, msg, RC.UNSUPPORTED, f"{type(msg).__name__} is not served on the data port")
            return
        if isinstance(msg, P.PushRequest):
            fn(self, ident, msg, frame)
        else:
            fn(self, ident, msg)

    def on_multi(self, ident: bytes, multi: P.Multi) -> None:
        """Serve each inner request in order; consecutive single APPENDs are written as one
        batch (one lock, one pwritev) but still answered one by one. From now on this peer's
        replies are coalesced into MULTI_RESPONSE frames (`_flush_replies`)."""
        if ident not in self.multi_idents:
            if len(self.multi_idents) >= MAX_MULTI_PEERS:
                self.multi_idents.clear()  # bounded: the others just get plain replies again
            self.multi_idents.add(ident)
        run: list[P.AppendRequest] = []
        for frame in multi.frames:
            msg = self._decode_checked(ident, frame)
            if msg is None:
                continue
            if type(msg) is P.AppendRequest:
                run.append(msg)
                continue
            if run:
                self._append_singles(ident, run)
                run = []
            self._serve(ident, msg, frame)
        if run:
            self._append_singles(ident, run)

    # ------------------------------------------------------------------ client requests
    def on_metadata(self, ident: bytes, req: P.MetadataRequest) -> None:
        m = self.state.read_member()
        led = self.state.read_ledger()
        peers = []
        for slot, pid in enumerate(self.peer_ids):
            host, port = self.peer_map[pid]
            match = led.ledger_end_index if pid == self.cfg.id else self.state.read_peer(slot).match_index
            peers.append(P.PeerInfo(pid, f"{host}:{port}", match))
        self._reply(ident, P.MetadataResponse(
            RC.SUCCESS, self.cfg.group, m.current_term, self._slot_id(m.leader_slot), self.cfg.id,
            Role(m.role), led.ledger_begin_index, led.ledger_end_index, led.committed_index, peers,
            req.request_id))

    def on_get(self, ident: bytes, req: P.GetRequest) -> None:
        """Committed entries only, a range per request (DLedger returns one, unchecked)."""
        m = self.state.read_member()
        if m.role != Role.LEADER or m.current_term != self.leader_term:
            self._error(ident, req, RC.NOT_LEADER)
            return
        self.state.incr("gets")
        s = self.store
        if req.count <= 0 or req.index < 0:
            self._error(ident, req, RC.UNEXPECTED_ARGUMENT, "index must be >= 0 and count > 0")
            return
        if s.ledger_begin_index < 0 or req.index < s.ledger_begin_index or req.index > s.committed_index:
            self._error(ident, req, RC.INDEX_OUT_OF_RANGE,
                        f"committed range is [{s.ledger_begin_index}, {s.committed_index}]")
            return
        parts, i, left, size = [], req.index, min(req.count, s.committed_index - req.index + 1), 0
        try:
            while left > 0 and size < MAX_GET_BYTES:
                blob, n = s.get_raw(i, left, MAX_GET_BYTES - size)
                for _off, _e in codec.iter_entries(blob):  # verify CRCs: never serve garbage
                    pass
                parts.append(bytes(blob))
                size += len(blob)
                i += n
                left -= n
        except (StoreError, codec.CodecError) as e:
            self._error(ident, req, RC[getattr(e, "code_name", "DISK_ERROR")], str(e)[:200])
            return
        self._reply(ident, P.GetResponse(RC.SUCCESS, self.cfg.group, m.current_term,
                                         self._slot_id(m.leader_slot), b"".join(parts), req.request_id))

    def _check_disk(self, now: int) -> None:
        if now >= self.next_disk_check:
            self.next_disk_check = now + DISK_CHECK_MS
            self.disk_ratio = disk_usage_ratio(self.cfg.store_dir)
            self.disk_full = self.disk_ratio > self.cfg.disk_full_ratio

    def _refuse_append(self, n: int) -> tuple[RC, str] | None:
        """DLedger's order of checks for an append of `n` entries; None = admit."""
        m = self.state.read_member()
        if m.role != Role.LEADER or m.current_term != self.leader_term:
            return RC.NOT_LEADER, ""
        if m.transferee_slot != NO_SLOT:
            return RC.LEADER_TRANSFERRING, ""
        if self.pending_entries + n > self.cfg.max_pending_requests:
            return RC.LEADER_PENDING_FULL, ""
        self._check_disk(monotonic_ms())
        if self.disk_full:
            return RC.DISK_FULL, ""
        return None

    def _write_as_leader(self, write):  # noqa: ANN001, ANN202 - write(term) -> store result
        """Run the store write under the member lock, after re-checking this node still leads
        its term, so "I lead term T → append with T → publish the ledger end" cannot interleave
        with the elector raising the term or granting a vote. Returns ((term, result), None)
        or (None, (code, reason))."""
        term = self.leader_term
        try:
            with self.lock:
                m = self.state.read_member()
                if m.role != Role.LEADER or m.current_term != term:
                    return None, (RC.NOT_LEADER, "")
                result = write(term)
                self.publish_ledger()
        except StoreError as e:
            self.state.incr("append_errors")
            return None, (RC[e.code_name], str(e)[:200])
        return (term, result), None

    def _register_appended(self, requests: int, entries: int) -> None:
        """Book-keeping once an append's pending replies are registered."""
        self.state.incr("appends", requests)
        self.state.incr("entries_appended", entries)
        self.pending_entries += entries
        self._wake_dispatchers()
        if self.single:
            self._commit_to(self.store.ledger_end_index)

    def on_append(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest) -> None:
        batch = isinstance(req, P.BatchAppendRequest)
        n = len(req.bodies) if batch else 1
        refused = self._refuse_append(n)
        if refused is None and batch and n == 0:
            refused = RC.REQUEST_WITH_EMPTY_BODYS, ""
        if refused is None:
            store = self.store
            done, refused = self._write_as_leader(
                (lambda t: store.append_batch_raw(req.bodies, t)) if batch else
                (lambda t: store.append_leader(req.body, t)))
        if refused is not None:
            self._error(ident, req, *refused)
            return
        term, r = done
        if batch:
            first, positions = r
            last, pos = first + n - 1, positions[0]
        else:
            first = last = r.index
            positions, pos = None, r.pos
        self.pending[(term, last)] = Pending(ident, req.request_id, first, positions, pos,
                                             monotonic_ms() + self.cfg.max_wait_ack_ms)
        self._register_appended(1, n)

    def _append_singles(self, ident: bytes, reqs: list[P.AppendRequest]) -> None:
        """Several single APPENDs from one MULTI: one store write, one reply each."""
        n = len(reqs)
        refused = self._refuse_append(n)
        if refused is None:
            done, refused = self._write_as_leader(
                lambda t: self.store.append_batch_raw([r.body for r in reqs], t))
        if refused is not None:
            for r in reqs:
                self._error(ident, r, *refused)
            return
        term, (first, positions) = done
        deadline = monotonic_ms() + self.cfg.max_wait_ack_ms
        pending = self.pending
        for i, r in enumerate(reqs):
            pending[(term, first + i)] = Pending(ident, r.request_id, first + i, None, positions[i], deadline)
        self._register_appended(n, n)

    # ------------------------------------------------------------------ commit / pending
    def _commit_to(self, index: int) -> None:
        if index <= self.store.committed_index:
            return
        self.store.set_committed_index(index)
        self.publish_ledger()
        self.state.incr("commits_published")
        committed = self.store.committed_index
        while self.pending:
            (term, last), p = next(iter(self.pending.items()))
            if last > committed:
                break
            self.pending.popitem(last=False)
            self._complete(term, last, p, RC.SUCCESS)

    def _complete(self, term: int, last: int, p: Pending, code: RC) -> None:
        n = len(p.positions) if p.positions is not None else 1
        self.pending_entries -= n
        leader = self.cfg.id if code == RC.SUCCESS else ""
        if code != RC.SUCCESS:
            msg = P.ErrorResponse(code, self.cfg.group, term, leader, "", int(
                P.MsgType.BATCH_APPEND if p.positions is not None else P.MsgType.APPEND), p.request_id)
        elif p.positions is not None:
            msg = P.BatchAppendResponse(code, self.cfg.group, term, leader, p.first_index, p.positions,
                                        p.request_id)
        else:
            msg = P.AppendResponse(code, self.cfg.group, term, leader, last, p.pos, p.request_id)
        self._reply(p.ident, msg)

    def _apply_quorum(self) -> None:
        if self.leader_term < 0:
            return
        q = self.state.read_quorum()
        if q.quorum_term == self.leader_term:
            self._commit_to(min(q.quorum_index, self.store.ledger_end_index))

    def _expire_pending(self, now: int) -> None:
        while self.pending:
            key, p = next(iter(self.pending.items()))
            if p.deadline_ms > now:
                break
            self.pending.popitem(last=False)
            self.state.incr("append_errors")
            self._complete(key[0], key[1], p, RC.WAIT_QUORUM_ACK_TIMEOUT)

    def _fail_all_pending(self) -> None:
        while self.pending:
            (term, last), p = self.pending.popitem(last=False)
            self._complete(term, last, p, RC.TERM_CHANGED)

    # ------------------------------------------------------------------ role changes
    def _sync_role(self) -> None:
        m = self.state.read_member()
        if m.role == Role.LEADER and m.current_term != self.leader_term:
            self._fail_all_pending()
            self._become_leader(m.current_term)
        elif m.role != Role.LEADER and self.leader_term != -1:
            self.log.debug("no longer leader of term %d", self.leader_term)
            self._fail_all_pending()
            self.leader_term = -1
        key = (m.current_term, m.leader_slot) if m.role == Role.FOLLOWER else None
        if key != self.follow_key:
            self.follow_key = key
            self.verified_end = -1
            self._drop_queue(RC.INCONSISTENT_STATE)

    def _become_leader(self, term: int) -> None:
        """Append the new term's NOOP before serving: it commits every earlier entry with it."""
        try:
            with self.lock:
                m = self.state.read_member()
                if m.role != Role.LEADER or m.current_term != term:
                    return
                r = self.store.append_leader(b"", term, codec.MAGIC_NOOP)
                self.publish_ledger()
        except StoreError as e:
            self.log.error("cannot append the NOOP of term %d: %s", term, e)
            return
        self.leader_term = term
        self.log.info("leading term %d from index %d (NOOP)", term, r.index)
        self._wake_dispatchers()
        if self.single:
            self._commit_to(r.index)

    # ------------------------------------------------------------------ follower: pushes
    def on_push(self, ident: bytes, req: P.PushRequest, frame: bytes) -> None:
        self.state.incr("push_requests")
        self._sync_role()
        m = self.state.read_member()
        if req.term != m.current_term:
            self._push_reply(ident, req, RC.INCONSISTENT_TERM, m.current_term)
            return
        if m.role != Role.FOLLOWER:
            self._push_reply(ident, req, RC.NOT_FOLLOWER, m.current_term)
            return
        if self._slot_id(m.leader_slot) != req.leader_id:
            self._push_reply(ident, req, RC.INCONSISTENT_LEADER, m.current_term)
            return
        kind = req.kind
        if kind == P.PushKind.APPEND:
            self._on_push_append(ident, req, frame, m.current_term)
        elif kind == P.PushKind.COMMIT:
            s, pre = self.store, req.pre_log_index
            try:
                if 0 <= s.ledger_begin_index <= pre <= s.ledger_end_index and s.term_at(pre) == req.pre_log_term:
                    self.verified_end = max(self.verified_end, pre)  # we hold the leader's entry
            except StoreError:
                pass
            self._follower_commit(req.commit_index)
            self._push_reply(ident, req, RC.SUCCESS, m.current_term)
        elif kind == P.PushKind.COMPARE:
            self._drop_queue(RC.INCONSISTENT_STATE)
            try:
                a = decide_compare(self.store, req.pre_log_index, req.pre_log_term)
            except StoreError as e:
                self.log.warning("compare at %d failed: %s", req.pre_log_index, e)
                self._push_reply(ident, req, RC.INCONSISTENT_STATE, m.current_term)
                return
            if a.code == RC.SUCCESS:
                self.verified_end = max(self.verified_end, req.pre_log_index)
            self._push_reply(ident, req, a.code, m.current_term, x_term=a.x_term, x_index=a.x_index)
        elif kind == P.PushKind.TRUNCATE:
            self._drop_queue(RC.INCONSISTENT_STATE)
            self._on_truncate(ident, req, m.current_term)
        else:
            self._push_reply(ident, req, RC.UNEXPECTED_ARGUMENT, m.current_term)

    def _on_truncate(self, ident: bytes, req: P.PushRequest, term: int) -> None:
        try:
            with self.lock:
                if not self._still_following(req):
                    self._push_reply(ident, req, RC.INCONSISTENT_TERM, self.state.read_member().current_term)
                    return
                # Idempotent: never cut what this leader's entries already verified (a repeated
                # or late TRUNCATE must not drop entries we acknowledged since).
                cut = max(req.first_index, self.verified_end + 1)
                if cut <= self.store.ledger_end_index:
                    self.log.info("truncating from index %d (leader %s, term %d)", cut,
                                  req.leader_id, req.term)
                    self.store.truncate(cut)
                    self.publish_ledger()
        except StoreError as e:
            self.log.error("truncate(%d) refused: %s", req.first_index, e)
            self._push_reply(ident, req, RC.INCONSISTENT_STATE, term)
            return
        self.verified_end = max(self.verified_end, req.first_index - 1)
        self._push_reply(ident, req, RC.SUCCESS, term)

    def _still_following(self, req: P.PushRequest) -> bool:
        m = self.state.read_member()
        return (m.role == Role.FOLLOWER and m.current_term == req.term
                and self._slot_id(m.leader_slot) == req.leader_id)

    def _on_push_append(self, ident: bytes, req: P.PushRequest, frame: bytes, term: int) -> None:
        end = self.store.ledger_end_index
        first = req.first_index
        if first > end + 1:
            if first in self.queue:
                self._push_reply(ident, req, RC.REPEATED_PUSH, term)
            elif len(self.queue) >= self.cfg.max_pending_pushes:
                self._push_reply(ident, req, RC.PUSH_REQUEST_IS_FULL, term)
            else:
                self.queue[first] = QueuedPush(ident, req, frame, monotonic_ms())
            return
        self._append_now(ident, req, term)
        self._drain_queue(term)

    def _append_now(self, ident: bytes, req: P.PushRequest, term: int) -> None:
        """Store a push that starts at or before ledgerEnd + 1 (skipping what is already here,
        if it matches), then advance the committed index."""
        s = self.store
        blob = memoryview(req.entries)
        recs = req.index_records  # the leader's records: lets the store copy the run verbatim
        first, end = req.first_index, s.ledger_end_index
        try:
            if first <= end:  # a resend overlapping what we have: skip the matching prefix
                off, idx = 0, first
                while idx <= end and off < len(blob):
                    h = codec.decode_header(blob, off)
                    if s.term_at(idx) != h.term:
                        self._push_reply(ident, req, RC.INCONSISTENT_STATE, term)
                        return
                    off += h.size
                    idx += 1
                blob, first, recs = blob[off:], idx, b""
            pre = first - 1
            if pre >= 0 and first == req.first_index and req.pre_log_index == pre:
                if pre < s.ledger_begin_index or s.term_at(pre) != req.pre_log_term:
                    self._push_reply(ident, req, RC.INCONSISTENT_STATE, term)
                    return
            if len(blob):
                with self.lock:
                    if not self._still_following(req):
                        self._push_reply(ident, req, RC.INCONSISTENT_TERM, self.state.read_member().current_term)
                        return
                    s.append_follower(blob, recs)
                    self.verified_end = s.ledger_end_index
                    s.set_committed_index(follower_commit(req.commit_index, self.verified_end, s.committed_index))
                    self.publish_ledger()
            else:
                self.verified_end = max(self.verified_end, min(end, req.first_index + req.count - 1))
                self._follower_commit(req.commit_index)
        except (StoreError, codec.CodecError) as e:
            self.log.warning("push at %d refused: %s", req.first_index, e)
            self._push_reply(ident, req, RC.INCONSISTENT_STATE, term)
            return
        self._push_reply(ident, req, RC.SUCCESS, term)

    def _follower_commit(self, leader_commit: int) -> None:
        s = self.store
        new = follower_commit(leader_commit, self.verified_end, s.committed_index)
        if new > s.committed_index:
            s.set_committed_index(new)
            self.publish_ledger()

    def _drain_queue(self, term: int) -> None:
        while self.queue:
            nxt = self.queue.pop(self.store.ledger_end_index + 1, None)
            if nxt is None:
                return
            self._append_now(nxt.ident, nxt.req, term)

    def _drop_queue(self, code: RC) -> None:
        for q in self.queue.values():
            self._push_reply(q.ident, q.req, code, self.state.read_member().current_term)
        self.queue.clear()

    def _check_abnormal_pushes(self, now: int) -> None:
        """Once a second: pushes waiting for a gap that is not filling get INCONSISTENT_STATE
        (the leader compares again); ones the log has caught up with are answered now."""
        if now < self.next_abnormal_check or not self.queue:
            return
        self.next_abnormal_check = now + ABNORMAL_CHECK_MS
        term = self.state.read_member().current_term
        end = self.store.ledger_end_index
        for first in sorted(self.queue):
            q = self.queue[first]
            if first <= end + 1:
                del self.queue[first]
                self._append_now(q.ident, q.req, term)
                end = self.store.ledger_end_index
            elif now - q.arrived_ms >= self.cfg.max_push_timeout_ms:
                del self.queue[first]
                self._push_reply(q.ident, q.req, RC.INCONSISTENT_STATE, term)

    def on_transfer(self, ident: bytes, req: P.LeadershipTransferRequest) -> None:
        """The elector runs transfers (it owns the member state); we only relay."""
        m = self.state.read_member()
        if m.role != Role.LEADER:
            self._error(ident, req, RC.NOT_LEADER)
            return
        fid = self.next_transfer_id
        self.next_transfer_id += 1
        try:
            self.ctl.send(P.encode(P.LeadershipTransferRequest(req.group, req.remote_id, req.transferee_id,
                                                                req.term, fid)), zmq.NOBLOCK)
        except zmq.Again:  # the elector is restarting: a definite, retryable refusal
            self._error(ident, req, RC.LEADER_TRANSFERRING, "elector unavailable, retry")
            return
        self.transfers[fid] = (ident, req.request_id)

    def _on_transfer_reply(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame)
        except P.ProtocolError:
            return
        dest = self.transfers.pop(msg.request_id, None)
        if dest is not None and isinstance(msg, P.TransferResponse):
            msg.request_id = dest[1]
            self._reply(dest[0], msg)

    _dispatch = {
        P.LeadershipTransferRequest: on_transfer,
        P.MetadataRequest: on_metadata,
        P.GetRequest: on_get,
        P.AppendRequest: on_append,
        P.BatchAppendRequest: on_append,
        P.PushRequest: on_push,
    }

    # ------------------------------------------------------------------ loop
    def _run_retention(self, now: int) -> None:
        """Delete old data files if the disk asks for it (node.roles.retention); a failure is
        logged and retried next pass, never fatal to the handler."""
        self._check_disk(now)  # one measurement serves both DISK_FULL and retention
        try:
            done = self.retention.run_once(now, self.leader_term != -1, self.disk_ratio)
        except (StoreError, OSError) as e:
            self.log.error("retention pass failed: %s", e)
            return
        if done.files:
            self.publish_ledger()

    def _next_wait(self, now: int) -> int:
        due = [now + 500]
        if self.pending:
            due.append(next(iter(self.pending.values())).deadline_ms)
        if self.queue:
            due.append(self.next_abnormal_check)
        return max(1, min(due) - now)

    def run(self) -> None:
        rc = self.rc
        try:
            self.store.open()
        except StoreCorruptError as e:
            self.log.error("%s", e)
            raise SystemExit(EXIT_FATAL) from None
        try:
            self.publish_ledger()
            host, port = self.cfg.address
            self.sock = router(rc.zctx, data_address(host, port), max_msg_size=self.cfg.max_frame_size)
            self.appended_pub = pub(rc.zctx, rc.channel(channels.APPENDED))
            roles = sub(rc.zctx, rc.channel(channels.ROLE))
            commits = pull(rc.zctx, rc.channel(channels.COMMIT))
            self.ctl = dealer(rc.zctx, rc.channel(channels.CONTROL))
            rc.beat()  # first beat = "ledger published": the elector waits for it before voting
            self.log.info("serving on %s:%d; ledger begin=%d end=%d term=%d committed=%d", host, port,
                          self.store.ledger_begin_index, self.store.ledger_end_index,
                          self.store.ledger_end_term, self.store.committed_index)
            poller = zmq.Poller()
            for s in (self.sock, roles, commits, self.ctl, rc.wake_fd):
                poller.register(s, zmq.POLLIN)
            self._sync_role()
            self._flush_wake()
            self._flush_replies()
            while not rc.should_stop():
                now = monotonic_ms()
                events = dict(poller.poll(self._next_wait(now)))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if roles in events:
                    drain(roles)
                # The block is the truth and the wake-up only a hint: re-check every iteration
                # (one seqlock read per burst), or a lost wake-up under steady traffic would
                # leave a leader answering NOT_LEADER about itself.
                self._sync_role()
                if commits in events:
                    drain(commits)
                    self._apply_quorum()
                if self.ctl in events:
                    while True:
                        try:
                            self._on_transfer_reply(self.ctl.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                if self.sock in events:
                    for _ in range(512):  # a burst, then timers and the stop flag
                        try:
                            got = recv_routed(self.sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if got is None:
                            self.state.incr("bad_frames")
                        else:
                            self.handle_frame(*got)
                now = monotonic_ms()
                self._apply_quorum()
                self._expire_pending(now)
                self._check_abnormal_pushes(now)
                if self.retention.due(now):
                    self._run_retention(now)
                self._flush_wake()
                self._flush_replies()
                rc.beat()
        finally:
            self._fail_all_pending()
            if self.sock is not None:
                self._flush_replies()
            self.store.close()



def main() -> int:
    return role_main("handler", lambda rc: Handler(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
