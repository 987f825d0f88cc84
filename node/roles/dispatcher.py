"""The dispatcher role: one process per follower, active while this node leads.

Runs `DispatcherCore` (COMPARE → TRUNCATE → APPEND ⇄ COMMIT) against a DEALER to the follower's
data port. Entries are read from the mapped store files through `StoreReader` — a run of
consecutive entries in one data file is one zero-copy slice, sent as the push's blob without
decoding — never through the handler. Writes only its own peer's watermark in the shared block
and wakes the ack checker when it moves.

Wake-ups are events: the handler's "appended" publication, the elector's role changes, the
follower's responses, and the core's own deadline (push timeouts, idle COMMIT once a second).

One ledger snapshot per decision, and the store generation fence (docs/contracts.md C1): the pump reads
the ledger group once, calls `reader.begin(led.store_generation)` before reading the store and
`reader.validate(led.store_generation)` after reading and encoding and BEFORE sending. A
truncation on this node (while it followed) deletes segment files that later appends re-create
under the same names; without the fence a long-lived dispatcher could push old-term entries
it still maps (else: divergent committed entries).

Leadership is a lease (docs/contracts.md C3): the dispatcher pushes only while `holds_lease(...)`.

I/O is injectable (docs/contracts.md C7): no socket is built in `__init__`; `run()` sets a zmq
`transport` (send / ack) and loops calling `tick`, `on_reply`, `flush_ack`; the simulator sets its
own transport. Every time is `self.now()` (`rc.clock`).

Flow control: while the follower is more than `max_pending_pushes` entries behind, bytes sent
are limited to `peer_push_quota` per second over a sliding one-second window, so catching up one
slow follower cannot starve the others or the leader's own work.
"""

from __future__ import annotations

import collections

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.sockets import Redial, data_address, dealer, drain, from_source
from node.block.shared_state import LedgerView, MemberView
from node.core.lease import holds_lease, lease_ms
from node.core.replication import (
    Append,
    Commit,
    Compare,
    DispatcherConfig,
    DispatcherCore,
    InstallChunk,
    NeedSnapshot,
    PushState,
    Truncate,
)
from node.observe.role_metrics import histogram, set_peer_word
from node.roles.dispatcher_transport import DispatcherTransport, ZmqDispatcherTransport
from node.roles.runtime import RoleContext, role_main
from node.statemachine.snapshot_meta import Snapshot, SnapshotError
from node.statemachine.snapshot_store import SnapshotStore, read_chunk
from node.store.base import StoreError, committed_damage
from node.store.codec import push_run_crc
from node.store.reader import StaleRead, StoreReader
from node.wiring import channels

LEASE_POLL_MS = 5  # a LEADER without a lease looks at the block this often (no wake-up for renewals)
STALE_RETRY_MS = 5  # after a read the generation fence refused: try again with a new snapshot
NO_SNAPSHOT_RETRY_MS = 5000  # a follower needs a snapshot this leader does not have (yet)
DAMAGED_RETRY_MS = 1000  # a run read to push failed its checks: not pushed; the handler's scrub repairs

_KIND = {P.PushKind.APPEND: "APPEND", P.PushKind.COMMIT: "COMMIT", P.PushKind.COMPARE: "COMPARE",
         P.PushKind.TRUNCATE: "TRUNCATE"}


class Dispatcher:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer = rc.peer_id
        slot = getattr(rc, "peer_slot", None)  # the supervisor's; else the --peers position
        self.slot = slot if slot is not None else self.cfg.peer_ids.index(self.peer)
        self.address = getattr(rc, "peer_address", None) or self.cfg.peer_map[self.peer]
        self.core = DispatcherCore(DispatcherConfig(
            max_pending=self.cfg.max_pending_pushes, max_push_timeout_ms=self.cfg.max_push_timeout_ms))
        self.reader = StoreReader(self.cfg.store_dir)
        self.transport: DispatcherTransport | None = None
        self.lease = lease_ms(self.cfg.election_config())
        self.rid = 0
        self.inflight: dict[int, tuple[str, int, int]] = {}  # request id → (kind, first index, sent ms)
        self.window: collections.deque[tuple[int, int]] = collections.deque()  # (ms, bytes) sent
        self.window_bytes = 0
        self.max_batch = self.cfg.max_batch_push_size if self.cfg.enable_batch_push else 1
        self._alive: bool | None = None  # read from the block at the first send (construction reads nothing)
        self._moved = False
        self._leasing = False  # LEADER with a lease at the last tick
        self.sending: Snapshot | None = None  # the snapshot being installed on the follower
        self._snapshots: SnapshotStore | None = None  # read-only: the applier is the writer
        # /metrics: push -> answer time of APPENDs; the follower's match position (lag in bytes)
        self.latency = histogram(self.state, "replication_latency_ms", self.slot)

    def now(self) -> int:
        return self.rc.clock()

    # ------------------------------------------------------------------ helpers
    def _sync_role(self, m: MemberView, led: LedgerView) -> None:
        if m.role == Role.LEADER:
            if self.core.state == PushState.IDLE or m.current_term != self.core.term:
                self.core.become_leader(m.current_term, led.ledger_end_index)
                self.inflight.clear()
                self.state.write_peer(self.slot, match_index=-1, match_term=m.current_term)
                self.log.debug("dispatching to %s in term %d from %d", self.peer, m.current_term,
                               self.core.write_index)
        elif self.core.state != PushState.IDLE:
            self.core.step_down()
            self.inflight.clear()

    def _quota_ok(self, now: int, led_end: int, next_index: int) -> bool:
        """DLedger's checkQuotaAndWait: "far behind" is measured from the entry about to be
        sent (entries in flight are not a backlog), against its own threshold
        (`peer_push_throttle_point`, DLedger's peerPushThrottlePoint). With DLedger's
        maxPendingSize (1000) as the threshold, one burst of 16 × 64 appends made a healthy
        follower "far behind": it was throttled to the quota and stalled ~0.8 s a second."""
        while self.window and now - self.window[0][0] >= 1000:
            self.window_bytes -= self.window.popleft()[1]
        far_behind = led_end - next_index > self.cfg.peer_push_throttle_point
        return not far_behind or self.window_bytes < self.cfg.peer_push_quota

    def _send(self, frame: bytes, request_id: int, kind: str, first: int, nbytes: int, now: int) -> bool:
        if self._alive is None:
            self._alive = bool(self.state.read_peer(self.slot).alive)
        if not self.transport.send(frame):  # follower unreachable: try again on the next deadline
            if self._alive:
                self._alive = False
                self.state.write_peer(self.slot, alive=0)
            return False
        if not self._alive:  # the transport took it: the follower is connected
            self._alive = True
            self.state.write_peer(self.slot, alive=1)
        self.inflight[request_id] = (kind, first, now)
        if len(self.inflight) > 4 * self.cfg.max_pending_pushes:
            self._forget_oldest_inflight()
        self.state.incr_peer(self.slot, "pushes_sent")
        if nbytes:
            self.window.append((now, nbytes))
            self.window_bytes += nbytes
            self.state.incr_peer(self.slot, "bytes_pushed", nbytes)
        return True

    def _forget_oldest_inflight(self) -> None:
        """Requests whose answers never came (lost, or timed out and resent) would pile up;
        the core already gave up on them, so forget the oldest half."""
        for rid in sorted(self.inflight)[: len(self.inflight) // 2]:
            del self.inflight[rid]

    def tick(self) -> None:
        """Input: one loop turn — sync the role from one member snapshot, then pump."""
        now = self.now()
        m = self.state.read_member()
        led = self.state.read_ledger()
        # Whatever the role: unmap files retention deleted (a follower's dispatchers too — until
        # every process lets go of a deleted file the kernel cannot give its space back).
        self.reader.follow_begin(led.ledger_begin_index)
        self._sync_role(m, led)
        self._leasing = (self.core.state != PushState.IDLE
                         and holds_lease(m.role, m.last_quorum_heartbeat_ms, now, self.lease))
        if self._leasing:
            self._pump(m)

    def _pump(self, m: MemberView) -> None:
        """Send whatever the core wants until it wants nothing (or the transport is full). Each
        decision reads one ledger snapshot and fences its store reads with its generation."""
        term = self.core.term
        # The leader's newest snapshot position: a compare or an append just after it needs its
        # term once retention deleted the entry itself. Written by the applier; a stale value
        # is an older snapshot, whose position is as true (a committed entry's term).
        snap = self.state.read_snapshot() if self.cfg.state_machine else None
        known = (snap.snapshot_index, snap.snapshot_term) if snap and snap.snapshot_index >= 0 else None
        for _ in range(64):
            now = self.now()
            if not holds_lease(m.role, m.last_quorum_heartbeat_ms, now, self.lease):
                return
            led = self.state.read_ledger()
            gen = led.store_generation
            self.reader.follow_begin(led.ledger_begin_index)  # unmap what retention deleted
            action = None
            try:
                self.reader.begin(gen)
                action = self.core.next_action(now, led.ledger_begin_index, led.ledger_end_index,
                                               led.committed_index, self.reader.term_at, known)
                if action is None:
                    return
                if isinstance(action, NeedSnapshot):
                    if self._start_install(action, now):
                        continue
                    return
                out = self._build(action, led, term, now, known)
                if out is None:
                    return
                frame, kind, first, nbytes, n = out
                self.reader.validate(gen)  # after reading and encoding, before sending
            except StaleRead as e:
                self.log.debug("store changed under the read (generation %d): %s", gen, e)
                if isinstance(action, (Compare, Truncate)):
                    self.core.inflight_request = None  # not sent: ask again with a new snapshot
                self.core.not_before_ms = now + STALE_RETRY_MS
                return
            ok = self._send(frame, self.rid, kind, first, nbytes, now)
            if not ok:
                self.core.inflight_request = None
                self.core.not_before_ms = now + 50
                return
            if isinstance(action, Append):
                self.core.sent(action, now, action.first_index + n - 1)
                self.state.incr_peer(self.slot, "entries_pushed", n)
            elif isinstance(action, (Commit, InstallChunk)):
                self.core.sent(action, now)

    # ------------------------------------------------------------------ install snapshot
    def _snapshot_store(self) -> SnapshotStore:
        if self._snapshots is None:
            self._snapshots = SnapshotStore(self.cfg.store_dir, writable=False)
        return self._snapshots

    def _start_install(self, need: NeedSnapshot, now: int) -> bool:
        """The follower needs entry `need.index`, which this leader's log no longer holds: send
        it the newest snapshot that passes its checks (its checksum too: a damaged one would be
        refused by the follower after the whole transfer, for ever). False: none to send."""
        snap = None
        if self.cfg.state_machine:
            try:
                snap = self._snapshot_store().newest_valid()
            except SnapshotError as e:
                self.log.warning("cannot read this leader's snapshots: %s", e)
        if snap is None or snap.last_index < need.index:
            self.log.error("%s needs entry %d, which this leader no longer has (deleted by "
                           "retention), and %s: the follower must be re-seeded from a replica's "
                           "store (docs/operations.md)", self.peer, need.index,
                           "there is no snapshot covering it" if self.cfg.state_machine
                           else "there are no snapshots without a state machine")
            self.core.not_before_ms = now + NO_SNAPSHOT_RETRY_MS
            return False
        self.sending = snap
        # Answers to chunks of an earlier transfer must not count for this one: an INSTALL
        # answer does not say which snapshot it is about, and a late `installed` of another
        # snapshot would make the leader believe the follower holds this one (found by the
        # simulator, seed 91743).
        for rid in [r for r, (kind, *_rest) in self.inflight.items() if kind == "INSTALL"]:
            del self.inflight[rid]
        self.core.start_install(snap.last_index, snap.last_term, snap.size)
        self.log.info("%s needs entry %d, which this leader's log no longer holds: installing "
                      "snapshot %d/%d (%d bytes)", self.peer, need.index, snap.last_index,
                      snap.last_term, snap.size)
        return True

    def _build_install(self, action: InstallChunk, base: dict,
                       now: int) -> tuple[bytes, str, int, int, int] | None:
        snap = self.sending
        if snap is None:
            self.core.abandon_install(now, STALE_RETRY_MS)
            return None
        if action.length and not self._quota_ok(now, 1 << 62, 0):  # an install is catching up
            self.core.not_before_ms = self.window[0][0] + 1000
            return None
        try:
            data = read_chunk(snap, action.offset, action.length) if action.length else b""
        except SnapshotError as e:  # pruned for a newer one, or unreadable: start over
            self.log.info("install of snapshot %d to %s restarts: %s", snap.last_index, self.peer, e)
            self.sending = None
            self.core.abandon_install(now, STALE_RETRY_MS)
            return None
        msg = P.InstallRequest(group=base["group"], remote_id=self.peer, leader_id=self.cfg.id,
                               term=base["term"], meta=snap.meta.to_json(), offset=action.offset,
                               data=data, request_id=base["request_id"])
        return P.encode(msg), "INSTALL", action.offset, len(data), 0

    def _build(self, action: object, led: LedgerView, term: int, now: int,
               known: tuple[int, int] | None = None) -> tuple[bytes, str, int, int, int] | None:
        """Read what `action` needs and encode its request: (frame, kind, first, bytes, count),
        or None when nothing is to be sent now."""
        self.rid += 1
        base = dict(group=self.cfg.group, remote_id=self.peer, leader_id=self.cfg.id, term=term,
                    commit_index=led.committed_index, request_id=self.rid)
        if isinstance(action, InstallChunk):
            return self._build_install(action, base, now)
        if isinstance(action, Compare):
            msg = P.PushRequest(kind=P.PushKind.COMPARE, pre_log_index=action.pre_index,
                                pre_log_term=action.pre_term, **base)
            return P.encode(msg), "COMPARE", action.pre_index, 0, 0
        if isinstance(action, Truncate):
            # The entry before the cut rides along (the compare matched it): a follower whose
            # own retention deleted it needs its term to empty its log (FollowerCore TRUNCATE).
            pre = action.index - 1
            msg = P.PushRequest(kind=P.PushKind.TRUNCATE, first_index=action.index, pre_log_index=pre,
                                pre_log_term=self._term_of(pre, led, known) if pre >= 0 else -1, **base)
            return P.encode(msg), "TRUNCATE", action.index, 0, 0
        if isinstance(action, Append):
            if not self._quota_ok(now, led.ledger_end_index, action.first_index):
                self.core.not_before_ms = self.window[0][0] + 1000  # sleep until quota frees
                return None
            blob, n, recs = self.reader.get_run(action.first_index, led.ledger_end_index,
                                                action.max_count if self.max_batch > 1 else 1,
                                                self.max_batch)
            if (action.first_index <= self.state.get("unchecked_end_index")
                    and not check_unchecked_run(self, blob, recs, n, action.first_index, led)):
                self.core.not_before_ms = now + DAMAGED_RETRY_MS  # nothing pushed: the scrub acts
                return None
            # Raft's AppendEntries check rides along: the entry before the batch and its
            # term, so the follower only appends onto a log that matches ours.
            pre = action.first_index - 1
            pre_term = self._term_of(pre, led, known)
            # The run CRC (codec.push_run_crc: two C calls, no per-entry work) lets the follower
            # check every byte of the run at once instead of one body CRC per entry.
            msg = P.PushRequest(kind=P.PushKind.APPEND, first_index=action.first_index, count=n,
                                entries=blob, pre_log_index=pre, pre_log_term=pre_term,
                                index_records=recs, run_crc=push_run_crc(recs, blob), **base)
            return P.encode(msg), "APPEND", action.first_index, len(blob), n
        if isinstance(action, Commit):
            # The committed entry's term rides along, so a follower whose handler restarted
            # (and forgot what it verified) can still check it holds that entry.
            ci = action.commit_index
            ci_term = self._term_of(ci, led, known)
            msg = P.PushRequest(kind=P.PushKind.COMMIT, pre_log_index=ci, pre_log_term=ci_term,
                                **{**base, "commit_index": ci})
            return P.encode(msg), "COMMIT", ci, 0, 0
        return None

    def _term_of(self, index: int, led: LedgerView, known: tuple[int, int] | None) -> int:
        """The term of `index` from the log, or from a snapshot position when the log no longer
        holds it (-1: unknown; the follower then refuses, and the leader compares again)."""
        if index >= max(led.ledger_begin_index, 0):
            return self.reader.term_at(index)
        t = self.core.known_position(index, known)
        return -1 if t is None else t

    def on_reply(self, frame: bytes) -> None:
        """Input: one frame from the follower."""
        try:
            msg = P.decode(frame, max_frame=self.cfg.max_frame_size)
        except P.ProtocolError:
            return
        if isinstance(msg, (P.ErrorResponse, P.PushResponse, P.InstallResponse)):
            kind, first, sent = self.inflight.pop(msg.request_id, ("", -1, 0))
        else:
            return
        if not kind:
            return  # an answer to a request of an earlier incarnation/term
        if msg.term > self.core.term:
            return  # the follower has a newer term: the elector will find out via heartbeats
        now = self.now()
        if kind == "INSTALL":
            self._on_install_reply(msg, first, now)
            return
        if isinstance(msg, P.PushResponse):
            moved = self.core.on_response(kind, msg.code, now, index=msg.index, end_index=msg.end_index,
                                          x_term=msg.x_term, x_index=msg.x_index, first_index=first)
        else:
            moved = self.core.on_response(kind, msg.code, now, first_index=first)
        if moved or msg.code == RC.SUCCESS:  # any success proves the follower alive and following
            self.state.write_peer(self.slot, match_index=self.core.match_index, match_term=self.core.term,
                                  alive=1, last_ack_ms=now)
        if kind == "APPEND" and msg.code == RC.SUCCESS:
            self.latency.observe(now - sent)
        if moved:
            self._moved = True  # the ack checker is woken once per burst of replies (flush_ack)

    def _on_install_reply(self, msg: P.InstallResponse | P.PushResponse | P.ErrorResponse, offset: int,
                          now: int) -> None:
        if isinstance(msg, P.InstallResponse):
            self.core.on_install_response(offset, msg.code, now, received=msg.received,
                                          installed=msg.installed)
        else:
            self.core.on_install_response(offset, msg.code, now)
        if msg.code == RC.SUCCESS:  # the follower is alive and following
            self.state.write_peer(self.slot, alive=1, last_ack_ms=now)
        if self.core.installed is not None and self.core.state == PushState.COMPARE and self.sending:
            self.log.info("%s installed snapshot %d/%d; continuing from the log", self.peer,
                          self.sending.last_index, self.sending.last_term)
            self.sending = None
        elif self.core.state != PushState.INSTALL:
            self.sending = None

    def flush_ack(self) -> None:
        """Wake the ack checker once per burst of replies that moved the watermark."""
        if self._moved:
            self._moved = False
            self.transport.ack(self.slot, self.core.match_index)
            self._publish_match_pos()

    def _publish_match_pos(self) -> None:
        """Where the follower's matched entry ends in the data files, for its lag in bytes
        (/metrics). One index record read per burst of replies that moved the watermark (with
        the ack checker's wake-up); a record the store no longer maps (retention, a truncation)
        leaves the old value."""
        match = self.core.match_index
        if match < 0:
            return
        r = self.reader
        try:
            _magic, pos, size = r._with_refresh(lambda: r._record(match))[:3]  # noqa: SLF001
        except Exception:  # noqa: BLE001 - a metric must never stop a dispatcher (torn read, fake store)
            return
        set_peer_word(self.state, self.slot, "match_pos", pos + size)

    def next_wait_ms(self) -> int:
        """How long the loop may sleep before `tick` has something to do without input."""
        if self.core.state == PushState.IDLE:
            return 1000
        if not self._leasing:
            return LEASE_POLL_MS
        now = self.now()
        committed = self.state.read_ledger().committed_index
        return max(1, min(1000, self.core.next_deadline(now, committed) - now))

    def close(self) -> None:
        self.reader.close()
        if self._snapshots is not None:
            self._snapshots.close()

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        rc = self.rc
        host, port = self.address
        source = self.cfg.address[0] if self.cfg.connect_from_own_host else None

        def make() -> zmq.Socket:
            s = dealer(rc.zctx, from_source(data_address(host, port), source),
                       curve=rc.peer_curve(self.peer))
            s.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_frame_size)
            return s

        redial = Redial(make, enabled=rc.server_keys() is not None)
        roles = rc.open(channels.ROLE)
        appended = rc.bell(channels.APPENDED_BELL, self.slot)
        ack = rc.bell(channels.ACK_BELL)
        poller = zmq.Poller()
        self.transport = tr = ZmqDispatcherTransport(redial, ack, self.peer, poller)
        for s in (tr.sock, roles, appended.fd, rc.wake_fd):
            poller.register(s, zmq.POLLIN)
        try:
            while not rc.should_stop():
                self.tick()
                events = dict(poller.poll(self.next_wait_ms()))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if roles in events:
                    drain(roles)
                if appended.fd in events:
                    appended.drain()
                sock = tr.sock  # made again after a refused handshake (ipc.sockets.Redial)
                if sock in events:
                    for _ in range(1024):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 1:
                            self.on_reply(frames[0])
                    self.flush_ack()
                rc.beat()
        finally:
            appended.close()
            ack.close()
            self.close()


def check_unchecked_run(d: Dispatcher, blob: memoryview, recs: memoryview, n: int, first: int,
                        led: LedgerView) -> bool:
    """Entries the handler's recovery left unchecked (at or below `unchecked_end_index`,
    until its scrub has been past them) are checked before they are pushed: every header
    against its index record and every body CRC (push_check.check_run, the follower's own
    check). The run CRC alone would not do: it is computed here, over whatever the files
    hold. A failure is damage only if the store generation did not move meanwhile (else it
    is a read racing a truncation: StaleRead). Damage is never pushed: False, and the run
    is tried again after DAMAGED_RETRY_MS. The dispatcher cannot act on it (the handler is
    the store's one writer): the handler's scrub, which walks every unchecked entry, finds
    the same entry and starts the repair (node/roles/handling/damage.py, docs/store.md)."""
    from node.store import push_check  # numpy: only a dispatcher pushing old entries pays it

    try:
        push_check.check_run(blob, recs, n, verify_bodies=True)
    except StoreError as e:
        d.reader.validate(led.store_generation)
        d.log.error("%s", committed_damage(d.cfg.store_dir, first, led.committed_index,
                                              f"read to push to {d.peer}: {e}; not pushed"))
        return False
    return True


def main() -> int:
    return role_main("dispatcher", lambda rc: Dispatcher(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
