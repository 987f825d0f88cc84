"""Leader discovery: which node leads, and the calls parked until one is known.

While no leader is known, calls wait here and the I/O thread asks every node for METADATA in
parallel; the first leader claim releases them, a higher-term claim in the same round replaces
it. Appends are therefore never sent "to see what happens" to a node that might be dead, which
would turn a definite failure into an indeterminate one. Rounds that find nothing are repeated
with a capped backoff. A node's answer also names the members, so a client given one reachable
node learns the rest (Kafka's bootstrap.servers).

Owned by the I/O thread; it reaches sockets, timers and calls only through `DiscoveryHost`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ipc import protocol as P
from ipc.client.calls import WAITING, Call, backoff
from ipc.client.connections import Connections, Node
from ipc.client.results import DLedgerError
from ipc.client.timers import Timer
from ipc.codes import ResponseCode as RC
from ipc.codes import Role, is_retryable

log = logging.getLogger("dledger.client")


class DiscoveryHost(Protocol):
    """What discovery needs from the I/O thread."""

    group: str
    attempt_timeout: float
    conns: Connections

    def next_rid(self) -> int: ...
    def set_timer(self, obj: Any, at: float) -> None: ...
    def dispatch(self, call: Call, now: float) -> None: ...
    def finish(self, call: Call, result: Any = None, exc: BaseException | None = None) -> None: ...
    def mark_suspect(self, node: Node) -> None: ...


class Round:
    """One round of "who is the leader?": METADATA to every node at once."""

    __slots__ = ("rids", "found", "best_term", "answered", "errors", "timer_seq")

    def __init__(self) -> None:
        self.rids: dict[int, str] = {}
        self.found = False
        self.best_term = -1
        self.answered = 0
        self.errors: list[tuple[int, str]] = []
        self.timer_seq = -1


class LeaderDiscovery:
    """The leader hint, the calls waiting for one, and the METADATA rounds that find it.

    Invariant: a call waits in `waiting` only while no leader is known (see `set_leader`)."""

    def __init__(self, host: DiscoveryHost) -> None:
        self.host = host
        self.leader: str | None = None
        self.waiting: list[Call] = []
        self.round: Round | None = None
        self._start = Timer()  # the next round, when one may not start at once
        self._last = -math.inf
        self._streak = 0  # rounds since a call last succeeded: the backoff between rounds

    # ------------------------------------------------------------------ the leader hint
    def set_leader(self, node_id: str, now: float) -> None:
        """A leader is known: every call parked for one is sent now.

        A send that fails (no connection yet) forgets the leader and parks the call again, and
        a later answer may name the same leader while a discovery round is scheduled; a call
        parked then and not released here would sit until its deadline with the leader known."""
        self.leader = node_id
        if self.waiting:
            self.release_waiting(now)

    def forget(self, node_id: str) -> None:
        """`node_id` is not (or no longer known to be) the leader."""
        if self.leader == node_id:
            self.leader = None

    def succeeded(self) -> None:
        """A call succeeded: the next round (if any) may start at once."""
        self._streak = 0

    # ------------------------------------------------------------------ parked calls
    def park(self, call: Call, now: float) -> None:
        """`call` needs a leader and none is known: wait (until its deadline) for a round."""
        call.state = WAITING
        self.waiting.append(call)
        self.host.set_timer(call, call.deadline)
        self.need_leader(now)

    def has_waiting(self) -> bool:
        return any(c.state == WAITING for c in self.waiting)

    def take_waiting(self) -> list[Call]:
        w, self.waiting = self.waiting, []
        return [c for c in w if c.state == WAITING]

    def release_waiting(self, now: float) -> None:
        for call in self.take_waiting():
            self.host.dispatch(call, now)

    # ------------------------------------------------------------------ rounds
    def need_leader(self, now: float) -> None:
        d = self.round
        if d is not None and not d.found:
            return  # a round is already asking
        if self._start.timer_seq >= 0:
            return  # a round is already scheduled
        gap = 0.0 if self._streak == 0 else backoff(self._streak)
        if now - self._last >= gap:
            self.start_round(now)
        else:
            self.host.set_timer(self._start, self._last + gap)

    def start_round(self, now: float) -> None:
        self._last = now
        self._streak += 1
        d = Round()
        self.round = d
        host = self.host
        for node in host.conns.order:
            rid = host.next_rid()
            if host.conns.try_send(node, P.encode(P.MetadataRequest(host.group, node.id, rid))):
                d.rids[rid] = node.id
        if not d.rids:
            self.end_round(now)
            return
        host.set_timer(d, now + host.attempt_timeout)

    def on_timer(self, obj: Any, now: float) -> bool:
        """Handle a timer of discovery's own; False if `obj` is not one."""
        if obj is self._start:
            if self.leader is not None:
                self.release_waiting(now)
            elif self.has_waiting():
                self.start_round(now)
            return True
        if obj is self.round:
            for nid in obj.rids.values():
                self.host.mark_suspect(self.host.conns.nodes[nid])
            self.end_round(now)
            return True
        return False

    def on_reply(self, rid: int, msg: P.Message) -> bool:
        """An answer that matched no call: True if it was one to the current round."""
        d = self.round
        if d is None or rid not in d.rids:
            return False
        nodes = self.host.conns.nodes
        node_id = d.rids.pop(rid)
        d.answered += 1
        code = getattr(msg, "code", RC.UNKNOWN)
        if isinstance(msg, P.MetadataResponse) and code == RC.SUCCESS:
            self._learn_members(msg.peers)
            claim = node_id if msg.role == Role.LEADER else msg.leader_id
            # A follower may still name a leader that stopped answering us (stalled or dead,
            # the election not over yet): sending appends there would only make them
            # indeterminate, so wait for a claim naming a node that answers.
            if (claim in nodes and msg.term >= d.best_term
                    and not nodes[claim].unresponsive):
                d.best_term = msg.term
                d.found = True
                if self.leader != claim:
                    log.debug("leader is %s (term %d, said %s)", claim, msg.term, node_id)
                self.set_leader(claim, time.monotonic())
        elif not is_retryable(code):
            d.errors.append((code, getattr(msg, "reason", "") or f"from {node_id}"))
        if self.round is d and not d.found and all(
                nodes[n].unresponsive for n in d.rids.values()):
            # Everyone still expected is a node known to be silent: do not wait for it, ask
            # again soon instead (an election may be finishing elsewhere).
            d.timer_seq = -1
            self.end_round(time.monotonic())
        elif not d.rids and self.round is d:
            d.timer_seq = -1
            self.end_round(time.monotonic())
        return True

    def end_round(self, now: float) -> None:
        d = self.round
        self.round = None
        if self.leader is not None:
            self.release_waiting(now)
            return
        if not self.has_waiting():
            return
        if d is not None and d.answered and len(d.errors) == d.answered:
            # Every node that answered refused us (wrong group, unknown member...): waiting
            # would only end in a timeout that hides the real problem.
            code, reason = d.errors[0]
            for call in self.take_waiting():
                self.host.finish(call, exc=DLedgerError(code, reason))
            return
        self.need_leader(now)

    def _learn_members(self, peers: Sequence[P.PeerInfo]) -> None:
        """Bootstrap (Kafka's bootstrap.servers): members a node names in METADATA that this
        client was not given are added, so a client started from any one reachable node finds
        the leader and fails over like one given the whole peers string."""
        conns = self.host.conns
        new = {}
        for info in peers:
            if info.id in conns.nodes or not info.address:
                continue
            host, colon, port_s = info.address.rpartition(":")
            try:
                port = int(port_s)
            except ValueError:
                continue
            if not colon or not host or not 0 < port < 65536:
                continue
            new[info.id] = (host.strip("[]"), port)
        if new and conns.add_members(new):
            log.debug("learned members %s from METADATA", ", ".join(new))
