"""The handler role: the store's single writer and the node's data port.

It opens (and so recovers) the store, publishes ledger begin/end/term, the committed index and
the store generation to the shared block, and serves the data port: client requests and the
leader's pushes. Every frame is untrusted: anything that does not decode, or names another group
or member, gets an error reply with a code and is counted — the loop never dies of input.

Local clients (a process on this machine with `DLedgerClient(local_store_dir=...)`) send the
same frames through shared-memory links instead of the data port (node/wiring/local_clients.py,
docs/client.md "Local clients"); they are served by the same `handle_frame`.

This module keeps the transport, the frame dispatch and the loop; each job is one part in
`node/roles/handling/`, composed here (each part holds this handler and reaches the others
through it):

| part | module | job |
|---|---|---|
| `replies` | replies.py | replies, coalesced per loop turn for a peer that speaks MULTI |
| `ledger` | ledger.py | publishing the ledger, waking dispatchers and applier, the disk, retention |
| `damage` | damage.py | damaged committed entries: the repair index, the cut, the scrub |
| `leadership` | leadership.py | taking (the term's NOOP) and losing leadership |
| `appends` | appends.py | APPEND / BATCH / MULTI appends as leader |
| `session_ids` | sessions.py | OPEN_SESSION and the session table's rebuild |
| `completion` | completion.py | commit and pending replies, with the state machine's results |
| `reads` | reads.py | linearizable reads: GET, queries, a follower's READ_INDEX |
| `fetches` | fetches.py | FETCH, any role: committed entries, held until they commit (follow) |
| `applier` | applier_link.py | requests to the applier, follower reads |
| `pushes` | pushes.py | the follower side: the leader's pushes |
| `install` | install.py | the follower side of install snapshot |
| `relay` | transfer.py | leadership transfer, relayed to the elector |
| `metadata` | metadata.py | METADATA |
| `configs` | configs.py | the configurations in the log: history, `DIR/configuration`, publishing |
| `member_changes` | member_change.py | a membership change as leader: decide, append, answer at commit |

The Raft rules live in node/core (docs/replication.md): `node.core.leader.LeaderCore` decides
the leader side (admission of appends, reads, NOOP backoff, session ids) and
`node.core.follower.FollowerCore` the follower side, each on ONE member snapshot taken here per
request; the parts execute their decisions (store writes under the member lock after
re-checking a fresh snapshot, replies, publishing).

I/O is injectable: the class builds no socket; `run()` sets a zmq `transport` and loops
calling the input methods (`handle_frame`, `on_commit_wakeup`, `on_control_reply`, `tick`, ...);
the simulator sets its own transport (and store, lock, state-machine link) after construction
and calls the same methods. Every time is `self.now()` (`rc.clock`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Protocol

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.local_link import LOCAL_PRINCIPAL, is_local_ident
from ipc.security import DATA_DOMAIN, authorize, parse_user_id, recv_routed_user
from ipc.sockets import (
    data_address,
    dealer,
    drain,
    from_source,
    recv_routed,
    router,
    send_routed,
)
from node.block.shared_state import MemberView
from node.core.follower import FollowerCore
from node.core.leader import LeaderCore
from node.core.lease import lease_ms
from node.core.pending import PendingTable
from node.core.sessions import SessionTable
from node.core.slots import SlotTable
from node.host.member_lock import MemberLock
from node.observe.role_metrics import HandlerMetrics
from node.roles.handling.appends import LeaderAppends
from node.roles.handling.applier_link import ApplierLink, StateMachineLink
from node.roles.handling.common import store_error_code
from node.roles.handling.completion import Completion
from node.roles.handling.configs import ConfigKeeper
from node.roles.handling.damage import SCRUB_DELAY_MS, DamageRepair
from node.roles.handling.fetches import Fetches
from node.roles.handling.install import FollowerInstall
from node.roles.handling.leadership import Leadership
from node.roles.handling.ledger import FOLLOWER_APPLY_RUN, LedgerPublisher
from node.roles.handling.member_change import MemberChanges
from node.roles.handling.metadata import Metadata
from node.roles.handling.pushes import FollowerPushes
from node.roles.handling.reads import LeaderReads
from node.roles.handling.replies import Replies
from node.roles.handling.sessions import SessionIds
from node.roles.handling.transfer import TransferRelay
from node.roles.retention import RetentionService
from node.roles.runtime import RoleContext, role_main
from node.store.base import StoreCorruptError
from node.store.layout import LOCK_FILE
from node.store.mmap_file import FileSizeMismatch
from node.store.segment_store import SegmentStore
from node.wiring import channels
from node.wiring.doorbells import Doorbell
from node.wiring.local_clients import LocalClients

READ_POLL_MS = 5  # parked reads: how often the block is looked at if the elector's wake-up is lost

__all__ = ["FOLLOWER_APPLY_RUN", "Handler", "HandlerTransport", "StateMachineLink", "ZmqHandlerTransport",
           "main", "store_error_code"]


class HandlerTransport(Protocol):
    def reply(self, ident: bytes, frame: bytes) -> None: ...
    def appended(self, end: int) -> None: ...
    def control(self, frame: bytes) -> bool: ...
    # Optional (a node with a state machine): a request to another member's data port, whose
    # answer comes back through `Handler.on_peer_reply`. A transport without it (the
    # simulator's) makes follower reads answer NOT_LEADER.
    # def to_peer(self, peer_id: str, frame: bytes) -> bool: ...


class ZmqHandlerTransport:
    """The real ends: the data port ROUTER, the "appended" doorbells (one per dispatcher; in a
    1-member group the ack checker's), the control DEALER and (a node with a state machine)
    one DEALER per other member, for follower reads' read indexes."""

    def __init__(self, sock: zmq.Socket, appended: list[Doorbell], ctl: zmq.Socket,
                 peers: dict[str, zmq.Socket] | None = None, local: LocalClients | None = None,
                 confirm: Doorbell | None = None) -> None:
        self.sock, self.appended_bells, self.ctl = sock, appended, ctl
        self.bells_by_slot: dict[int, Doorbell] = {}  # follow_slots: the dispatchers' bells
        # follow_slots: open a follower-read DEALER to a member added later (set by the handler)
        self.dial: Callable[[str, str, int], None] | None = None
        self.peers = peers or {}
        self.confirm = confirm  # CONFIRM_LEADERSHIP as a doorbell (node.wiring.channels)
        self.local = local  # local clients' links (ipc.local_link): their replies go there

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
        if self.local is not None and is_local_ident(ident):
            self.local.reply(ident, frame)
        else:
            send_routed(self.sock, ident, frame)

    def appended(self, end: int) -> None:
        """Wake whoever reads new entries: the end index itself is in the block."""
        for bell in self.appended_bells:
            bell.ring()

    def follow_slots(self, rc: RoleContext, table: SlotTable, self_id: str) -> None:
        """One "appended" doorbell per held slot but this node's (a dispatcher each: members
        added later too, leaving ones until their dispatcher stops), and, with follower reads,
        a DEALER to each member this transport has none for."""
        want = {slot for slot, o in table.held() if o.id != self_id and not o.guest}
        for slot in list(self.bells_by_slot):
            if slot not in want:
                self.bells_by_slot.pop(slot).close()
        for slot in sorted(want - set(self.bells_by_slot)):
            self.bells_by_slot[slot] = rc.bell(channels.APPENDED_BELL, slot)
        self.appended_bells = [self.bells_by_slot[s] for s in sorted(self.bells_by_slot)]
        if self.dial is not None:
            for _, o in table.held():
                if o.id != self_id and not o.leaving and not o.guest and o.id not in self.peers:
                    self.dial(o.id, o.host, o.port)

    def control(self, frame: bytes) -> bool:
        if frame == channels.CONFIRM_LEADERSHIP and self.confirm is not None:
            self.confirm.ring()
            return True
        try:
            self.ctl.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the elector is restarting
            return False
        return True


class Handler:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer_ids = self.cfg.peer_ids
        # Who sent the frame being handled (`ipc.security.parse_user_id` of its ZAP User-Id);
        # None: plain mode, or a caller without a network (the simulator, unit tests).
        self.principal: tuple[str, str, str] | None = None
        self.peer_map = self.cfg.peer_map
        self.single = len(self.peer_ids) == 1
        self._push_check_warming = False  # _warm_push_check started (once per process)
        # store, lock, transport and sm_link: a simulator replaces them after construction, so
        # the parts read them from here at each use.
        self.store = SegmentStore(self.cfg.store_config())
        self.lock = MemberLock(f"{self.cfg.store_dir}/{LOCK_FILE}")
        self.transport: HandlerTransport | None = None
        self.sm_link: StateMachineLink | None = None  # a node with a state machine only
        ecfg = self.cfg.election_config()
        self.lease = lease_ms(ecfg)
        self.read_timeout_ms = 2 * ecfg.max_heartbeat_leak * ecfg.heartbeat_interval_ms
        # the rules: leader side (term, NOOP, pending replies, sessions) and follower side
        self.leader = LeaderCore(self.lease, self.read_timeout_ms, self.cfg.read_lease,
                                 self.cfg.max_pending_requests, self.cfg.max_sessions, self.cfg.session_window)
        self.follower = FollowerCore(self.peer_ids, self.cfg.max_pending_pushes, self.cfg.max_push_timeout_ms)
        self.retention = RetentionService(self.cfg, self.store, self.state, self.log, rc.wall_clock, rc.clock)
        self.metrics = HandlerMetrics(self.state, self.cfg.max_wait_ack_ms)  # /metrics words
        self._view: MemberView | None = None  # the member snapshot of the last tick
        self.scrub_delay_ms = SCRUB_DELAY_MS  # from open to the scrub's first step (a simulator sets 0)
        # the parts (node/roles/handling), one job each
        self.replies = Replies(self)
        self.ledger = LedgerPublisher(self)
        self.damage = DamageRepair(self)
        self.leadership = Leadership(self)
        self.appends = LeaderAppends(self)
        self.session_ids = SessionIds(self)
        self.completion = Completion(self)
        self.reads = LeaderReads(self)
        self.fetches = Fetches(self)
        self.applier = ApplierLink(self)
        self.pushes = FollowerPushes(self)
        self.install = FollowerInstall(self)
        self.relay = TransferRelay(self)
        self.metadata = Metadata(self)
        self.configs = ConfigKeeper(self)
        self.retention.slot_table = lambda: self.configs.slots
        self.follower._slot_id = self.slot_id  # leader slots named by the node's slot table
        self.member_changes = MemberChanges(self)

    def now(self) -> int:
        return self.rc.clock()

    def slot_id(self, slot: int) -> str:
        """The member id of a block slot ("" for none), from the node's slot table: as this
        handler last read or wrote it (`tick` re-reads it when the file moved: the elector gave
        a guest leader a slot, the supervisor released one; node/core/slots.py)."""
        got = self.configs.slots.id_of(slot)
        if not got and slot >= 0 and self.configs.refresh_slots():
            got = self.configs.slots.id_of(slot)
        return got

    def slots_changed(self, table: SlotTable) -> None:
        """The slot table moved (a member added or leaving, a slot released): the follower's
        leader-slot names, and on a real node the dispatchers' doorbells and the follower-read
        sockets follow it."""
        self.follower.peer_ids = [table.id_of(i) for i in range(len(table.owners))]
        t = self.transport
        if isinstance(t, ZmqHandlerTransport) and not self.single:
            t.follow_slots(self.rc, table, self.cfg.id)

    # Book-keeping of the parts, under the names tests and the simulator read.
    @property
    def leader_term(self) -> int:
        """The term whose NOOP this handler wrote (it leads that term), -1 if none."""
        return self.leader.leader_term

    @property
    def pending(self) -> PendingTable:
        return self.leader.pending

    @property
    def sessions(self) -> SessionTable:
        return self.leader.sessions

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Open (recover) the store and publish the ledger (with the repair index when recovery
        found damaged committed entries). A store this version cannot read is fatal."""
        try:
            self.store.open()
        except (StoreCorruptError, FileSizeMismatch) as e:
            self.rc.fatal(f"store {self.cfg.store_dir} refuses to open: {e}")
        if self.single and self.store.repair_index >= 0:
            # Nobody to fetch the range from: serving on would hide the loss.
            self.store.close()
            self.rc.fatal(f"store {self.cfg.store_dir}: {self.store.damage or 'committed entries lost'}; "
                          "a one-member group has no peer to repair it from: restore the store from "
                          "a backup or a copy")
        self.retention.store = self.store  # `store` may have been replaced after construction
        self.metrics.watch_store(self.store)
        self.configs.opened()
        self.damage.opened(self.store.unchecked_end, self.now())
        self.publish_ledger()

    def close(self) -> None:
        self.completion.fail_all()
        self.reads.fail_all(RC.NOT_LEADER)
        if self.transport is not None:
            self.replies.flush()
        self.store.close()

    # ------------------------------------------------------------------ inputs besides frames
    def publish_ledger(self) -> None:
        """Publish the store's ledger (and repair index) to the block."""
        self.ledger.publish()

    def store_damaged(self, lo: int, hi: int, why: str) -> None:
        """A read found damage among entries [lo, hi): the store's one damage path."""
        self.damage.store_damaged(lo, hi, why)

    def sync_role(self) -> None:
        """Input: the elector published a role change (a hint; `tick` also syncs every turn)."""
        member = self.state.read_member()
        self.leadership.sync(member, self.now())
        if member.role == Role.FOLLOWER and not self._push_check_warming:
            self._warm_push_check()

    def _warm_push_check(self) -> None:
        """Import numpy (the follower's push checks, node/store/push_check.py) in the background
        once this node first follows a leader, not at start: three nodes starting together on
        two cores spent ~0.1 s of CPU each on it while they were electing their first leader
        (docs/performance.md "Start time"). The first push waits for the import only if it comes
        before the import is done (the store imports the module on first use); a leader never
        needs it."""
        self._push_check_warming = True
        threading.Thread(target=importlib.import_module, args=("node.store.push_check",),
                         name="warm-push-check", daemon=True).start()

    def on_commit_wakeup(self) -> None:
        """Input: the ack checker says the quorum index moved."""
        self.completion.apply_quorum()

    def on_results(self, frame: bytes) -> None:
        """Input: the applier's results of a run of applied entries."""
        self.completion.on_results(frame)

    def on_query_reply(self, frame: bytes) -> None:
        """Input: the applier's answer to a request."""
        self.applier.on_query_reply(frame)

    def on_peer_reply(self, frame: bytes) -> None:
        """Input: the leader's answer to one of our READ_INDEX requests."""
        self.applier.on_peer_reply(frame)

    def on_control_reply(self, frame: bytes) -> None:
        """Input: a frame from the elector's control socket: a transfer's answer, or
        LEADERSHIP_CONFIRMED (a quorum round that started after a CONFIRM_LEADERSHIP landed):
        serve the parked reads now, by what the block says, not on the next poll."""
        if frame == channels.LEADERSHIP_CONFIRMED:
            if self.reads.waiting():
                self.reads.serve_parked(self.state.read_member(), self.now())
            return
        self.relay.on_control_frame(frame)

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
            self.replies.error(ident, frame, RC.UNEXPECTED_ARGUMENT, str(e)[:200])
            return None
        if isinstance(msg, P.Multi) and not msg.response:
            return msg  # an envelope: its inner frames are checked one by one (on_multi)
        if P.is_response(msg) or not hasattr(msg, "group"):
            self.state.incr("bad_frames")
            self.replies.error(ident, msg, RC.UNEXPECTED_ARGUMENT, "not a request")
            return None
        if msg.remote_id != self.cfg.id:
            self.state.incr("bad_frames")
            self.replies.error(ident, msg, RC.UNKNOWN_MEMBER, f"this is {self.cfg.id!r}")
            return None
        if msg.group != self.cfg.group:
            self.state.incr("bad_frames")
            self.replies.error(ident, msg, RC.UNKNOWN_GROUP, f"this is group {self.cfg.group!r}")
            return None
        refused = authorize(self.principal, msg)
        if refused is not None:
            self.state.incr("bad_frames")
            self.replies.error(ident, msg, RC.PERMISSION_DENIED, refused)
            return None
        return msg

    def _serve(self, ident: bytes, msg: P.Message, frame: bytes) -> None:
        route = self._dispatch.get(type(msg))
        if route is None:
            self.replies.error(ident, msg, RC.UNSUPPORTED, f"{type(msg).__name__} is not served on the data port")
            return
        # By name, not by function: a method replaced on the part's class or instance (a test,
        # a simulator mutation) is what gets called.
        serve = getattr(getattr(self, route[0]), route[1])
        if isinstance(msg, P.PushRequest):
            serve(ident, msg, frame)
        else:
            serve(ident, msg)

    def on_multi(self, ident: bytes, multi: P.Multi) -> None:
        """Serve each inner request in order; consecutive single APPENDs are written as one
        batch (one lock, one pwritev) but still answered one by one. From now on this peer's
        replies are coalesced into MULTI_RESPONSE frames (`Replies.flush`)."""
        self.replies.speaks_multi(ident)
        run: list[P.AppendRequest] = []
        for frame in multi.frames:
            msg = self._decode_checked(ident, frame)
            if msg is None:
                continue
            if type(msg) is P.AppendRequest:
                run.append(msg)
                continue
            if run:
                self.appends.append_singles(ident, run)
                run = []
            self._serve(ident, msg, frame)
        if run:
            self.appends.append_singles(ident, run)

    _dispatch = {  # request type -> (part, method)
        P.LeadershipTransferRequest: ("relay", "on_transfer"),
        P.MetadataRequest: ("metadata", "on_metadata"),
        P.GetRequest: ("reads", "on_get"),
        P.AppendRequest: ("appends", "on_append"),
        P.BatchAppendRequest: ("appends", "on_append"),
        P.PushRequest: ("pushes", "on_push"),
        P.OpenSessionRequest: ("session_ids", "on_open_session"),
        P.QueryRequest: ("applier", "on_query"),
        P.SnapshotRequest: ("applier", "on_snapshot"),
        P.InstallRequest: ("install", "on_install"),
        P.ReadIndexRequest: ("reads", "on_read_index"),
        P.FetchRequest: ("fetches", "on_fetch"),
        P.MemberChangeRequest: ("member_changes", "on_member_change"),
    }

    # ------------------------------------------------------------------ loop
    def tick(self) -> None:
        """Everything one loop turn does besides sockets, on one member snapshot: sync the role,
        apply the quorum, expire pending replies, the abnormal-push check, parked reads,
        held fetches, retention, then flush the wake-up and held replies."""
        now = self.now()
        self.configs.refresh_slots()  # a stat: the elector or the supervisor moved the table
        m = self._view = self.state.read_member()
        self.leadership.sync(m, now)
        self.damage.cut(m)
        self.completion.apply_quorum()
        self.completion.expire_pending(now)
        self.pushes.execute(self.follower.check_abnormal(m, now, self.store), m)
        self.pushes.drain(m)
        self.reads.serve_parked(m, now)
        self.fetches.release(m, now)
        self.applier.expire_queries(now)
        self.completion.expire_awaiting(now)
        self.ledger.probe_room(now)
        if self.retention.due(now):
            self.ledger.run_retention(now)
        if self.damage.unchecked_published >= 0:
            self.damage.scrub(now)
        self.ledger.flush_wake()
        self.replies.flush()
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
        d = self.fetches.next_deadline()
        if d is not None:
            due.append(d)
        if self.reads.waiting():
            due.append(now + READ_POLL_MS)
        if self.leader.noop_retry_ms > now:
            due.append(self.leader.noop_retry_ms)
        if self.damage.unchecked_published >= 0:
            due.append(self.damage.next_scrub_ms)  # the scrub has work
        if self.ledger.unwritable:
            due.append(max(now + 1, self.ledger.next_room_probe_ms))
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
                                  max_msg_size=self.cfg.max_frame_size, curve=self.rc.peer_curve(pid))
        return out

    def _dial_peer(self, peers: dict[str, zmq.Socket], poller: zmq.Poller, peer_id: str,
                   host: str, port: int) -> None:
        """A follower-read DEALER to a member added after this handler started."""
        source = self.cfg.address[0] if self.cfg.connect_from_own_host else None
        s = dealer(self.rc.zctx, from_source(data_address(host, port), source),
                   max_msg_size=self.cfg.max_frame_size, curve=self.rc.peer_curve(peer_id))
        peers[peer_id] = s
        poller.register(s, zmq.POLLIN)

    def run(self) -> None:
        rc = self.rc
        self.open()
        bells: list[Doorbell] = []  # every doorbell end this loop opened, closed at the end
        try:
            host, port = self.cfg.address
            sock = router(rc.zctx, data_address(host, port), max_msg_size=self.cfg.max_frame_size,
                          curve=rc.curve_server(DATA_DOMAIN))
            # New entries wake each dispatcher; in a 1-member group the ack checker, whose
            # quorum is this node's own end. (With followers the ack checker need not wake on
            # an append: a follower acknowledges only what a dispatcher read after the ledger
            # end it covers was published, so the ack's ring comes after.)
            wakes = [rc.bell(channels.ACK_BELL)] if self.single else []
            commits = rc.bell(channels.COMMIT_BELL)
            bells += [*wakes, commits]
            roles = rc.open(channels.ROLE)
            ctl = rc.open(channels.CONTROL)
            peers = self._peer_sockets() if self.cfg.state_machine else {}
            local_bell = rc.bell(channels.LOCAL_BELL)
            confirm, confirmed = rc.bell(channels.CONFIRM_BELL), rc.bell(channels.CONFIRMED_BELL)
            bells += [local_bell, confirm, confirmed]
            local = LocalClients(rc.run_dir, self.log)
            self.transport = ZmqHandlerTransport(sock, wakes, ctl, peers, local, confirm)
            poller = zmq.Poller()
            if self.cfg.state_machine:
                self.transport.dial = lambda pid, h, p: self._dial_peer(peers, poller, pid, h, p)
            if not self.single:  # a dispatcher per held slot (node.wiring.slot_file)
                self.transport.follow_slots(rc, self.configs.slots, self.cfg.id)
            sm_in: list[zmq.Socket] = []
            if self.cfg.state_machine:
                apply_bell = rc.bell(channels.APPLY_BELL)
                bells.append(apply_bell)
                self.sm_link = StateMachineLink(apply_bell, rc.open(channels.RESULTS),
                                                rc.open(channels.QUERY))
                sm_in = [self.sm_link.results, self.sm_link.query]
                self.publish_ledger()  # the applier's first wake-up
            rc.beat()  # first beat = "ledger published": the elector waits for it before voting
            self.log.info("serving on %s:%d; ledger begin=%d end=%d term=%d committed=%d", host, port,
                          self.store.ledger_begin_index, self.store.ledger_end_index,
                          self.store.ledger_end_term, self.store.committed_index)
            secure = rc.server_keys() is not None
            recv = recv_routed_user if secure else recv_routed
            counted = 0  # handshakes refused by ZAP so far, as added to the block
            for s in (sock, roles, commits.fd, ctl, rc.wake_fd, local_bell.fd, confirmed.fd, *sm_in,
                      *peers.values()):
                poller.register(s, zmq.POLLIN)
            local.scan()  # links made before this handler started (a restarted handler)
            self.tick()
            while not rc.should_stop():
                events = dict(poller.poll(0 if local.pending() else self.next_wait_ms()))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if roles in events:
                    drain(roles)
                    self.sync_role()  # before this burst's requests: a new leader's NOOP first
                # The block is the truth and the wake-up only a hint: `tick` re-reads it every
                # iteration (one seqlock read per burst), or a lost wake-up under steady traffic
                # would leave a leader answering NOT_LEADER about itself.
                if commits.fd in events:
                    commits.drain()
                    self.on_commit_wakeup()
                if ctl in events:
                    while True:
                        try:
                            self.on_control_reply(ctl.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                if confirmed.fd in events:
                    confirmed.drain()
                    self.on_control_reply(channels.LEADERSHIP_CONFIRMED)
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
                            got = recv(sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if got is None:
                            self.state.incr("bad_frames")
                        elif secure:
                            # the sender's key, from ZAP: checked per request (_decode_checked)
                            self.principal = parse_user_id(got[2])
                            self.handle_frame(got[0], got[1])
                        else:
                            self.handle_frame(*got)
                if local_bell.fd in events:
                    local_bell.drain()  # before taking: a request put after it rings again
                    local.scan()
                if local.links:
                    self._serve_local(local)
                local.check_alive(self.now())
                if secure and (refused := rc.auth_refused()) != counted:
                    # ZAP counts in its own thread; the block has one writer: this loop
                    self.state.incr("auth_refused", refused - counted)
                    counted = refused
                self.tick()
                rc.beat()
        finally:
            self.close()
            if self.transport is not None and self.transport.local is not None:
                self.transport.local.close()
            for b in bells:
                b.close()
            if isinstance(self.transport, ZmqHandlerTransport):
                for b in self.transport.bells_by_slot.values():
                    b.close()

    def _serve_local(self, local: LocalClients) -> None:
        """The requests of local clients' links, as data-port frames from a client that holds
        an admin key (ipc.local_link: who can reach a link can read the store anyway)."""
        reqs = local.requests()
        if not reqs:
            return
        saved = self.principal
        self.principal = LOCAL_PRINCIPAL
        try:
            for ident, frame in reqs:
                self.handle_frame(ident, frame)
        finally:
            self.principal = saved


def main() -> int:
    return role_main("handler", lambda rc: Handler(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
