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

import struct
import time

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode, Role, VoteResult
from ipc.sockets import dealer, elector_address, pub, recv_routed, router, send_routed
from node.core.election import ElectorCore, LedgerEnd, Persist, Reply, RoleChanged, Send, Step
from node.member_lock import MemberLock
from node.roles.runtime import RoleContext, role_main
from node.shared_state import NO_SLOT, monotonic_ms
from node.store.layout import LOCK_FILE
from node.store.term_vote import TermVoteFile

ROLE_TOPIC = b"role"
ROLE_MSG = struct.Struct(">4sBqqq")  # topic, role, term, leader slot, role epoch
MAX_ELECTOR_FRAME = 64 << 10  # elector messages are tiny; anything bigger is junk


def role_channel(rc: RoleContext) -> str:
    """Where the elector publishes role changes (every role subscribes to wake up)."""
    return rc.ipc("elector.pub")


def decode_role_msg(frame: bytes) -> tuple[Role, int, int, int] | None:
    if len(frame) != ROLE_MSG.size:
        return None
    _t, role, term, leader, epoch = ROLE_MSG.unpack(frame)
    return Role(role), term, leader, epoch


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
        self._published: tuple | None = None

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
            for e in step.effects:
                if isinstance(e, RoleChanged):
                    lead = f" leader={e.leader_id}" if e.leader_id and e.role == Role.FOLLOWER else ""
                    self.log.info("%s became %s term=%d%s", self.cfg.id, e.role.name, e.term, lead)
            self.state.incr("role_changes")
            try:
                self.pub.send(ROLE_MSG.pack(ROLE_TOPIC, c.role, c.term, leader, m.role_epoch), zmq.NOBLOCK)
            except zmq.Again:
                pass  # a hint only: subscribers also re-read the block on their own timeouts

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
        self._run(lambda _led: self.core.on_response(msg, monotonic_ms()))

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
        self.pub = pub(rc.zctx, role_channel(rc))
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
        by_sock = {s: p for p, s in self.dealers.items()}
        for s in self.dealers.values():
            poller.register(s, zmq.POLLIN)
        while not rc.should_stop():
            now = monotonic_ms()
            wait = min(1000, max(0, self.core.next_deadline(now) - now))
            events = dict(poller.poll(wait))
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
            now = monotonic_ms()
            if now >= self.core.next_deadline(now):
                self._run(lambda led: self.core.tick(monotonic_ms(), led))
            rc.beat()


def main() -> int:
    return role_main("elector", lambda rc: Elector(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
