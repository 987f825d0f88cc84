"""The dispatcher role: one process per follower, active while this node leads.

Runs `DispatcherCore` (COMPARE → TRUNCATE → APPEND ⇄ COMMIT) against a DEALER to the follower's
data port. Entries are read from the mapped store files through `StoreReader` — a run of
consecutive entries in one data file is one zero-copy slice, sent as the push's blob without
decoding — never through the handler. Writes only its own peer's watermark in the shared block
and wakes the ack checker when it moves.

Wake-ups are events: the handler's "appended" publication, the elector's role changes, the
follower's responses, and the core's own deadline (push timeouts, idle COMMIT once a second).

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
from ipc.sockets import data_address, dealer, drain, push, sub
from node import channels
from node.core.replication import (
    Append,
    Commit,
    Compare,
    DispatcherConfig,
    DispatcherCore,
    NeedSnapshot,
    PushState,
    Truncate,
)
from node.roles.runtime import RoleContext, role_main
from node.shared_state import monotonic_ms
from node.store.reader import StaleRead, StoreReader

_KIND = {P.PushKind.APPEND: "APPEND", P.PushKind.COMMIT: "COMMIT", P.PushKind.COMPARE: "COMPARE",
         P.PushKind.TRUNCATE: "TRUNCATE"}


class Dispatcher:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer = rc.peer_id
        self.slot = self.cfg.peer_ids.index(self.peer)
        self.core = DispatcherCore(DispatcherConfig(
            max_pending=self.cfg.max_pending_pushes, max_push_timeout_ms=self.cfg.max_push_timeout_ms))
        self.reader = StoreReader(self.cfg.store_dir)
        self.epoch = -1
        self.rid = 0
        self.inflight: dict[int, tuple[str, int]] = {}  # request id → (kind, first index)
        self.window: collections.deque[tuple[int, int]] = collections.deque()  # (ms, bytes) sent
        self.window_bytes = 0
        self.max_batch = self.cfg.max_batch_push_size if self.cfg.enable_batch_push else 1
        self._alive = bool(self.state.read_peer(self.slot).alive)
        self._moved = False

    # ------------------------------------------------------------------ helpers
    def _sync_role(self) -> None:
        m = self.state.read_member()
        if m.role == Role.LEADER:
            if self.core.state == PushState.IDLE or m.current_term != self.core.term:
                led = self.state.read_ledger()
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
        (`peer_push_throttle_point`, DLedger's peerPushThrottlePoint). With SPEC's
        maxPendingSize (1000) as the threshold, one burst of 16 × 64 appends made a healthy
        follower "far behind": it was throttled to the quota and stalled ~0.8 s a second."""
        while self.window and now - self.window[0][0] >= 1000:
            self.window_bytes -= self.window.popleft()[1]
        far_behind = led_end - next_index > self.cfg.peer_push_throttle_point
        return not far_behind or self.window_bytes < self.cfg.peer_push_quota

    def _send(self, msg: P.PushRequest, kind: str, first: int, nbytes: int, now: int) -> bool:
        if P.faults.drop_push() or P.faults.blocked(self.peer):
            return True  # lost on the wire: the core's timeouts resend
        try:
            self.sock.send(P.encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # follower unreachable (IMMEDIATE): try again on the next deadline
            if self._alive:
                self._alive = False
                self.state.write_peer(self.slot, alive=0)
            return False
        if not self._alive:  # the IMMEDIATE socket took it: the follower is connected
            self._alive = True
            self.state.write_peer(self.slot, alive=1)
        self.inflight[msg.request_id] = (kind, first)
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

    def _pump(self) -> None:
        """Send whatever the core wants until it wants nothing (or the socket is full)."""
        term = self.core.term
        for _ in range(64):
            now = monotonic_ms()
            led = self.state.read_ledger()
            self.reader.follow_begin(led.ledger_begin_index)  # unmap what retention deleted
            try:
                action = self.core.next_action(now, led.ledger_begin_index, led.ledger_end_index,
                                               led.committed_index, self.reader.term_at)
            except StaleRead as e:
                self.log.debug("store not readable yet: %s", e)
                return
            if action is None:
                return
            self.rid += 1
            base = dict(group=self.cfg.group, remote_id=self.peer, leader_id=self.cfg.id, term=term,
                        commit_index=led.committed_index, request_id=self.rid)
            if isinstance(action, Compare):
                msg = P.PushRequest(kind=P.PushKind.COMPARE, pre_log_index=action.pre_index,
                                    pre_log_term=action.pre_term, **base)
                ok = self._send(msg, "COMPARE", action.pre_index, 0, now)
            elif isinstance(action, Truncate):
                msg = P.PushRequest(kind=P.PushKind.TRUNCATE, first_index=action.index, **base)
                ok = self._send(msg, "TRUNCATE", action.index, 0, now)
            elif isinstance(action, Append):
                if not self._quota_ok(now, led.ledger_end_index, action.first_index):
                    self.core.not_before_ms = self.window[0][0] + 1000  # sleep until quota frees
                    return
                try:
                    blob, n, recs = self.reader.get_run(action.first_index, led.ledger_end_index,
                                                        action.max_count if self.max_batch > 1 else 1,
                                                        self.max_batch)
                except StaleRead as e:
                    self.log.debug("read of %d failed: %s", action.first_index, e)
                    self.reader.refresh()
                    return
                # Raft's AppendEntries check rides along: the entry before the batch and its
                # term, so the follower only appends onto a log that matches ours.
                pre = action.first_index - 1
                pre_term = self.reader.term_at(pre) if pre >= max(led.ledger_begin_index, 0) else -1
                msg = P.PushRequest(kind=P.PushKind.APPEND, first_index=action.first_index, count=n,
                                    entries=blob, pre_log_index=pre, pre_log_term=pre_term,
                                    index_records=recs, **base)
                ok = self._send(msg, "APPEND", action.first_index, len(blob), now)
                if ok:
                    self.core.sent(action, now, action.first_index + n - 1)
                    self.state.incr_peer(self.slot, "entries_pushed", n)
                    continue
            elif isinstance(action, Commit):
                # The committed entry's term rides along, so a follower whose handler restarted
                # (and forgot what it verified) can still check it holds that entry.
                ci = action.commit_index
                ci_term = self.reader.term_at(ci) if ci >= max(led.ledger_begin_index, 0) else -1
                msg = P.PushRequest(kind=P.PushKind.COMMIT, pre_log_index=ci, pre_log_term=ci_term,
                                    **{**base, "commit_index": ci})
                ok = self._send(msg, "COMMIT", action.commit_index, 0, now)
                if ok:
                    self.core.sent(action, now)
            elif isinstance(action, NeedSnapshot):
                self.log.error("%s needs entry %d, which this leader no longer has (deleted by "
                               "retention); snapshots are not supported: the follower must be "
                               "re-seeded from a replica's store", self.peer, action.index)
                self.core.not_before_ms = now + 5000
                return
            else:  # pragma: no cover
                return
            if not ok:
                self.core.inflight_request = None
                self.core.not_before_ms = now + 50
                return

    def _on_reply(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame, max_frame=self.cfg.max_frame_size)
        except P.ProtocolError:
            return
        if isinstance(msg, P.ErrorResponse):
            kind, first = self.inflight.pop(msg.request_id, ("", -1))
        elif isinstance(msg, P.PushResponse):
            kind, first = self.inflight.pop(msg.request_id, ("", -1))
        else:
            return
        if not kind:
            return  # an answer to a request of an earlier incarnation/term
        if msg.term > self.core.term:
            return  # the follower has a newer term: the elector will find out via heartbeats
        now = monotonic_ms()
        if isinstance(msg, P.PushResponse):
            moved = self.core.on_response(kind, msg.code, now, index=msg.index, end_index=msg.end_index,
                                          x_term=msg.x_term, x_index=msg.x_index, first_index=first)
        else:
            moved = self.core.on_response(kind, msg.code, now, first_index=first)
        if moved or msg.code == RC.SUCCESS:  # any success proves the follower alive and following
            self.state.write_peer(self.slot, match_index=self.core.match_index, match_term=self.core.term,
                                  alive=1, last_ack_ms=now)
        if moved:
            self._moved = True  # the ack checker is woken once per burst of replies (_flush_ack)

    def _flush_ack(self) -> None:
        if self._moved:
            self._moved = False
            try:
                self.ack.send(channels.ACK_MSG.pack(self.slot, self.core.match_index), zmq.NOBLOCK)
            except zmq.Again:
                pass

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        rc = self.rc
        host, port = self.cfg.peer_map[self.peer]
        self.sock = dealer(rc.zctx, data_address(host, port))
        self.sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_frame_size)
        roles = sub(rc.zctx, rc.channel(channels.ROLE))
        appended = sub(rc.zctx, rc.channel(channels.APPENDED), conflate=True)
        self.ack = push(rc.zctx, rc.channel(channels.ACK))
        poller = zmq.Poller()
        for s in (self.sock, roles, appended, rc.wake_fd):
            poller.register(s, zmq.POLLIN)
        while not rc.should_stop():
            self._sync_role()
            self._pump()
            now = monotonic_ms()
            committed = self.state.read_ledger().committed_index
            wait = (1000 if self.core.state == PushState.IDLE
                    else self.core.next_deadline(now, committed) - now)
            events = dict(poller.poll(max(1, min(1000, wait))))
            if rc.wake_fd in events:
                rc.drain_wake()
            for s in (roles, appended):
                if s in events:
                    drain(s)
            if self.sock in events:
                for _ in range(1024):
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 1:
                        self._on_reply(frames[0])
                self._flush_ack()
            rc.beat()
        self.reader.close()


def main() -> int:
    return role_main("dispatcher", lambda rc: Dispatcher(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
