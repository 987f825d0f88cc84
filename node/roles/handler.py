"""The handler role: the store's single writer and the node's data port.

It opens (and so recovers) the store, publishes ledger begin/end/term, the committed index and
the store generation to the shared block, and serves the data port: client requests and the
leader's pushes. Every frame is untrusted: anything that does not decode, or names another group
or member, gets an error reply with a code and is counted — the loop never dies of input (SPEC §7).

The Raft rules live in node/core (docs/replication.md); this class does the I/O around them:
* follower side: `node.core.follower.FollowerCore` decides every push on ONE member snapshot
  taken here per request; the handler executes its effects (store writes under the member lock
  after re-checking a fresh snapshot still shows the same leadership, replies, publishing);
* leader side: appends, the term's NOOP and GET act as leader only while the block says LEADER
  *and* the lease holds (`node.core.lease`); pending replies are a `node.core.pending.PendingTable`;
  a linearizable GET waits for a heartbeat round that started after it arrived (contract C4);
* client sessions (exactly-once appends): a leader rebuilds its `node.core.sessions.SessionTable`
  from its log's newest entries when it starts leading, stamps every session append with its
  (session, seq), and answers a retried one with the original index instead of writing it again;
* a leader-side store write that fails with DISK_FULL / DISK_ERROR sets `store_unwritable_ms`
  in the block (the elector steps down), and the NOOP is retried with a backoff — never a hot loop.

A MULTI frame (several requests in one, from a pipelining client) is served request by request;
consecutive single APPENDs in it share one store write, and replies to a peer that speaks MULTI
are coalesced into one MULTI_RESPONSE per loop turn (`_flush_replies`).

I/O is injectable (contract C7): the class builds no socket; `run()` sets a zmq `transport` and
loops calling the input methods (`handle_frame`, `on_commit_wakeup`, `on_control_reply`, `tick`);
the simulator sets its own transport and calls the same methods. Every time is `self.now()`
(`rc.clock`).

A damaged committed range — found by recovery at open, by the scrub of what recovery left
unchecked (one step per loop turn, `_scrub`) or by a GET — goes to `store_damaged`: the store
cuts and records it (`SegmentStore.mark_damaged`) and the handler publishes the repair index
(block `repair_index`), so the elector stops voting and standing until the leader's pushes
have brought the range back (docs/store.md "Repair from peers"). A store that still refuses
to open (a layout this version cannot read) is fatal: `rc.fatal(message)`, and the
supervisor stops the node with that message.
"""

from __future__ import annotations

import errno
import importlib
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.sockets import (
    data_address,
    dealer,
    drain,
    from_source,
    pub,
    pull,
    push,
    recv_routed,
    router,
    send_routed,
    sub,
)
from node import channels
from node.core.follower import (
    FollowerCore,
    ForwardInstall,
    InstallReply,
    Reply,
    SetCommitted,
    StoreAppend,
    StoreReset,
    StoreTruncate,
    same_leadership,
)
from node.core.leader import (
    Admit,
    Duplicate,
    LeaderCore,
    Placement,
    ReadPath,
    Refuse,
    Repeat,
    ReserveIds,
    SessionGranted,
)
from node.core.lease import holds_lease, lease_ms
from node.core.pending import Pending, PendingTable
from node.core.reads import EarlyReads
from node.core.results import AwaitingResults, ResultCache
from node.core.sessions import SessionTable
from node.member_lock import MemberLock
from node.role_metrics import HandlerMetrics, store_end_pos
from node.roles.handler_install import FollowerInstall
from node.roles.retention import RetentionService
from node.roles.runtime import RoleContext, role_main
from node.shared_state import MemberView
from node.status import node_status
from node.store import codec
from node.store.base import CorruptEntry, StoreCorruptError, StoreError
from node.store.layout import LOCK_FILE
from node.store.segment_store import SegmentStore, disk_usage_ratio
from node.store.stamps import session_stamps

MAX_GET_BYTES = 4 << 20
DISK_CHECK_MS = 1000
MAX_MULTI_PEERS = 4096
ROOM_PROBE_MS = 1000  # unwritable store: how often to ask it whether it has room again
QUERY_TIMEOUT_MS = 10_000  # a read forwarded to the applier and not answered by then: TIMEOUT
SNAPSHOT_TIMEOUT_MS = 120_000  # `dledger snapshot` of a large state takes a while
FOLLOWER_APPLY_RUN = 256  # a follower wakes its applier once this many entries committed unapplied
READ_POLL_MS = 5  # parked reads: how often the block is looked at if the elector's wake-up is lost
SCRUB_STEP_BYTES = 1 << 20  # data the scrub checks per step (~1-3 ms of CPU)
SCRUB_DELAY_MS = int(os.environ.get("DLEDGER_SCRUB_DELAY_MS", "5000"))
"""The scrub starts this long after the store opened (the environment variable is for tests
that must reach an unchecked entry through a read before the scrub does)."""
SCRUB_PAUSE_FACTOR = 2  # pause after a scrub step: this many times what the step took
DISK_CODES = frozenset({"DISK_FULL", "DISK_ERROR"})


SESSION_FILE = "sessions"
"""`<term> <counter>`: session ids handed out in that term go up to counter (store dir)."""

class HandlerTransport(Protocol):
    def reply(self, ident: bytes, frame: bytes) -> None: ...
    def appended(self, end: int) -> None: ...
    def control(self, frame: bytes) -> bool: ...
    # Optional (a node with a state machine): a request to another member's data port, whose
    # answer comes back through `Handler.on_peer_reply`. A transport without it (the
    # simulator's) makes follower reads answer NOT_LEADER.
    # def to_peer(self, peer_id: str, frame: bytes) -> bool: ...


class StateMachineLink:
    """The handler's sockets to its node's applier (a node with a state machine only): wake-ups
    when the committed index moves, the results of applied entries, and reads at a read index."""

    def __init__(self, hint: zmq.Socket, results: zmq.Socket, query: zmq.Socket) -> None:
        self.hint, self.results, self.query = hint, results, query

    def committed_moved(self) -> None:
        try:
            self.hint.send(channels.APPLY_MSG, zmq.NOBLOCK)
        except zmq.Again:
            pass  # the applier also looks at the block on its own timer

    def send_query(self, frame: bytes) -> bool:
        try:
            self.query.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True


class ZmqHandlerTransport:
    """The real sockets: the data port ROUTER, the "appended" PUB, the control DEALER and (a
    node with a state machine) one DEALER per other member, for follower reads' read indexes."""

    def __init__(self, sock: zmq.Socket, appended_pub: zmq.Socket, ctl: zmq.Socket,
                 peers: dict[str, zmq.Socket] | None = None) -> None:
        self.sock, self.appended_pub, self.ctl = sock, appended_pub, ctl
        self.peers = peers or {}

    def to_peer(self, peer_id: str, frame: bytes) -> bool:
        """False: not sent (no connection to that member now: IMMEDIATE)."""
        s = self.peers.get(peer_id)
        if s is None:
            return False
        try:
            s.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def reply(self, ident: bytes, frame: bytes) -> None:
        send_routed(self.sock, ident, frame)

    def appended(self, end: int) -> None:
        try:
            self.appended_pub.send(channels.encode_appended(end), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def control(self, frame: bytes) -> bool:
        try:
            self.ctl.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the elector is restarting
            return False
        return True


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


@dataclass(slots=True)
class FollowerRead:
    """A client's query this follower serves: waiting for the leader's read index."""

    ident: bytes
    req: P.QueryRequest
    leader_id: str
    deadline_ms: int


def store_error_code(e: BaseException) -> str:
    """The response-code name for a failed store operation: a StoreError names its own; a bare
    OSError that escaped the store is DISK_FULL for ENOSPC/EDQUOT, DISK_ERROR otherwise."""
    if isinstance(e, StoreError):
        return e.code_name
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "DISK_FULL"
    return "DISK_ERROR"


class Handler(FollowerInstall):
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
        self.transport: HandlerTransport | None = None
        ecfg = self.cfg.election_config()
        self.lease = lease_ms(ecfg)
        self.read_timeout_ms = 2 * ecfg.max_heartbeat_leak * ecfg.heartbeat_interval_ms
        # leader side: the rules and their book-keeping (term, NOOP, pending replies, sessions)
        self.leader = LeaderCore(self.lease, self.read_timeout_ms, self.cfg.read_lease,
                                 self.cfg.max_pending_requests, self.cfg.max_sessions, self.cfg.session_window)
        self.unwritable = False  # mirrors store_unwritable_ms != 0 (we are its only writer)
        self.next_room_probe_ms = 0  # while unwritable: when to ask the store whether it has room
        self.reads: list[ParkedRead] = []
        # state machine (cfg.state_machine): results of applied entries, replies waiting for
        # them, reads forwarded to the applier (tag -> client ident, request, deadline)
        self.sm_link: StateMachineLink | None = None
        self.results = ResultCache()
        self.awaiting = AwaitingResults()
        self.queries: dict[int, tuple[bytes, P.QueryRequest | P.SnapshotRequest | P.InstallRequest, int]] = {}
        self.next_query_tag = 1
        self._hinted_commit = -1
        # follower reads (FLAG_ANY_MEMBER): READ_INDEX requests sent to the leader, by tag
        self.follower_reads: dict[int, FollowerRead] = {}
        # queries sent to the applier on arrival, answers held until leadership is confirmed
        self.early: EarlyReads[tuple[int, int, int, bytes]] = EarlyReads()
        # follower side
        self.follower = FollowerCore(self.peer_ids, self.cfg.max_pending_pushes, self.cfg.max_push_timeout_ms)
        self.disk_ratio = 0.0  # disk_usage_ratio(store dir), measured at most once a second
        self.disk_full = False
        self.next_disk_check = 0
        self.transfers: dict[int, tuple[bytes, int]] = {}  # forwarded id → (client ident, its id)
        self.next_transfer_id = 1
        self._appended = False
        self.multi_idents: set[bytes] = set()  # peers that speak MULTI: their replies coalesce
        self.outbox: dict[bytes, list[bytes]] = {}  # held replies, sent by _flush_replies
        self.retention = RetentionService(self.cfg, self.store, self.state, self.log)
        self._view: MemberView | None = None  # the member snapshot of the last tick
        self.metrics = HandlerMetrics(self.state, self.cfg.max_wait_ack_ms)  # /metrics words
        self._published_repair = -1  # the block's repair_index as last written
        self._damage = None  # see the property
        self._unchecked_published = -1  # unchecked_end_index as last published
        self._next_scrub_ms = 0  # when the scrub's next step is due
        self.scrub_delay_ms = SCRUB_DELAY_MS  # from open to the scrub's first step (a simulator sets 0)

    def now(self) -> int:
        return self.rc.clock()

    # The leader core's book-keeping, under the names tests and the simulator read.
    @property
    def leader_term(self) -> int:
        """The term whose NOOP this handler wrote (it leads that term), -1 if none."""
        return self.leader.leader_term

    @property
    def noop_index(self) -> int:
        return self.leader.noop_index

    @property
    def pending(self) -> PendingTable:
        return self.leader.pending

    @property
    def sessions(self) -> SessionTable:
        return self.leader.sessions

    @property
    def _damage(self) -> tuple[int, str, int] | None:
        """(first damaged index, why, repair target) found by a read, cut once this node no
        longer leads (store_damaged): a leader must not cut its log under its dispatchers."""
        return self._damage_found

    @_damage.setter
    def _damage(self, value: tuple[int, str, int] | None) -> None:
        self._damage_found = value
        self.leader.damaged = value is not None  # no leading while a damaged entry waits

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Open (recover) the store and publish the ledger (with the repair index when recovery
        found damaged committed entries). A store this version cannot read is fatal."""
        try:
            self.store.open()
        except StoreCorruptError as e:
            self.rc.fatal(f"store {self.cfg.store_dir} refuses to open: {e}")
        if self.single and self.store.repair_index >= 0:
            # Nobody to fetch the range from: serving on would hide the loss.
            self.store.close()
            self.rc.fatal(f"store {self.cfg.store_dir}: {self.store.damage or 'committed entries lost'}; "
                          "a one-member group has no peer to repair it from: restore the store from "
                          "a backup or a copy")
        self.retention.store = self.store  # `store` may have been replaced after construction
        self.metrics.watch_store(self.store)
        # Before the ledger is published (and so before this node can lead): a dispatcher
        # checks what it pushes at or below this index, which recovery left unchecked.
        self._unchecked_published = self.store.unchecked_end
        self.state.set("unchecked_end_index", self._unchecked_published)
        self._next_scrub_ms = self.now() + self.scrub_delay_ms
        self.publish_ledger()

    def _scrub(self, now: int) -> None:
        """One step of the scrub of the entries recovery left unchecked (SegmentStore
        .scrub_step, SCRUB_STEP_BYTES, so a request waits at most a few ms for it); damage
        goes to the node's damage path. Publishes `unchecked_end_index` = -1 once done.

        Paced: the first step SCRUB_DELAY_MS after the store opened (the other roles start
        then, on the same cores), and then the pause after each step is SCRUB_PAUSE_FACTOR
        times what the step took (a third of a core at most). Nothing waits for the scrub: an
        unchecked entry is checked by whoever reads it first."""
        if now < self._next_scrub_ms or self._damage is not None:
            return
        t0 = self.now()  # the role's clock, not the wall clock: a simulated run must replay
        try:
            self.store.scrub_step(SCRUB_STEP_BYTES)
        except StoreCorruptError as e:  # names the first bad entry (base.committed_damage)
            self._damaged_at(getattr(e, "index", self.store.unchecked_end), str(e))
        took_ms = self.now() - t0
        self._next_scrub_ms = now + max(1, int(took_ms * SCRUB_PAUSE_FACTOR))
        end = self.store.unchecked_end
        if end != self._unchecked_published:
            self._unchecked_published = end
            self.state.set("unchecked_end_index", end)

    def close(self) -> None:
        self._fail_all_pending()
        self._fail_reads(RC.NOT_LEADER)
        if self.transport is not None:
            self._flush_replies()
        self.store.close()

    # ------------------------------------------------------------------ shared state
    def publish_ledger(self) -> None:
        s = self.store
        self.state.write_ledger(ledger_begin_index=s.ledger_begin_index, ledger_end_index=s.ledger_end_index,
                                ledger_end_term=s.ledger_end_term, committed_index=s.committed_index,
                                store_generation=s.generation)
        repair = getattr(s, "repair_index", -1)
        if self._damage is not None:
            repair = max(repair, self._damage[2])
        if repair != self._published_repair:
            # After the ledger: the elector reads both under the member lock, and a repair
            # that just ended is only ever published together with the ledger that ends it.
            self.state.set("repair_index", repair)
            if repair < 0:
                self.log.warning("store repaired: committed entries up to %d are here again",
                                 self._published_repair)
            else:
                self.log.warning("store repairing: does not vote until entries up to %d are "
                                 "committed here again (committed %d)", repair, s.committed_index)
            self._published_repair = repair
        self.metrics.published(store_end_pos(s))
        if self.sm_link is not None and self._apply_hint_due(s.committed_index):
            self._hinted_commit = s.committed_index
            self.sm_link.committed_moved()

    def store_damaged(self, lo: int, hi: int, why: str) -> None:
        """A read found damage among entries [lo, hi): find the first entry that fails its
        checks and hand it to the store's one damage path (`SegmentStore.mark_damaged`),
        under the member lock like every follower write, then publish: the elector sees
        `repair_index` and steps down / stops voting; the leader's catch-up brings the range
        back. Any other role (or a background check) that finds damage must get it here: the
        handler is the store's one writer. A store that cannot cut there stops the node."""
        s = self.store
        first = -1
        for i in range(max(lo, s.ledger_begin_index), min(hi, s.ledger_end_index + 1)):
            try:
                s.get(i)
            except (StoreError, OSError):
                first = i
                break
        if first < 0:
            return  # a race with a truncation, not damage: the read is simply answered with an error
        self._damaged_at(first, why)

    def _damaged_at(self, first: int, why: str) -> None:
        """Entry `first` is damaged (a read or the scrub said so): record it, publish the repair
        index, and cut once this node no longer leads (`_cut_damage`)."""
        s = self.store
        if self.single:  # nobody to fetch the range from: serving on would hide the loss
            self.rc.fatal(f"store {self.cfg.store_dir}: committed entry {first} is damaged ({why}); a "
                          "one-member group has no peer to repair it from: restore the store from a "
                          "backup or a copy")
        if self._damage is None or first < self._damage[0]:
            self._damage = (first, why, max(s.committed_index, s.ledger_end_index))
        self.log.error("entry %d is damaged (%s): stepping down if leading, then repairing", first, why)
        self.publish_ledger()  # repair_index: the elector stops voting and a leader steps down
        self._fail_all_pending()
        self._cut_damage(self.state.read_member())

    def _cut_damage(self, m: MemberView) -> None:
        """The second half of `store_damaged`, once the block no longer says LEADER (the
        elector stepped down on `repair_index`): cut the log at the damaged entry through the
        store's one damage path. Until then nothing is cut: the dispatchers still read this
        log, and `_leading` is already False so nothing new is written to it."""
        if self._damage is None or m.role == Role.LEADER:
            return
        first, why, _target = self._damage
        try:
            with self.lock:
                self.store.mark_damaged(first, why)
                self._damage = None
                self.publish_ledger()
        except StoreError as e:
            self.rc.fatal(f"store {self.cfg.store_dir}: damaged entry {first} cannot be repaired "
                          f"in place: {e}")

    def _apply_hint_due(self, committed: int) -> bool:
        """Whether to wake the applier for this commit move. A leader's applier: always (its
        results answer appends). A follower's applier need only keep up, not apply each entry
        as it commits: waking it on every push put four more process wake-ups into each put's
        critical path on 2 cores. So a follower hints once FOLLOWER_APPLY_RUN entries piled
        up (the applier's own IDLE_POLL_MS poll bounds the lag otherwise), and at once while
        a read waits on this node (a follower read needs its read index applied promptly)."""
        if committed == self._hinted_commit:
            return False
        return (self.leader_term != -1 or bool(self.queries) or bool(self.follower_reads)
                or committed - self._hinted_commit >= FOLLOWER_APPLY_RUN)

    def _mark_unwritable(self, failed: bool) -> None:
        """Contract C2/C5: tell the elector whether this leader can write (it steps down if not)."""
        if failed:
            self.unwritable = True
            self.state.set("store_unwritable_ms", max(1, self.now()))
        elif self.unwritable:
            self.unwritable = False
            self.state.set("store_unwritable_ms", 0)

    def _probe_room(self, now: int) -> None:
        """While the store is marked unwritable, ask it every ROOM_PROBE_MS whether it has room
        again. Only a leader's successful write used to clear the mark, and a node that stepped
        down for a full disk never leads again to make one: once space was back it still
        refused to stand for ever, and with a second node down the group had no leader (found
        by the simulator's disk-full fault). Follower appends that succeed clear it too."""
        if not self.unwritable or now < self.next_room_probe_ms:
            return
        self.next_room_probe_ms = now + ROOM_PROBE_MS
        if self.store.has_room():
            self.log.info("the store has room again: standing for election again")
            self._mark_unwritable(False)

    def _wake_dispatchers(self) -> None:
        """Mark new entries; the loop publishes once per burst of requests (`_flush_wake`).
        On 2 cores every ZeroMQ send costs a context switch to the I/O thread, so one wake-up
        per burst instead of one per append is most of what single appends cost."""
        self._appended = True

    def _flush_wake(self) -> None:
        if self._appended:
            self._appended = False
            self.transport.appended(self.store.ledger_end_index)

    def _slot_id(self, slot: int) -> str:
        return self.peer_ids[slot] if 0 <= slot < len(self.peer_ids) else ""

    def _leading(self, m: MemberView, now: int) -> bool:
        """Act as leader only while `LeaderCore.leading` says so (LEADER of the term whose NOOP
        we wrote, the lease holds, no damaged entry waiting to be cut)."""
        return self.leader.leading(m, now)

    # ------------------------------------------------------------------ replies
    def _reply(self, ident: bytes, msg: P.Message) -> None:
        self.metrics.requests.count_reply(msg)
        if ident in self.multi_idents:
            self.outbox.setdefault(ident, []).append(P.encode(msg))
        else:
            self.transport.reply(ident, P.encode(msg))

    def _flush_replies(self) -> None:
        """Send what `_reply` held back for MULTI-speaking peers: one frame per peer (per
        MAX_MULTI_COUNT replies) instead of one per reply. Called before every poll."""
        if not self.outbox:
            return
        for ident, frames in self.outbox.items():
            for i in range(0, len(frames), P.MAX_MULTI_COUNT):
                self.transport.reply(ident, P.encode_multi(frames[i:i + P.MAX_MULTI_COUNT], response=True))
        self.outbox.clear()

    def _error(self, ident: bytes, req: P.Message | bytes, code: RC, reason: str = "",
               m: MemberView | None = None) -> None:
        m = m if m is not None else self.state.read_member()
        self._reply(ident, P.error_reply(req, code, group=self.cfg.group, term=m.current_term,
                                         leader_id=self._slot_id(m.leader_slot), reason=reason))

    def _push_reply(self, ident: bytes, req: P.PushRequest, code: RC, term: int, *, x_term: int = -1,
                    x_index: int = -1) -> None:
        s = self.store
        key = self.follower.key
        leader = self._slot_id(key[1]) if key else ""
        self._reply(ident, P.PushResponse(code, self.cfg.group, term, leader, s.ledger_end_index,
                                          s.ledger_begin_index, s.ledger_end_index, x_term, x_index,
                                          req.request_id))

    # ------------------------------------------------------------------ dispatch
    def handle_frame(self, ident: bytes, frame: bytes) -> None:
        """Input: one frame from the data port."""
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
            self._error(ident, frame, RC.UNEXPECTED_ARGUMENT, str(e)[:200])
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
        name = self._dispatch.get(type(msg))
        if name is None:
            self._error(ident, msg, RC.UNSUPPORTED, f"{type(msg).__name__} is not served on the data port")
            return
        # By name, not by function: a method replaced on the class or the instance (a test, a
        # simulator mutation) is what gets called.
        if isinstance(msg, P.PushRequest):
            getattr(self, name)(ident, msg, frame)
        else:
            getattr(self, name)(ident, msg)

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
        """A LEADER whose lease lapsed reports itself as CANDIDATE without a leader: it is not
        sure it leads any more, and clients must not be sent to it (repro t5)."""
        m = self.state.read_member()
        led = self.state.read_ledger()
        role, leader = Role(m.role), self._slot_id(m.leader_slot)
        if role == Role.LEADER and not holds_lease(m.role, m.last_quorum_heartbeat_ms, self.now(), self.lease):
            role, leader = Role.CANDIDATE, ""
        peers = []
        for slot, pid in enumerate(self.peer_ids):
            host, port = self.peer_map[pid]
            match = led.ledger_end_index if pid == self.cfg.id else self.state.read_peer(slot).match_index
            peers.append(P.PeerInfo(pid, f"{host}:{port}", match))
        if req.want_status:
            self._check_disk(self.now())
        self._reply(ident, P.MetadataResponse(
            RC.SUCCESS, self.cfg.group, m.current_term, leader, self.cfg.id,
            role, led.ledger_begin_index, led.ledger_end_index, led.committed_index, peers,
            req.request_id,
            node_status(self.state, self.cfg.store_dir, self.disk_ratio) if req.want_status else None))

    def on_get(self, ident: bytes, req: P.GetRequest) -> None:
        """Committed entries only, a range per request (DLedger returns one, unchecked). A
        linearizable GET is parked until a quorum heartbeat round that started after it arrived
        confirms this leader (`_serve_reads`)."""
        now = self.now()
        m = self.state.read_member()
        if not self._leading(m, now):
            self._error(ident, req, RC.NOT_LEADER, m=m)
            return
        if req.count <= 0 or req.index < 0:
            self._error(ident, req, RC.UNEXPECTED_ARGUMENT, "index must be >= 0 and count > 0", m=m)
            return
        if req.linearizable:
            self._linearizable_read(ident, req, m, now)
            return
        self._serve_get(ident, req, m)

    def _linearizable_read(self, ident: bytes, req: ReadRequest, m: MemberView, now: int) -> None:
        """Serve at once under a lease (`read_lease`), else park the read until a quorum round
        that started after it arrived confirms this leader (C4, `_serve_reads`)."""
        path = self.leader.read_path(m, now, self.store.committed_index, isinstance(req, P.QueryRequest))
        if path is ReadPath.SERVE:
            self._read_now(ident, req, m)
            return
        if path is ReadPath.EARLY and self._forward_early(ident, req, m, now):
            return
        self.reads.append(ParkedRead(ident, req, now, m.current_term, now + self.read_timeout_ms))
        self.transport.control(channels.CONFIRM_LEADERSHIP)  # lost: the next round serves too

    def _forward_early(self, ident: bytes, req: P.QueryRequest, m: MemberView, now: int) -> bool:
        """Send a query to the applier now, at the committed index as its read index, while the
        elector confirms leadership (node/core/reads.py: the two waits overlap); its answer is
        held until a round that started after it arrived lands. Only once this term's NOOP is
        committed (`LeaderCore.read_path` says EARLY). True: sent (or refused and answered)."""
        tag = self._to_applier(ident, req, self.store.committed_index, bytes(req.request), QUERY_TIMEOUT_MS, m)
        if tag is not None:
            self.early.add(tag, now, m.current_term, now + self.read_timeout_ms)
            self.transport.control(channels.CONFIRM_LEADERSHIP)
        return True

    def _read_now(self, ident: bytes, req: ReadRequest, m: MemberView) -> None:
        """Leadership is confirmed for this read: answer a GET from the log, send a query to
        the applier with the committed index as its read index, give a follower that index."""
        if isinstance(req, P.QueryRequest):
            self._forward_query(ident, req, m)
        elif isinstance(req, P.ReadIndexRequest):
            self._reply(ident, P.ReadIndexResponse(RC.SUCCESS, self.cfg.group, m.current_term, self.cfg.id,
                                                   self.store.committed_index, req.request_id))
        else:
            self._serve_get(ident, req, m)

    def _serve_get(self, ident: bytes, req: P.GetRequest, m: MemberView) -> None:
        self.state.incr("gets")
        s = self.store
        if s.ledger_begin_index < 0 or req.index < s.ledger_begin_index or req.index > s.committed_index:
            self._error(ident, req, RC.INDEX_OUT_OF_RANGE,
                        f"committed range is [{s.ledger_begin_index}, {s.committed_index}]", m=m)
            return
        parts, i, left, size = [], req.index, min(req.count, s.committed_index - req.index + 1), 0
        try:
            while left > 0 and size < MAX_GET_BYTES:
                blob, n = s.get_raw(i, left, MAX_GET_BYTES - size)
                # Verify every header and CRC: never serve garbage (entries below the
                # checkpoint may not have been checked since open: docs/store.md "Recovery").
                for k, (_off, e) in enumerate(codec.iter_entries(blob)):
                    if e.index != i + k:
                        raise CorruptEntry(f"entry {i + k}: the data file holds index {e.index} there")
                parts.append(bytes(blob))
                size += len(blob)
                i += n
                left -= n
        except (StoreError, codec.CodecError, OSError) as e:
            if isinstance(e, (CorruptEntry, codec.CodecError)):
                self.store_damaged(i, min(req.index + req.count, s.committed_index + 1), str(e))
                e = StoreError(f"entry damaged on this node, repairing from peers: {e}", "DISK_ERROR")  # noqa: PLW2901
            self._error(ident, req, RC[getattr(e, "code_name", store_error_code(e))], str(e)[:200], m=m)
            return
        self._reply(ident, P.GetResponse(RC.SUCCESS, self.cfg.group, m.current_term,
                                         self._slot_id(m.leader_slot), b"".join(parts), req.request_id))

    def _serve_reads(self, m: MemberView, now: int) -> None:
        """Serve parked linearizable reads on what one member snapshot says
        (`LeaderCore.parked_read`: LEADER of their term with a quorum heartbeat round that
        *started* after they arrived, and this term's NOOP committed); NOT_LEADER when the
        role or term changed; TIMEOUT after ~2 election timeouts."""
        if len(self.early):
            self._settle_early(m, now)
        if not self.reads:
            return
        keep = []
        for r in self.reads:
            # The committed index is read per read: only this process writes it, and serving a
            # read moves nothing a later decision reads.
            path = self.leader.parked_read(r.term, r.arrived_ms, r.deadline_ms, m, now, self.store.committed_index)
            if path is ReadPath.NOT_LEADER:
                self._error(r.ident, r.req, RC.NOT_LEADER, m=m)
            elif path is ReadPath.SERVE:
                self._read_now(r.ident, r.req, m)
            elif path is ReadPath.TIMEOUT:
                self._error(r.ident, r.req, RC.TIMEOUT, "leadership not confirmed in time", m=m)
            else:
                keep.append(r)
        self.reads = keep

    def _settle_early(self, m: MemberView, now: int) -> None:
        """Release the held answers of early-forwarded queries the block now confirms; fail the
        ones whose term is over (NOT_LEADER) or that waited too long (TIMEOUT)."""
        release, failed = self.early.settle(self.leader.leading_term(m), m.last_quorum_heartbeat_ms, now)
        for got in release:
            self._answer_query(got)
        for tag, code in failed:
            q = self.queries.pop(tag, None)
            if q is not None:
                self._error(q[0], q[1], RC[code], "" if code == "NOT_LEADER" else "leadership not confirmed in time",
                            m=m)

    def _fail_reads(self, code: RC) -> None:
        reads, self.reads = self.reads, []
        for r in reads:
            self._error(r.ident, r.req, code)
        for tag in self.early.fail_all():
            q = self.queries.pop(tag, None)
            if q is not None:
                self._error(q[0], q[1], code)

    def _check_disk(self, now: int) -> None:
        if now >= self.next_disk_check:
            self.next_disk_check = now + DISK_CHECK_MS
            try:
                self.disk_ratio = disk_usage_ratio(self.cfg.store_dir)
            except OSError:
                self.disk_ratio = 0.0
            self.disk_full = self.disk_ratio > self.cfg.disk_full_ratio

    def _disk_full_now(self, now: int) -> bool:
        """`LeaderCore`'s capacity probe: the disk measurement, at most once a second."""
        self._check_disk(now)
        return self.disk_full

    def _write_as_leader(self, write: Callable[[int], Any]) -> tuple[tuple[int, Any] | None, tuple[RC, str] | None]:
        """Run the store write under the member lock, after re-checking (fresh snapshot) that this
        node still leads its term with a lease, so "I lead term T → append with T → publish the
        ledger end" cannot interleave with the elector raising the term or granting a vote.
        Returns ((term, result), None) or (None, (code, reason))."""
        term = self.leader_term
        try:
            with self.lock:
                m = self.state.read_member()
                if not self._leading(m, self.now()):
                    return None, (RC.NOT_LEADER, "")
                end0, pos0 = self.store.ledger_end_index, store_end_pos(self.store)
                result = write(term)
                self.publish_ledger()
                self.metrics.wrote(self.store.ledger_end_index - end0, store_end_pos(self.store) - pos0)
        except (StoreError, OSError) as e:
            code = store_error_code(e)
            self.state.incr("append_errors")
            self.log.error("append in term %d failed: %s", term, e)
            if code in DISK_CODES:
                self._mark_unwritable(True)
            return None, (RC[code], str(e)[:200])
        self._mark_unwritable(False)
        return (term, result), None

    def _register_appended(self, requests: int, entries: int) -> None:
        """Book-keeping once an append's pending replies are registered."""
        self.state.incr("appends", requests)
        self.state.incr("entries_appended", entries)
        self._wake_dispatchers()
        if self.single:
            self._commit_to(self.store.ledger_end_index)

    def _answer_refusal(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest,
                        d: Refuse | Duplicate, n: int, m: MemberView, now: int) -> None:
        """Answer an append the core did not admit: a refusal, or a resend with its index."""
        if isinstance(d, Duplicate):
            self._answer_duplicate(ident, req, d.first, n, m, now)
        else:
            self._error(ident, req, d.code, d.reason, m=m)

    def on_append(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest) -> None:
        """A single APPEND or a BATCH: admitted by `LeaderCore.admit` (leadership, the session
        check, then capacity), written under the member lock, answered at commit."""
        batch = isinstance(req, P.BatchAppendRequest)
        n = len(req.bodies) if batch else 1
        now = self.now()
        m = self.state.read_member()
        session, seq = req.session, (req.first_seq if batch else req.seq)
        d = self.leader.admit(m, now, session, seq, n, self._disk_full_now, batch=batch)
        if not isinstance(d, Admit):
            self._answer_refusal(ident, req, d, n, m, now)
            return
        store = self.store
        done, refused = self._write_as_leader(
            (lambda t: store.append_batch_raw(req.bodies, t, session, seq)) if batch else
            (lambda t: store.append_leader(req.body, t, session=session, seq=seq)))
        if refused is not None:
            self._error(ident, req, *refused, m=m)
            return
        term, r = done
        if batch:
            first, positions = r
            last, pos = first + n - 1, positions[0]
        else:
            first = last = r.index
            positions, pos = None, r.pos
        self.sessions.record(session, seq, first, n)
        self.pending.register(term, last, Pending(ident, req.request_id, first, positions, pos,
                                                  now + self.cfg.max_wait_ack_ms,
                                                  no_result=not batch and req.no_result))
        self._register_appended(1, n)

    def _append_singles(self, ident: bytes, reqs: list[P.AppendRequest]) -> None:
        """Several single APPENDs from one MULTI: one store write per run of one session (one
        in all for a client's MULTI), one reply each. Each is decided by
        `LeaderCore.admit_in_frame` in order and answered at once when not admitted; a stamp
        the frame repeats is answered after the writes, as the resend it then is."""
        now = self.now()
        m = self.state.read_member()
        refused = self.leader.refuse_leadership(m, now)
        if refused is not None:
            for r in reqs:
                self._error(ident, r, refused.code, refused.reason, m=m)
            return
        admitted: list[P.AppendRequest] = []
        repeats: list[P.AppendRequest] = []
        span: dict[int, tuple[int, int]] = {}
        for r in reqs:
            d = self.leader.admit_in_frame(span, r.session, r.seq, now, self._disk_full_now)
            if isinstance(d, Admit):
                admitted.append(r)
            elif isinstance(d, Repeat):
                repeats.append(r)
            else:
                self._answer_refusal(ident, r, d, 1, m, now)
        refused = self.leader.refuse_capacity(len(admitted), now, self._disk_full_now) if admitted else None
        if refused is not None:
            for r in admitted:
                self._error(ident, r, refused.code, refused.reason, m=m)
            admitted = []
        start = 0
        for k in range(1, len(admitted) + 1):  # runs of consecutive requests of one session
            if k == len(admitted) or admitted[k].session != admitted[start].session:
                self._write_singles(ident, admitted[start:k], m, now)
                start = k
        for r in repeats:
            d = self.leader.decide_repeat(r.session, r.seq, now, self._disk_full_now)
            self._answer_refusal(ident, r, d, 1, m, now)

    def _write_singles(self, ident: bytes, reqs: list[P.AppendRequest], m: MemberView, now: int) -> None:
        n, session = len(reqs), reqs[0].session
        seqs = [r.seq for r in reqs] if session else 0
        done, refused = self._write_as_leader(
            lambda t: self.store.append_batch_raw([r.body for r in reqs], t, session, seqs))
        if refused is not None:
            for r in reqs:
                self._error(ident, r, *refused, m=m)
            return
        term, (first, positions) = done
        self.sessions.record(session, reqs[0].seq, first, n)
        deadline = now + self.cfg.max_wait_ack_ms
        for i, r in enumerate(reqs):
            self.pending.register(term, first + i, Pending(ident, r.request_id, first + i, None, positions[i],
                                                           deadline, no_result=r.no_result))
        self._register_appended(n, n)

    # ------------------------------------------------------------------ client sessions
    def on_open_session(self, ident: bytes, req: P.OpenSessionRequest) -> None:
        """A new session id: (term mod 2**16, counter), unique among this leader's (only one
        leader opens sessions in a term) and skipping ids its table still holds."""
        now = self.now()
        m = self.state.read_member()
        if not self._leading(m, now):
            self._error(ident, req, RC.NOT_LEADER, m=m)
            return
        step = self.leader.open_session()
        while isinstance(step, ReserveIds):
            if not self._reserve_session_ids(step.upto):
                self._error(ident, req, RC.DISK_ERROR, f"cannot record session ids in {SESSION_FILE}", m=m)
                return
            step = self.leader.reserved(step.upto)
        if isinstance(step, Refuse):
            self._error(ident, req, step.code, step.reason, m=m)
            return
        assert isinstance(step, SessionGranted)
        self._reply(ident, P.OpenSessionResponse(RC.SUCCESS, self.cfg.group, self.leader_term, self.cfg.id,
                                                 step.session, req.request_id))

    def _answer_duplicate(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest, first: int,
                          n: int, m: MemberView, now: int) -> None:
        """Answer a retry with where its entries already are, as the first attempt would have
        been answered: once they are committed. Entries retention already deleted were
        committed (it deletes nothing else): the retry is answered with their index, and with
        -1 for the term and positions it can no longer read."""
        batch = isinstance(req, P.BatchAppendRequest)
        last = first + n - 1
        if first < self.store.ledger_begin_index:
            positions, entry_term = [-1] * n, -1
        else:
            try:
                entries = [self.store.get(i, verify_crc=False) for i in range(first, first + n)]
            except (StoreError, OSError) as e:  # the client knows an attempt may be stored: indeterminate
                self._error(ident, req, RC.INTERNAL_ERROR, f"duplicate of entries {first}..: {e}"[:200], m=m)
                return
            positions, entry_term = [e.pos for e in entries], entries[0].term
        p = Pending(ident, req.request_id, first, positions if batch else None, positions[0],
                    now + self.cfg.max_wait_ack_ms, entry_term=entry_term,
                    no_result=not batch and req.no_result)
        placed = self.leader.place_duplicate(last, n, self.store.committed_index)
        if placed is Placement.COMPLETE:
            self._complete(self.leader_term, last, p, RC.SUCCESS)
        elif placed is Placement.PENDING_FULL:  # retryable: the client resends it under the same stamp
            self._error(ident, req, RC.LEADER_PENDING_FULL, "", m=m)
        else:
            self.pending.register(self.leader_term, last, p)

    def _reserve_session_ids(self, new: int) -> bool:
        """Record, before handing them out, that ids up to counter `new` of this term may be
        in use (`LeaderCore.open_session` says when and how far). Why: a handler that crashes and restarts while its node still
        leads the term starts counting again; ids it handed out whose sessions have not
        appended yet are in no log, so it would hand them out twice (the simulator found two
        writers sharing one session, one answered with the other's index). A process crash
        keeps the page cache, and a node restart starts a new term, so no fsync is needed."""
        path = os.path.join(self.cfg.store_dir, SESSION_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(f"{self.leader_term} {new}\n")
            os.replace(path + ".tmp", path)
        except OSError as e:
            self.log.error("cannot record session ids in %s: %s", path, e)
            return False
        return True

    def _handed_out_session_ids(self) -> int:
        """The counter a handler (re)starting to lead `leader_term` continues from."""
        try:
            with open(os.path.join(self.cfg.store_dir, SESSION_FILE)) as f:
                term, n = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            return 0
        return n if term == self.leader_term else 0

    def _rebuild_sessions(self) -> None:
        """A new leader's session table, from the newest `session_scan_entries` entries."""
        t0 = self.now()
        table: SessionTable | None = self.sessions
        try:
            table.rebuild(session_stamps(self.store, self.cfg.session_scan_entries))
        except (StoreError, OSError, struct.error) as e:  # retries then get SESSION_EXPIRED: indeterminate
            self.log.error("cannot rebuild the client sessions from the log: %s", e)
            table = None
        self.leader.start_sessions(table, self._handed_out_session_ids())
        self.log.info("client sessions: %d known from the newest %d entries (%d ms)", len(self.sessions),
                      min(self.cfg.session_scan_entries, self.store.ledger_end_index + 1), self.now() - t0)

    # ------------------------------------------------------------------ commit / pending
    def _commit_to(self, index: int) -> None:
        if index <= self.store.committed_index:
            return
        self.store.set_committed_index(index)
        self.publish_ledger()
        self.state.incr("commits_published")
        due = self.pending.complete(self.store.committed_index)
        self.metrics.completed(self.now(), due)
        for term, last, p in due:
            self._complete(term, last, p, RC.SUCCESS)

    def _complete(self, term: int, last: int, p: Pending, code: RC) -> None:
        """Answer a pending append. With a state machine, SUCCESS waits for the results of its
        entries (parked in `awaiting` until the applier sends them) — unless the client said it
        wants none (FLAG_NO_RESULT, a KV put whose revision is its index): then at commit, one
        applier round trip sooner. A linearizable read after it still sees it: reads wait for
        their read index (>= this entry) to be applied."""
        results = None
        if code == RC.SUCCESS and self.sm_link is not None and not p.no_result:
            got = self.results.lookup(p.first_index, last)
            if got is None:  # committed, not applied yet: answered with its results later
                self.awaiting.park(term, last, p)
                return
            if isinstance(got, list):
                results = got
            else:
                self.log.debug("results of %d..%d no longer known: answered without them", p.first_index, last)
        self._send_completion(term, last, p, code, results)

    def _send_completion(self, term: int, last: int, p: Pending, code: RC,
                         results: list[bytes | None] | None) -> None:
        leader = self.cfg.id if code == RC.SUCCESS else ""
        if code == RC.SUCCESS and p.entry_term is not None:
            term = p.entry_term  # a recognised retry: the term its entries were written in
        if code != RC.SUCCESS:
            msg = P.ErrorResponse(code, self.cfg.group, term, leader, "", int(
                P.MsgType.BATCH_APPEND if p.positions is not None else P.MsgType.APPEND), p.request_id)
        elif p.positions is not None:
            msg = P.BatchAppendResponse(code, self.cfg.group, term, leader, p.first_index, p.positions,
                                        p.request_id, results)
        else:
            msg = P.AppendResponse(code, self.cfg.group, term, leader, last, p.pos, p.request_id,
                                   results[0] if results else None)
        self._reply(p.ident, msg)

    # ------------------------------------------------------------------ state machine
    def on_results(self, frame: bytes) -> None:
        """Input: the applier's results of a run of applied entries."""
        got = channels.decode_results(frame)
        if got is None:
            self.log.warning("malformed results frame (%d bytes) ignored", len(frame))
            return
        self.results.put(*got)
        for term, last, p, results in self.awaiting.release(self.results):
            self._send_completion(term, last, p, RC.SUCCESS, results)

    def on_query(self, ident: bytes, req: P.QueryRequest) -> None:
        """A read of the state machine: sent to the applier at once with the committed index as
        its read index, its answer held until a quorum heartbeat round that started after it
        arrived confirms this leader (`_forward_early`; parked like a linearizable GET until
        this term's NOOP commits); at once under a lease (`read_lease`)."""
        now = self.now()
        m = self.state.read_member()
        if self.sm_link is None:
            self._error(ident, req, RC.UNSUPPORTED, "this group has no state machine", m=m)
            return
        if not self._leading(m, now):
            if not (req.any_member and self._ask_read_index(ident, req, m, now)):
                self._error(ident, req, RC.NOT_LEADER, m=m)
            return
        self._linearizable_read(ident, req, m, now)

    def on_read_index(self, ident: bytes, req: P.ReadIndexRequest) -> None:
        """A follower serving a client's read asks for a read index: confirmed like a read of
        our own (a heartbeat round that started after it arrived, or the lease with
        `read_lease`), answered with the committed index (`_read_now`)."""
        now = self.now()
        m = self.state.read_member()
        if not self._leading(m, now):
            self._error(ident, req, RC.NOT_LEADER, m=m)
            return
        self._linearizable_read(ident, req, m, now)

    def _ask_read_index(self, ident: bytes, req: P.QueryRequest, m: MemberView, now: int) -> bool:
        """Follower read (issue 11 §5, FLAG_ANY_MEMBER): ask the leader the block names for a
        read index; `on_peer_reply` then sends the query to our applier at that index, which
        answers once it applied it. Everything committed before the read arrived at the
        leader is at or below that index, and every replica's prefix up to it is the same, so
        the answer is as linearizable as the leader's. False: no leader known or reachable."""
        to_peer = getattr(self.transport, "to_peer", None)
        leader = self._slot_id(m.leader_slot)
        if to_peer is None or m.role != Role.FOLLOWER or not leader or leader == self.cfg.id:
            return False
        tag = self.next_query_tag
        self.next_query_tag += 1
        if not to_peer(leader, P.encode(P.ReadIndexRequest(self.cfg.group, leader, tag))):
            return False
        self.follower_reads[tag] = FollowerRead(ident, req, leader, now + self.read_timeout_ms)
        return True

    def on_peer_reply(self, frame: bytes) -> None:
        """Input: the leader's answer to one of our READ_INDEX requests."""
        try:
            msg = P.decode(frame, max_frame=self.cfg.max_frame_size)
        except P.ProtocolError:
            self.state.incr("bad_frames")
            return
        fr = self.follower_reads.pop(msg.request_id, None)
        if fr is None:
            return  # timed out already, or not ours
        code = getattr(msg, "code", RC.UNKNOWN)
        if isinstance(msg, P.ReadIndexResponse) and code == RC.SUCCESS:
            self._to_applier(fr.ident, fr.req, msg.read_index, bytes(fr.req.request), QUERY_TIMEOUT_MS)
            return
        if code == RC.SUCCESS:
            code = RC.UNKNOWN  # a success that is not a read index: not an answer we can use
        m = self.state.read_member()
        self._reply(fr.ident, P.error_reply(fr.req, code, group=self.cfg.group, term=m.current_term,
                                            leader_id=self._slot_id(m.leader_slot),
                                            reason=getattr(msg, "reason", "") or f"read index from {fr.leader_id}"))

    def _forward_query(self, ident: bytes, req: P.QueryRequest, m: MemberView) -> None:
        self._to_applier(ident, req, self.store.committed_index, bytes(req.request), QUERY_TIMEOUT_MS, m)

    def _to_applier(self, ident: bytes, req: P.QueryRequest | P.SnapshotRequest, read_index: int,
                    request: bytes, timeout_ms: int, m: MemberView | None = None) -> int | None:
        """Send a request to the applier under a fresh tag (returned; None: refused, and the
        client answered); its reply (`on_query_reply`) or `timeout_ms` answers the client."""
        tag = self.next_query_tag
        self.next_query_tag += 1
        if not self.sm_link.send_query(channels.encode_query(tag, read_index, request)):
            self._error(ident, req, RC.LEADER_PENDING_FULL, "the applier is not taking requests", m=m)
            return None
        self.queries[tag] = (ident, req, self.now() + timeout_ms)
        return tag

    def on_snapshot(self, ident: bytes, req: P.SnapshotRequest) -> None:
        """`dledger snapshot`: this node (any role) snapshots its state machine now."""
        if self.sm_link is None:
            self._error(ident, req, RC.UNSUPPORTED, "this group has no state machine")
            return
        self._to_applier(ident, req, channels.SNAPSHOT_NOW, b"", SNAPSHOT_TIMEOUT_MS)

    def on_query_reply(self, frame: bytes) -> None:
        """Input: the applier's answer to a query; held while its read is not confirmed yet
        (`_forward_early`), else sent."""
        got = channels.decode_query_reply(frame)
        if got is None:
            return
        if self.early.hold(got[0], got):
            self._settle_early(self.state.read_member(), self.now())  # the round may have landed first
            return
        self._answer_query(got)

    def _answer_query(self, got: tuple[int, int, int, bytes]) -> None:
        tag, status, applied, answer = got
        q = self.queries.pop(tag, None)
        if q is None:
            return  # timed out already
        ident, req, _deadline = q
        if isinstance(req, P.InstallRequest):
            self._on_install_progress(ident, req, status, answer)
            return
        m = self.state.read_member()
        if isinstance(req, P.SnapshotRequest) and status == channels.QUERY_OK:
            last_index, last_term = channels.SNAPSHOT_POSITION.unpack(answer)
            self._reply(ident, P.SnapshotResponse(RC.SUCCESS, self.cfg.group, m.current_term,
                                                  self._slot_id(m.leader_slot), last_index, last_term,
                                                  req.request_id))
        elif status == channels.QUERY_OK:
            self._reply(ident, P.QueryResponse(RC.SUCCESS, self.cfg.group, m.current_term,
                                               self._slot_id(m.leader_slot), applied, answer, req.request_id))
        elif status == channels.QUERY_UNSUPPORTED:
            self._error(ident, req, RC.UNSUPPORTED, answer.decode(errors="replace")[:200], m=m)
        else:
            self._error(ident, req, RC.STATE_MACHINE_ERROR, answer.decode(errors="replace")[:200], m=m)

    def _expire_awaiting(self, now: int) -> None:
        if len(self.awaiting):
            for term, last, p in self.awaiting.stale(now, self.state.get("applied_index")):
                self._send_completion(term, last, p, RC.SUCCESS, None)

    def _expire_queries(self, now: int) -> None:
        if self.follower_reads:
            for tag in [t for t, fr in self.follower_reads.items() if now >= fr.deadline_ms]:
                fr = self.follower_reads.pop(tag)
                self._error(fr.ident, fr.req, RC.TIMEOUT, f"no read index from the leader {fr.leader_id} in time")
        if not self.queries:
            return
        for tag in [t for t, (_i, _r, d) in self.queries.items() if now >= d]:
            ident, req, _d = self.queries.pop(tag)
            self._error(ident, req, RC.TIMEOUT, "the state machine did not answer in time")

    def _apply_quorum(self) -> None:
        if self.leader_term < 0:
            return
        q = self.state.read_quorum()
        if q.quorum_term == self.leader_term:
            self._commit_to(min(q.quorum_index, self.store.ledger_end_index))

    def on_commit_wakeup(self) -> None:
        """Input: the ack checker says the quorum index moved."""
        self._apply_quorum()

    def _expire_pending(self, now: int) -> None:
        for term, last, p in self.pending.expire(now):
            self.state.incr("append_errors")
            self._complete(term, last, p, RC.WAIT_QUORUM_ACK_TIMEOUT)

    def _fail_all_pending(self) -> None:
        for term, last, p in self.pending.fail_all():
            self._complete(term, last, p, RC.TERM_CHANGED)

    # ------------------------------------------------------------------ role changes
    def _sync_role(self, m: MemberView, now: int) -> None:
        """Leader side of one member snapshot: lose leadership (fail pending replies and parked
        reads), or take it by writing the term's NOOP (only while the lease holds, and not
        before the retry time after a failed NOOP)."""
        if self.leader.still_leads(m):
            return
        if self.leader_term != -1:
            self.log.debug("no longer leader of term %d", self.leader_term)
            self._fail_all_pending()
            self._fail_reads(RC.NOT_LEADER)
            self.leader.step_down()
        if self.leader.may_take(m, now):
            self._become_leader(m.current_term, now)

    def sync_role(self) -> None:
        """Input: the elector published a role change (a hint; `tick` also syncs every turn)."""
        self._sync_role(self.state.read_member(), self.now())

    def _become_leader(self, term: int, now: int) -> None:
        """Append the new term's NOOP before serving: it commits every earlier entry with it."""
        try:
            with self.lock:
                m = self.state.read_member()
                if m.current_term != term or not self.leader.holds(m, now):
                    return
                r = self.store.append_leader(b"", term, codec.MAGIC_NOOP)
                self.publish_ledger()
        except (StoreError, OSError) as e:
            code = store_error_code(e)
            backoff = self.leader.noop_failed(now)
            self.log.error("cannot append the NOOP of term %d (%s), retrying in %d ms: %s", term, code,
                           backoff, e)
            if code in DISK_CODES:
                self._mark_unwritable(True)
            return
        self._mark_unwritable(False)
        self.leader.noop_written(term, r.index)
        self.log.info("leading term %d from index %d (NOOP)", term, r.index)
        self._rebuild_sessions()
        self._wake_dispatchers()
        if self.single:
            self._commit_to(r.index)

    # ------------------------------------------------------------------ follower: pushes
    def on_push(self, ident: bytes, req: P.PushRequest, frame: bytes) -> None:
        """One member snapshot for the whole request (repro t3): the core validates and decides
        on it; writes re-check it under the member lock."""
        self.state.incr("push_requests")
        m = self.state.read_member()
        self._execute(self.follower.on_push(ident, req, frame, m, self.now(), self.store), m)
        if req.kind == P.PushKind.APPEND:
            self._drain(m)

    def _drain(self, m: MemberView) -> None:
        """Apply queued pushes the log has reached, one at a time (each depends on the last)."""
        for _ in range(self.cfg.max_pending_pushes + 1):
            effects = self.follower.drain(m, self.store)
            if not effects:
                return
            self._execute(effects, m)

    def _execute(self, effects: list, view: MemberView) -> None:
        """Carry out the follower core's effects in order. A failed `StoreReset` turns the
        `installed` answer after it into an error (the leader tries again)."""
        reset_failed = False
        for e in effects:
            if isinstance(e, InstallReply):
                if reset_failed and e.installed:
                    e = InstallReply(e.ident, e.req, RC.DISK_ERROR, e.term)  # noqa: PLW2901
                self._install_reply(e)
            elif isinstance(e, ForwardInstall):
                self._forward_install(e, view)
            elif isinstance(e, StoreReset):
                reset_failed = not self._store_reset(e, view)
            elif isinstance(e, Reply):
                self._push_reply(e.ident, e.req, e.code, e.term, x_term=e.x_term, x_index=e.x_index)
            elif isinstance(e, SetCommitted):
                self._follower_set_committed(e.index)
            elif isinstance(e, StoreAppend):
                self._store_append(e, view)
            elif isinstance(e, StoreTruncate):
                self._store_truncate(e, view)

    def _follower_set_committed(self, index: int) -> None:
        if index > self.store.committed_index:
            try:
                self.store.set_committed_index(index)
            except (StoreError, OSError) as e:
                self.log.error("cannot record committed index %d: %s", index, e)
                return
            self.publish_ledger()

    def _write_refused(self, e: BaseException, what: str, ident: bytes, req: P.PushRequest,
                       view: MemberView) -> None:
        """A follower-side store write failed: answer with the store's code if it is a disk
        problem (DISK_FULL / DISK_ERROR), else INCONSISTENT_STATE (the leader compares again),
        and forget what was verified."""
        code = store_error_code(e)
        self.log.error("%s refused: %s", what, e)
        self._push_reply(ident, req, RC[code] if code in DISK_CODES else RC.INCONSISTENT_STATE,
                         view.current_term)
        self._execute(self.follower.write_failed(view), view)

    def _store_append(self, e: StoreAppend, view: MemberView) -> None:
        s = self.store
        try:
            with self.lock:
                fresh = self.state.read_member()
                if not same_leadership(view, fresh):
                    self._push_reply(e.ident, e.req, RC.INCONSISTENT_TERM, fresh.current_term)
                    return
                new_end = s.append_follower(e.blob, e.recs, run_crc=e.run_crc)
                committed = self.follower.appended(new_end, e.req.commit_index, s.committed_index)
                if committed > s.committed_index:
                    s.set_committed_index(committed)
                self.publish_ledger()
        except (StoreError, codec.CodecError, OSError) as err:
            self._write_refused(err, f"push at {e.req.first_index}", e.ident, e.req, view)
            return
        self._mark_unwritable(False)  # a write succeeded: the store can be written again
        self._push_reply(e.ident, e.req, RC.SUCCESS, view.current_term)

    def _store_truncate(self, e: StoreTruncate, view: MemberView) -> None:
        try:
            with self.lock:
                fresh = self.state.read_member()
                if not same_leadership(view, fresh):
                    self._push_reply(e.ident, e.req, RC.INCONSISTENT_TERM, fresh.current_term)
                    return
                s = self.store
                if e.cut <= s.ledger_end_index:
                    self.log.info("truncating from index %d (leader %s, term %d)", e.cut,
                                  e.req.leader_id, e.req.term)
                    if (e.cut == s.ledger_begin_index and e.cut > 0 and s.log_base is None
                            and e.base_term >= 0):
                        # The whole log goes, and retention deleted the entry before it: the
                        # empty log begins after that (committed) entry, whose term the leader
                        # sent (FollowerCore TRUNCATE).
                        s.reset_to(e.cut - 1, e.base_term)
                    else:
                        s.truncate(e.cut)
                    self.publish_ledger()
        except (StoreError, OSError) as err:
            self._write_refused(err, f"truncate({e.cut})", e.ident, e.req, view)
            return
        self.follower.truncated(e.req)
        self._push_reply(e.ident, e.req, RC.SUCCESS, view.current_term)

    # ------------------------------------------------------------------ transfer (relay)
    def on_transfer(self, ident: bytes, req: P.LeadershipTransferRequest) -> None:
        """The elector runs transfers (it owns the member state); we only relay."""
        m = self.state.read_member()
        if m.role != Role.LEADER:
            self._error(ident, req, RC.NOT_LEADER, m=m)
            return
        fid = self.next_transfer_id
        self.next_transfer_id += 1
        frame = P.encode(P.LeadershipTransferRequest(req.group, req.remote_id, req.transferee_id, req.term, fid))
        if not self.transport.control(frame):  # the elector is restarting: a definite, retryable refusal
            self._error(ident, req, RC.LEADER_TRANSFERRING, "elector unavailable, retry", m=m)
            return
        self.transfers[fid] = (ident, req.request_id)

    def on_control_reply(self, frame: bytes) -> None:
        """Input: a frame from the elector's control socket: a transfer's answer, or
        LEADERSHIP_CONFIRMED (a quorum round that started after a CONFIRM_LEADERSHIP landed):
        serve the parked reads now, by what the block says (C4), not on the next poll."""
        if frame == channels.LEADERSHIP_CONFIRMED:
            if self.reads or len(self.early):
                self._serve_reads(self.state.read_member(), self.now())
            return
        try:
            msg = P.decode(frame)
        except P.ProtocolError:
            return
        dest = self.transfers.pop(msg.request_id, None)
        if dest is not None and isinstance(msg, P.TransferResponse):
            msg.request_id = dest[1]
            self._reply(dest[0], msg)

    _dispatch = {
        P.LeadershipTransferRequest: "on_transfer",
        P.MetadataRequest: "on_metadata",
        P.GetRequest: "on_get",
        P.AppendRequest: "on_append",
        P.BatchAppendRequest: "on_append",
        P.PushRequest: "on_push",
        P.OpenSessionRequest: "on_open_session",
        P.QueryRequest: "on_query",
        P.SnapshotRequest: "on_snapshot",
        P.InstallRequest: "on_install",
        P.ReadIndexRequest: "on_read_index",
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

    def tick(self) -> None:
        """Everything one loop turn does besides sockets, on one member snapshot: sync the role,
        apply the quorum, expire pending replies, the abnormal-push check, parked reads,
        retention, then flush the wake-up and held replies."""
        now = self.now()
        m = self._view = self.state.read_member()
        self._sync_role(m, now)
        self._cut_damage(m)
        self._apply_quorum()
        self._expire_pending(now)
        self._execute(self.follower.check_abnormal(m, now, self.store), m)
        self._drain(m)
        self._serve_reads(m, now)
        self._expire_queries(now)
        self._expire_awaiting(now)
        self._probe_room(now)
        if self.retention.due(now):
            self._run_retention(now)
        if self._unchecked_published >= 0:
            self._scrub(now)
        self._flush_wake()
        self._flush_replies()
        self.metrics.pending(self.pending.entries)

    def next_wait_ms(self) -> int:
        """How long the loop may sleep before `tick` has something to do without input."""
        now = self.now()
        due = [now + 500]
        d = self.pending.next_deadline()
        if d is not None:
            due.append(d)
        d = self.follower.next_deadline()
        if d is not None:
            due.append(d)
        if self.reads or len(self.early):
            due.append(now + READ_POLL_MS)
        if self.leader.noop_retry_ms > now:
            due.append(self.leader.noop_retry_ms)
        if self._unchecked_published >= 0:
            due.append(self._next_scrub_ms)  # the scrub has work
        if self.unwritable:
            due.append(max(now + 1, self.next_room_probe_ms))
        elif self.leader_term == -1 and self._view is not None and self._view.role == Role.LEADER:
            # A LEADER without a lease (or before its NOOP) learns the lease's renewal from the
            # block only: look again soon.
            due.append(now + READ_POLL_MS)
        return max(1, min(due) - now)

    def _peer_sockets(self) -> dict[str, zmq.Socket]:
        """One DEALER per other member's data port: a follower asks the leader for read
        indexes on them (follower reads). Connected lazily by ZeroMQ; IMMEDIATE, so a send to
        a member that is down fails at once instead of queueing."""
        source = self.cfg.address[0] if self.cfg.connect_from_own_host else None
        out = {}
        for pid in self.peer_ids:
            if pid != self.cfg.id:
                h, p = self.peer_map[pid]
                out[pid] = dealer(self.rc.zctx, from_source(data_address(h, p), source),
                                  max_msg_size=self.cfg.max_frame_size)
        return out

    def run(self) -> None:
        rc = self.rc
        self.open()
        try:
            host, port = self.cfg.address
            sock = router(rc.zctx, data_address(host, port), max_msg_size=self.cfg.max_frame_size)
            appended_pub = pub(rc.zctx, rc.channel(channels.APPENDED))
            roles = sub(rc.zctx, rc.channel(channels.ROLE))
            commits = pull(rc.zctx, rc.channel(channels.COMMIT))
            ctl = dealer(rc.zctx, rc.channel(channels.CONTROL))
            peers = self._peer_sockets() if self.cfg.state_machine else {}
            self.transport = ZmqHandlerTransport(sock, appended_pub, ctl, peers)
            sm_in: list[zmq.Socket] = []
            if self.cfg.state_machine:
                self.sm_link = StateMachineLink(push(rc.zctx, rc.channel(channels.APPLY)),
                                                pull(rc.zctx, rc.channel(channels.RESULTS)),
                                                dealer(rc.zctx, rc.channel(channels.QUERY)))
                sm_in = [self.sm_link.results, self.sm_link.query]
                self.publish_ledger()  # the applier's first wake-up
            rc.beat()  # first beat = "ledger published": the elector waits for it before voting
            # numpy (the push checks) after serving, not before: ~0.1 s less to start; the
            # first push waits for the import only if it comes before it is done.
            threading.Thread(target=importlib.import_module, args=("node.store.push_check",),
                             name="warm-push-check", daemon=True).start()
            self.log.info("serving on %s:%d; ledger begin=%d end=%d term=%d committed=%d", host, port,
                          self.store.ledger_begin_index, self.store.ledger_end_index,
                          self.store.ledger_end_term, self.store.committed_index)
            poller = zmq.Poller()
            for s in (sock, roles, commits, ctl, rc.wake_fd, *sm_in, *peers.values()):
                poller.register(s, zmq.POLLIN)
            self.tick()
            while not rc.should_stop():
                events = dict(poller.poll(self.next_wait_ms()))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if roles in events:
                    drain(roles)
                    self.sync_role()  # before this burst's requests: a new leader's NOOP first
                # The block is the truth and the wake-up only a hint: `tick` re-reads it every
                # iteration (one seqlock read per burst), or a lost wake-up under steady traffic
                # would leave a leader answering NOT_LEADER about itself.
                if commits in events:
                    drain(commits)
                    self.on_commit_wakeup()
                if ctl in events:
                    while True:
                        try:
                            self.on_control_reply(ctl.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                ins = ((sm_in[0], self.on_results), (sm_in[1], self.on_query_reply)) if sm_in else ()
                for s, on in (*ins, *((p, self.on_peer_reply) for p in peers.values())):
                    if s in events:
                        while True:
                            try:
                                on(s.recv(zmq.NOBLOCK))
                            except zmq.Again:
                                break
                if sock in events:
                    for _ in range(512):  # a burst, then timers and the stop flag
                        try:
                            got = recv_routed(sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if got is None:
                            self.state.incr("bad_frames")
                        else:
                            self.handle_frame(*got)
                self.tick()
                rc.beat()
        finally:
            self.close()


def main() -> int:
    return role_main("handler", lambda rc: Handler(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
