"""The ack checker role (DLedger's QuorumAckChecker), active while this node leads.

Woken by the dispatchers whenever a follower's watermark moves (and by role changes), it
computes the quorum index from the *current term's* watermarks — the leader's own ledger end
and each follower's match index whose match term is the current term (older terms' watermarks
count as -1, which is how they are "cleaned") — and accepts it only if the entry there is of
the current term (Raft §5.4.2). The result goes to the shared block (quorum_index, quorum_term)
and a wake-up to the handler, which owns the pending client replies: it advances the committed
index, answers SUCCESS, and times out or fails (TERM_CHANGED) what cannot complete.
"""

from __future__ import annotations

import zmq

from ipc.codes import Role
from ipc.sockets import drain, pull, push, sub
from node import channels
from node.core.replication import commit_index, quorum_index
from node.roles.runtime import RoleContext, role_main
from node.store.reader import StaleRead, StoreReader


class AckChecker:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.state = rc.state
        self.self_slot = rc.cfg.self_slot
        self.n = len(rc.cfg.peer_ids)
        self.reader = StoreReader(rc.cfg.store_dir)

    def check(self) -> bool:
        """One quorum computation; True if the quorum index moved."""
        m = self.state.read_member()
        if m.role != Role.LEADER:
            return False
        term = m.current_term
        led = self.state.read_ledger()
        marks = []
        for slot in range(self.n):
            if slot == self.self_slot:
                marks.append(led.ledger_end_index)
            else:
                p = self.state.read_peer(slot)
                marks.append(p.match_index if p.match_term == term else -1)
        q = quorum_index(marks)
        prev = self.state.read_quorum()
        committed = prev.quorum_index if prev.quorum_term == term else -1
        if q <= committed or q < 0:
            return False
        try:
            t = self.reader.term_at(q)
        except StaleRead:
            return False
        new = commit_index(q, t, term, committed)
        if new == committed:
            return False
        self.state.write_quorum(quorum_index=new, quorum_term=term)
        self.state.incr("quorum_advances")
        return True

    def run(self) -> None:
        rc = self.rc
        acks = pull(rc.zctx, rc.channel(channels.ACK))
        roles = sub(rc.zctx, rc.channel(channels.ROLE))
        appended = sub(rc.zctx, rc.channel(channels.APPENDED), conflate=True)  # a 1-node group's own end
        wake_handler = push(rc.zctx, rc.channel(channels.COMMIT))
        poller = zmq.Poller()
        for s in (acks, roles, appended, rc.wake_fd):
            poller.register(s, zmq.POLLIN)
        while not rc.should_stop():
            events = dict(poller.poll(1000))
            if rc.wake_fd in events:
                rc.drain_wake()
                del events[rc.wake_fd]
            for s in events:
                drain(s)
            self.reader.follow_begin(self.state.read_ledger().ledger_begin_index)  # unmap deleted files
            if self.check():
                try:
                    wake_handler.send(channels.COMMIT_MSG, zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the handler also re-reads the quorum on its own timer
            rc.beat()
        self.reader.close()


def main() -> int:
    return role_main("ack_checker", lambda rc: AckChecker(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
