"""The ack checker role (DLedger's QuorumAckChecker), active while this node leads.

Woken by the dispatchers whenever a follower's watermark moves (and by role changes), it
applies the pure rule `node.core.replication.quorum_advance`: the quorum index of the *current
term's* watermarks — the leader's own ledger end and each follower's match index whose match
term is the current term (older terms' watermarks count as -1, which is how they are "cleaned")
— accepted only if the entry there is of the current term (Raft §5.4.2). The result goes to the
shared block (quorum_index, quorum_term) and a ring of the handler's doorbell, which owns the pending
client replies: it advances the committed index, answers SUCCESS, and times out or fails
(TERM_CHANGED) what cannot complete.

It acts only while this node holds the leader lease (docs/contracts.md C3), reads the ledger group once
per decision, and fences its store read (the term at the quorum index) with that snapshot's
store generation (docs/contracts.md C1): a truncation that re-created a segment file must not make it
read an old-term entry's term.

I/O is injectable (docs/contracts.md C7): `run()` opens its doorbells and sets a `transport`
(`commit_wakeup`); the simulator sets its own and calls `tick`.
"""

from __future__ import annotations

from typing import Protocol

import zmq

from ipc.codes import Role
from ipc.sockets import drain
from node.core.lease import holds_lease, lease_ms
from node.core.membership import MAX_MEMBERS, voter_slot_set
from node.core.replication import current_term_watermarks, quorum_advance
from node.roles.runtime import RoleContext, role_main
from node.store.reader import StaleRead, StoreReader
from node.wiring import channels
from node.wiring.doorbells import Doorbell

IDLE_POLL_MS = 1000
LEASE_POLL_MS = 5  # a LEADER without a lease looks again this often (renewals wake nobody)


class AckTransport(Protocol):
    def commit_wakeup(self) -> None: ...


class ZmqAckTransport:
    """The real one: the handler's doorbell (the handler also re-reads the quorum on its own
    timer, so a ring that is lost only costs latency)."""

    def __init__(self, bell: Doorbell) -> None:
        self.bell = bell

    def commit_wakeup(self) -> None:
        self.bell.ring()


class AckChecker:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.state = rc.state
        self.log = rc.log
        self.self_slot = rc.cfg.self_slot
        self.n = len(rc.cfg.peer_ids)
        # The voters whose watermarks make the quorum: those of the newest configuration in the
        # log, as the handler publishes it in the ledger group (a slot bit mask; 0: the
        # bootstrap configuration, every --peers member). Re-derived when the mask moves.
        self._voters_mask = 0
        self.voter_slots = voter_slot_set(0, self.n)
        self.reader = StoreReader(rc.cfg.store_dir)
        self.transport: AckTransport | None = None
        self.lease = lease_ms(rc.cfg.election_config())
        self._lease_wait = False  # the last check found LEADER without a lease

    def now(self) -> int:
        return self.rc.clock()

    def check(self) -> bool:
        """One quorum computation on one member and one ledger snapshot; True if the quorum
        index moved (and was published)."""
        m = self.state.read_member()
        if not holds_lease(m.role, m.last_quorum_heartbeat_ms, self.now(), self.lease):
            self._lease_wait = m.role == Role.LEADER
            return False
        self._lease_wait = False
        term = m.current_term
        led, words = self.state.read_ledger_config()  # one snapshot: the end AND its voters
        if words.config_voters != self._voters_mask:
            self._voters_mask = words.config_voters
            # A mask names any of the block's MAX_MEMBERS slots (members added later hold
            # slots past the --peers ones); 0 is the bootstrap, the --peers slots.
            slots = voter_slot_set(words.config_voters, MAX_MEMBERS if words.config_voters else self.n)
            if slots != self.voter_slots:
                self.voter_slots = slots
                self.log.info("counting the voters of configuration entry %d: slots %s",
                              words.config_index, sorted(slots))
        peers = []
        for slot in range(max(self.n, max(self.voter_slots, default=0) + 1)):
            if slot == self.self_slot:
                peers.append((led.ledger_end_index, term))
            else:
                p = self.state.read_peer(slot)
                peers.append((p.match_index, p.match_term))
        marks = current_term_watermarks(term, self.self_slot, led.ledger_end_index, peers,
                                        self.voter_slots)
        prev = self.state.read_quorum()
        gen = led.store_generation
        try:
            self.reader.begin(gen)
            new = quorum_advance(term, marks, prev.quorum_index, prev.quorum_term, self.reader.term_at)
            self.reader.validate(gen)  # the term we read is of the log the snapshot describes
        except StaleRead:
            return False
        if new is None:
            return False
        self.state.write_quorum(quorum_index=new, quorum_term=term)
        self.state.incr("quorum_advances")
        return True

    def tick(self) -> None:
        """Input: one loop turn — unmap files retention deleted, check, wake the handler."""
        self.reader.follow_begin(self.state.read_ledger().ledger_begin_index)
        if self.check():
            self.transport.commit_wakeup()

    def next_wait_ms(self) -> int:
        return LEASE_POLL_MS if self._lease_wait else IDLE_POLL_MS

    def close(self) -> None:
        self.reader.close()

    def run(self) -> None:
        rc = self.rc
        # Rung by the dispatchers when a follower's match moved, and by the handler in a
        # 1-member group (its own end is the quorum): one doorbell for both.
        acks = rc.bell(channels.ACK_BELL)
        roles = rc.open(channels.ROLE)
        commit = rc.bell(channels.COMMIT_BELL)
        self.transport = ZmqAckTransport(commit)
        poller = zmq.Poller()
        for s in (acks.fd, roles, rc.wake_fd):
            poller.register(s, zmq.POLLIN)
        try:
            while not rc.should_stop():
                events = dict(poller.poll(self.next_wait_ms()))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if acks.fd in events:
                    acks.drain()
                if roles in events:
                    drain(roles)
                self.tick()
                rc.beat()
        finally:
            acks.close()
            commit.close()
            self.close()


def main() -> int:
    return role_main("ack_checker", lambda rc: AckChecker(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
