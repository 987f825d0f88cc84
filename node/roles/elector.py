"""The elector role: runs the pure ElectorCore (node/core) against real sockets, files and time.

The core decides; this process only executes its effects, in the order the core gives them:
`Persist` (currterm file, fsync) before anything that depends on it, `RoleChanged` into the
shared block (and a wake-up to every role), then `Send`/`Reply` on the network.

Cross-process safety (SPEC §2): DLedger decides votes and appends under
`synchronized(memberState)`. Here every core call that may read the ledger or change the term,
vote or role runs under the member lock (an fcntl lock the handler also takes around
"check leader of term T → append with T → publish ledger end"), together with the persist and
the block write. So a vote is never granted against a ledger end that is about to grow by an
entry this node already acknowledged. Sends and replies happen after the lock is released.

The elector does not vote or stand before the handler has published the recovered ledger end
(its first beat): deciding on an unknown ledger could elect a node lacking committed entries.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode, Role, VoteResult
from ipc.sockets import dealer, elector_address, pub, recv_routed, router, send_routed
from node import channels
from node.core.election import ElectorCore, LedgerEnd, Persist, Reply, RoleChanged, Send, Step
from node.member_lock import MemberLock
from node.roles.runtime import RoleContext, role_main
from node.shared_state import NO_SLOT, monotonic_ms
from node.store.layout import LOCK_FILE
from node.store.term_vote import TermVoteFile

TRANSFER_CHECK_MS = 50
PREFERRED_CHECK_MS = 1000
RECENT_ACK_MS = 2500  # an idle follower still answers a COMMIT push every second
LEADER_GRACE_MS = 1500  # a new leader's dispatchers need a moment before a follower can look dead
MAX_ELECTOR_FRAME = 64 << 10  # elector messages are tiny; anything bigger is junk


@dataclass(slots=True)
class Transfer:
    """A leadership transfer in progress (DLedger's handleLeadershipTransfer)."""

    target: str
    slot: int
    term: int
    deadline_ms: int
    ident: bytes | None  # the handler's routing id, or None for a preferred-leader transfer
    request_id: int
    take_rid: int = 0  # request id of the TAKE_LEADERSHIP sent, 0 = not sent yet


class Elector:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer_ids = self.cfg.peer_ids
        self.slot = {p: i for i, p in enumerate(self.peer_ids)}
        self.termvote = TermVoteFile(self.cfg.store_dir)
        self.lock = MemberLock(f"{self.cfg.store_dir}/{LOCK_FILE}")
        tv = self.termvote.current
        self.core = ElectorCore(self.cfg.id, self.peer_ids, self.cfg.group, self.cfg.election_config(),
                                term=tv.term, voted_for=tv.voted_for, now_ms=monotonic_ms())
        self.router: zmq.Socket | None = None
        self.pub: zmq.Socket | None = None
        self.dealers: dict[str, zmq.Socket] = {}
        self.ctl: zmq.Socket | None = None
        self._published: tuple | None = None
        self.transfer: Transfer | None = None
        self.preferred = [p.strip() for p in self.cfg.preferred_leader_ids.split(",") if p.strip()]
        self.next_preferred_check = 0
        self._take_rid = 1 << 40  # our own request ids for TAKE_LEADERSHIP, apart from the core's
        self.hook = shlex.split(self.cfg.on_role_change) if self.cfg.on_role_change else []
        self.hook_procs: list[subprocess.Popen] = []
        self.leader_since_ms = 0

    # ------------------------------------------------------------------ effects
    def _ledger(self) -> LedgerEnd:
        led = self.state.read_ledger()
        return LedgerEnd(led.ledger_end_index, led.ledger_end_term)

    def _decide(self, fn) -> Step:  # noqa: ANN001 - fn(ledger) -> Step, a core call
        """Run one core call and its durable/shared effects atomically under the member lock."""
        with self.lock:
            step = fn(self._ledger())
            for e in step.effects:
                if isinstance(e, Persist):
                    self.termvote.save(e.term, e.voted_for)  # fsynced before anything else
            self._publish(step)
        return step

    def _publish(self, step: Step) -> None:
        c = self.core
        leader = self.slot.get(c.leader_id, NO_SLOT) if c.leader_id else NO_SLOT
        voted = self.slot.get(c.voted_for, NO_SLOT) if c.voted_for else NO_SLOT
        snap = (c.role, c.term, leader, voted, c.last_leader_heartbeat_ms, c.last_succ_heartbeat_ms)
        if snap == self._published:
            return
        changed = self._published is None or snap[:3] != self._published[:3]
        self._published = snap
        m = self.state.write_member(role=c.role, current_term=c.term, leader_slot=leader,
                                    voted_for_slot=voted, last_leader_heartbeat_ms=c.last_leader_heartbeat_ms,
                                    last_quorum_heartbeat_ms=c.last_succ_heartbeat_ms)
        if changed:
            if c.role == Role.LEADER:
                self.leader_since_ms = monotonic_ms()
            for e in step.effects:
                if isinstance(e, RoleChanged):
                    lead = f" leader={e.leader_id}" if e.leader_id and e.role == Role.FOLLOWER else ""
                    self.log.info("%s became %s term=%d%s", self.cfg.id, e.role.name, e.term, lead)
            self.state.incr("role_changes")
            self._run_hook(c.role, c.term, c.leader_id)
            try:
                self.pub.send(channels.encode_role_msg(c.role, c.term, leader, m.role_epoch), zmq.NOBLOCK)
            except zmq.Again:
                pass  # a hint only: subscribers also re-read the block on their own timeouts

    def _run_hook(self, role: Role, term: int, leader: str | None) -> None:
        """The role-change listener for embedding code (DLedger's RoleChangeHandler): run the
        configured command without waiting; the environment says what changed."""
        self.hook_procs = [p for p in self.hook_procs if p.poll() is None]  # reap finished ones
        if not self.hook:
            return
        env = {**os.environ, "DLEDGER_NODE": self.cfg.id, "DLEDGER_GROUP": self.cfg.group,
               "DLEDGER_ROLE": role.name, "DLEDGER_TERM": str(term), "DLEDGER_LEADER": leader or ""}
        try:
            self.hook_procs.append(subprocess.Popen(self.hook, env=env, stdin=subprocess.DEVNULL,
                                                    close_fds=True))
        except OSError as e:
            self.log.warning("on_role_change command failed to start: %s", e)

    def _transmit(self, step: Step) -> None:
        """Network effects, outside the lock. A peer we cannot reach right now answers
        'unreachable' at once (IMMEDIATE dealers), which keeps failover fast."""
        unreachable: list[int] = []
        for e in step.effects:
            if isinstance(e, Send):
                if P.faults.blocked(e.peer):
                    continue  # test-only partition: the message is lost
                try:
                    self.dealers[e.peer].send(P.encode(e.message), zmq.NOBLOCK)
                    if isinstance(e.message, P.VoteRequest):
                        self.state.incr("votes_requested")
                    else:
                        self.state.incr("heartbeats_sent")
                except zmq.Again:
                    unreachable.append(e.message.request_id)
            elif isinstance(e, Reply):
                if isinstance(e.message, P.VoteResponse) and e.message.vote_result == VoteResult.ACCEPT:
                    self.state.incr("votes_granted")
                send_routed(self.router, e.token, P.encode(e.message))
        for rid in unreachable:
            self._run(lambda _led, rid=rid: self.core.on_peer_unreachable(rid, monotonic_ms()))

    def _run(self, fn) -> None:  # noqa: ANN001
        self._transmit(self._decide(fn))

    # ------------------------------------------------------------------ inputs
    def _on_request(self, ident: bytes, frame: bytes) -> None:
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError as e:
            self.state.incr("elector_bad_frames")
            send_routed(self.router, ident, P.encode(P.error_reply(
                frame, ResponseCode.UNEXPECTED_ARGUMENT,
                group=self.cfg.group, term=self.core.term, reason=str(e)[:200])))
            return
        if P.is_response(msg):
            self.state.incr("elector_bad_frames")
            return
        self._run(lambda led: self.core.handle(msg, monotonic_ms(), led, ident))

    def _on_response(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError:
            self.state.incr("elector_bad_frames")
            return
        if not P.is_response(msg):
            self.state.incr("elector_bad_frames")
            return
        if isinstance(msg, P.TakeLeadershipResponse):
            t = self.transfer
            if t is not None and msg.request_id == t.take_rid and msg.code != ResponseCode.SUCCESS:
                self._end_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED)
            return  # on SUCCESS the target's higher term deposes us; _drive_transfer answers
        self._run(lambda _led: self.core.on_response(msg, monotonic_ms()))

    # ------------------------------------------------------------------ leadership transfer
    def _transfer_reply(self, t: Transfer, code: ResponseCode) -> None:
        if t.ident is not None:
            send_routed(self.ctl, t.ident, P.encode(P.TransferResponse(
                int(code), self.cfg.group, self.core.term, self.core.leader_id or "", t.request_id)))
        if code == ResponseCode.SUCCESS:
            self.log.info("%s handed leadership to %s", self.cfg.id, t.target)
        else:
            self.log.warning("transfer to %s failed: %s", t.target, code.name)

    def _end_transfer(self, code: ResponseCode) -> None:
        t, self.transfer = self.transfer, None
        if t is None:
            return
        with self.lock:
            self.state.write_member(transferee_slot=NO_SLOT)
        self._transfer_reply(t, code)

    def _start_transfer(self, target: str, ident: bytes | None, request_id: int, term: int) -> None:
        c, now = self.core, monotonic_ms()
        code = None
        if c.role != Role.LEADER:
            code = ResponseCode.NOT_LEADER
        elif term not in (-1, c.term):
            code = ResponseCode.EXPIRED_TERM
        elif target not in self.slot:
            code = ResponseCode.UNKNOWN_MEMBER
        elif target == self.cfg.id:
            code = ResponseCode.SUCCESS  # already there
        elif self.transfer is not None:
            code = ResponseCode.LEADER_TRANSFERRING
        elif not self._reachable(target, now):
            code = ResponseCode.TAKE_LEADERSHIP_FAILED  # dead or stalled: fail fast (#39, #85, #247)
        if code is not None:
            self._transfer_reply(Transfer(target, -1, c.term, now, ident, request_id), code)
            return
        self.transfer = Transfer(target, self.slot[target], c.term, now + self.cfg.transfer_timeout_ms,
                                 ident, request_id)
        with self.lock:
            self.state.write_member(transferee_slot=self.slot[target])  # the handler stops appends
        self.log.info("%s transferring leadership to %s (term %d)", self.cfg.id, target, c.term)

    def _reachable(self, target: str, now: int) -> bool:
        """Not known dead: its dispatcher's socket is connected (`alive`) and its last answer,
        if any, is recent. A target that has not answered yet in a fresh term gets the benefit
        of the doubt, bounded by the transfer timeout."""
        if now - self.leader_since_ms < LEADER_GRACE_MS:
            return True  # too early to tell: our dispatchers may not have reached anyone yet
        p = self.state.read_peer(self.slot[target])
        window = max(RECENT_ACK_MS, 2 * self.cfg.heartbeat_interval_ms * self.cfg.max_heartbeat_leak)
        return bool(p.alive) and not (p.last_ack_ms > 0 and now - p.last_ack_ms > window)

    def _drive_transfer(self) -> None:
        t, c, now = self.transfer, self.core, monotonic_ms()
        if t is None:
            return
        if c.role != Role.LEADER or c.term != t.term:
            if c.leader_id == t.target:
                self._end_transfer(ResponseCode.SUCCESS)
            elif t.take_rid and c.leader_id is None and now < t.deadline_ms:
                return  # deposed by the target's election: wait for its outcome
            else:
                self._end_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED)
            return
        if now >= t.deadline_ms:
            self._end_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED)
            return
        if t.take_rid:
            return
        if not self._reachable(t.target, now):
            self._end_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED)  # died or stalled meanwhile
            return
        p = self.state.read_peer(t.slot)
        end = self.state.read_ledger().ledger_end_index
        if p.match_term == c.term and p.match_index >= end:
            self._take_rid += 1
            t.take_rid = self._take_rid
            try:
                self.dealers[t.target].send(P.encode(P.TakeLeadershipRequest(
                    self.cfg.group, t.target, self.cfg.id, c.term, t.take_rid)), zmq.NOBLOCK)
            except zmq.Again:
                self._end_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED)

    def _check_preferred(self) -> None:
        """A leader that is not a preferred leader hands over to a preferred peer that is
        alive and caught up (DLedger's preferredLeaderIds)."""
        now = monotonic_ms()
        if (not self.preferred or self.cfg.id in self.preferred or self.transfer is not None
                or self.core.role != Role.LEADER or now < self.next_preferred_check):
            return
        self.next_preferred_check = now + PREFERRED_CHECK_MS
        end = self.state.read_ledger().ledger_end_index
        for target in self.preferred:
            p = self.state.read_peer(self.slot[target])
            if self._reachable(target, now) and p.match_term == self.core.term and p.match_index >= end:
                self._start_transfer(target, None, 0, self.core.term)
                return

    def _on_control(self, ident: bytes, frame: bytes) -> None:
        try:
            msg = P.decode(frame, max_frame=MAX_ELECTOR_FRAME)
        except P.ProtocolError:
            return
        if isinstance(msg, P.LeadershipTransferRequest):
            self._start_transfer(msg.transferee_id, ident, msg.request_id, msg.term)

    # ------------------------------------------------------------------ loop
    def _wait_for_handler(self) -> bool:
        """The ledger end must be known before any vote (see module docstring)."""
        while not self.rc.should_stop():
            if self.state.last_beat("handler") > 0:
                return True
            self.rc.beat()
            time.sleep(0.05)
        return False

    def run(self) -> None:
        rc = self.rc
        host, port = self.cfg.address
        self.router = router(rc.zctx, elector_address(host, port), max_msg_size=MAX_ELECTOR_FRAME)
        self.pub = pub(rc.zctx, rc.channel(channels.ROLE))
        self.ctl = router(rc.zctx, rc.channel(channels.CONTROL))
        for peer in self.core.others:
            h, p = self.cfg.peer_map[peer]
            self.dealers[peer] = dealer(rc.zctx, elector_address(h, p))
        if not self._wait_for_handler():
            return
        with self.lock:
            self._publish(Step([RoleChanged(self.core.role, self.core.term, None)], 0))
        self.log.info("%s elector ready term=%d voted_for=%s", self.cfg.id, self.core.term,
                      self.core.voted_for)
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.ctl, zmq.POLLIN)
        poller.register(rc.wake_fd, zmq.POLLIN)
        by_sock = {s: p for p, s in self.dealers.items()}
        for s in self.dealers.values():
            poller.register(s, zmq.POLLIN)
        while not rc.should_stop():
            now = monotonic_ms()
            wait = min(1000, max(0, self.core.next_deadline(now) - now))
            if self.transfer is not None:
                wait = min(wait, TRANSFER_CHECK_MS)
            events = dict(poller.poll(wait))
            if rc.wake_fd in events:
                rc.drain_wake()
            # Read everything queued before ticking (the core wants inputs before the clock).
            if self.router in events:
                while True:
                    try:
                        got = recv_routed(self.router, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if got is None:
                        self.state.incr("elector_bad_frames")
                    else:
                        self._on_request(*got)
            for s in list(events):
                if s in by_sock:
                    while True:
                        try:
                            frames = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 1:
                            self._on_response(frames[0])
            if self.ctl in events:
                while True:
                    try:
                        got = recv_routed(self.ctl, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if got is not None:
                        self._on_control(*got)
            now = monotonic_ms()
            if now >= self.core.next_deadline(now):
                self._run(lambda led: self.core.tick(monotonic_ms(), led))
            self._drive_transfer()
            self._check_preferred()
            rc.beat()


def main() -> int:
    return role_main("elector", lambda rc: Elector(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
