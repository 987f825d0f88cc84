"""A simulated cluster of ElectorCore instances: fake network, fake durable storage, fake clock.

Used by the datadriven scenario runner (test_election_scenarios.py) and the random-fault runs
(test_election_random_faults.py). Everything is seeded, so a failing seed replays exactly.

Model (close to what the real process layer does, docs/design.md and docs/election.md):

- Network: every Send/Reply becomes a delivery event after a random latency; a link can be cut
  (partition: messages vanish silently, the sender's round deadline expires) or lossy (random
  drop). A request to a *crashed* node fails fast (``on_peer_unreachable``), as a ZeroMQ DEALER
  with IMMEDIATE does when the peer's TCP connection is gone.
- Storage: ``Persist`` effects are the only thing that survives ``crash``/``restart``
  (the currterm file). The ledger end survives too (the store is on disk).
- Process loop: after each input the node's ``tick`` runs; a node is also ticked at its
  ``next_deadline_ms``. A paused node (SIGSTOP) processes nothing until it resumes.
- Replication is modelled just enough to make log comparisons matter: a new leader appends one
  entry (the NOOP of docs/contracts.md C9; ``noop=False`` turns that off, as in DLedger without it),
  `append` adds entries on the leader, and a follower that answers a heartbeat with SUCCESS takes
  the leader's ledger end at send time.

Invariants are checked on every effect (``InvariantError``):
at most one leader per term, ever; a node never becomes leader twice in one term (not after
stepping down, not after a restart: its log may have lost a tail it had sent, and two different
entries could then share an (index, term)); a node never grants votes to two candidates in one term
(across restarts, via what it persisted); terms never go back; persist-before-send (an ACCEPT
leaves only after the vote is durable).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from ipc.codes import ResponseCode, Role, VoteResult
from ipc.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    TakeLeadershipRequest,
    TakeLeadershipResponse,
    VoteRequest,
    VoteResponse,
)
from node.core.election import (
    ElectionConfig,
    ElectorCore,
    LedgerEnd,
    Persist,
    Reply,
    RoleChanged,
    Send,
    Step,
)

INF = float("inf")


class InvariantError(AssertionError):
    pass


@dataclass
class SimNode:
    id: str
    core: ElectorCore
    durable: tuple[int, str | None] = (0, None)
    ledger: LedgerEnd = LedgerEnd()
    alive: bool = True
    paused_until: int = 0
    deadline: int = 0


@dataclass(order=True)
class _Event:
    at: int
    seq: int
    kind: str = field(compare=False)  # "deliver" | "unreachable"
    dst: str = field(compare=False)
    msg: object = field(compare=False, default=None)
    token: object = field(compare=False, default=None)
    extra: object = field(compare=False, default=None)
    epoch: int = field(compare=False, default=0)  # dst incarnation the event is meant for


class Sim:
    def __init__(self, n: int, seed: int = 0, cfg: ElectionConfig | None = None,
                 latency: tuple[int, int] = (1, 10), drop: float = 0.0,
                 trace_persist: bool = False, noop: bool = True) -> None:
        self.cfg = cfg or ElectionConfig()
        self.rng = random.Random(seed)
        self.ids = [f"n{i}" for i in range(n)]
        self.now = 0
        self.latency = latency
        self.drop = drop
        self.cut: set[frozenset[str]] = set()
        self.queue: list[_Event] = []
        self._seq = 0
        self.epochs = dict.fromkeys(self.ids, 0)
        self.trace: list[str] = []
        self.trace_persist = trace_persist
        self.noop = noop  # a new leader appends a no-op entry (C9); off = DLedger 0.x
        self.leaders: dict[int, str] = {}  # term -> leader, over the whole history
        self.led: set[int] = set()  # terms in which somebody became leader (once each)
        self.votes: dict[tuple[str, int], str] = {}  # (voter, term) -> candidate
        self.role_changes = 0
        self.take_replies: list[TakeLeadershipResponse] = []
        self.nodes: dict[str, SimNode] = {}
        for i in self.ids:
            node = SimNode(i, self._core(i, 0, None))
            self.nodes[i] = node
        for node in self.nodes.values():
            self._apply(node, node.core.tick(self.now, node.ledger))

    # ------------------------------------------------------------------ construction

    def _core(self, nid: str, term: int, voted: str | None) -> ElectorCore:
        return ElectorCore(nid, self.ids, "default", self.cfg, random.Random(self.rng.random()),
                           term=term, voted_for=voted, now_ms=self.now)

    # ------------------------------------------------------------------ faults

    def crash(self, nid: str) -> None:
        node = self.nodes[nid]
        node.alive = False
        self.epochs[nid] += 1  # messages in flight to the old incarnation are lost
        self.log(f"{nid} crashed")

    def restart(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.alive:
            return
        term, voted = node.durable
        node.core = self._core(nid, term, voted)
        node.alive = True
        node.paused_until = 0
        self.log(f"{nid} restarted term={term} voted={voted or '-'}")
        self._apply(node, node.core.tick(self.now, node.ledger))

    def pause(self, nid: str, ms: int) -> None:
        self.nodes[nid].paused_until = self.now + ms
        self.log(f"{nid} paused {ms}ms")

    def partition(self, *groups: list[str]) -> None:
        """Cut every link between different groups (nodes not listed form their own group)."""
        listed = {i for g in groups for i in g}
        all_groups = [set(g) for g in groups] + [{i} for i in self.ids if i not in listed]
        self.cut = {frozenset((a, b)) for g1 in all_groups for g2 in all_groups if g1 is not g2
                    for a in g1 for b in g2}
        self.log("partition " + " | ".join(" ".join(sorted(g)) for g in all_groups))

    def isolate(self, nid: str) -> None:
        self.partition([nid], [i for i in self.ids if i != nid])

    def heal(self) -> None:
        self.cut = set()
        self.log("healed")

    def append(self, count: int = 1) -> str | None:
        """Simulate client appends on the current leader (if any)."""
        lead = self.leader()
        if lead is None:
            return None
        node = self.nodes[lead]
        node.ledger = LedgerEnd(node.ledger.index + count, node.core.term)
        return lead

    def take_leadership(self, transferee: str) -> None:
        """What the old leader's transfer logic sends once the transferee caught up."""
        lead = self.leader()
        term = self.nodes[lead].core.term if lead else self.nodes[transferee].core.term
        req = TakeLeadershipRequest("default", transferee, lead or self.ids[0], term,
                                    request_id=10**9 + self._seq)
        self._schedule(transferee, "deliver", req, token=("client", None))

    # ------------------------------------------------------------------ observation

    def log(self, line: str) -> None:
        self.trace.append(f"t={self.now:>5} {line}")

    def leader(self) -> str | None:
        """The leader every live, reachable node agrees on, if any (stable leadership)."""
        live = [n for n in self.nodes.values() if n.alive]
        leaders = [n for n in live if n.core.role == Role.LEADER]
        if len(leaders) != 1:
            return None
        lead = leaders[0]
        for n in live:
            if n is lead:
                continue
            if frozenset((n.id, lead.id)) in self.cut:
                continue
            if n.core.role != Role.FOLLOWER or n.core.leader_id != lead.id \
                    or n.core.term != lead.core.term:
                return None
        return lead.id

    def status(self) -> list[str]:
        out = []
        for n in self.nodes.values():
            c = n.core
            state = "DOWN" if not n.alive else c.role.name
            out.append(f"{n.id} {state} term={c.term} leader={c.leader_id or '-'} "
                       f"voted={c.voted_for or '-'} ledger={n.ledger.index}@{n.ledger.term}")
        return out

    # ------------------------------------------------------------------ running

    def run(self, ms: int) -> None:
        self.run_until(self.now + ms)

    def run_until(self, t_end: int, stop=None) -> bool:
        """Process events until t_end (or until `stop()` is true). Returns whether it stopped."""
        while True:
            if stop is not None and stop():
                return True
            t_q = self.queue[0].at if self.queue else INF
            t_n, tick_node = INF, None
            for n in self.nodes.values():
                if not n.alive:
                    continue
                t = max(n.deadline, n.paused_until)
                if t < t_n:
                    t_n, tick_node = t, n
            t = min(t_q, t_n)
            if t > t_end:
                self.now = t_end
                return False
            self.now = max(self.now, int(t))
            if t_q <= t_n:
                self._process(heapq.heappop(self.queue))
            else:
                assert tick_node is not None
                self._apply(tick_node, tick_node.core.tick(self.now, tick_node.ledger))

    def stabilize(self, max_ms: int = 10_000) -> int | None:
        """Run until one agreed leader exists; returns the time it took, or None."""
        start = self.now
        if self.run_until(self.now + max_ms, stop=lambda: self.leader() is not None):
            return self.now - start
        return None

    def _process(self, ev: _Event) -> None:
        node = self.nodes[ev.dst]
        if not node.alive or ev.epoch != self.epochs[ev.dst]:
            return  # lost with the crashed process
        if node.paused_until > self.now:
            ev.at = node.paused_until  # the kernel queues it; the process reads it later
            heapq.heappush(self.queue, ev)
            return
        if ev.kind == "unreachable":
            self._apply(node, node.core.on_peer_unreachable(ev.msg, self.now))
        else:
            msg = ev.msg
            step = node.core.handle(msg, self.now, node.ledger, token=ev.token)
            self._apply(node, step, request=msg, extra=ev.extra)
        self._apply(node, node.core.tick(self.now, node.ledger))

    def _schedule(self, dst: str, kind: str, msg, token=None, extra=None, delay=None) -> None:
        self._seq += 1
        if delay is None:
            delay = self.rng.randint(*self.latency)
        heapq.heappush(self.queue, _Event(self.now + delay, self._seq, kind, dst, msg, token,
                                          extra, self.epochs[dst]))

    def _link_ok(self, a: str, b: str) -> bool:
        if frozenset((a, b)) in self.cut:
            return False
        return not (self.drop and self.rng.random() < self.drop)

    # ------------------------------------------------------------------ effects + invariants

    def _apply(self, node: SimNode, step: Step, request=None, extra=None) -> None:
        seen_persist = False
        for i, eff in enumerate(step.effects):
            if isinstance(eff, Persist):
                if seen_persist or i != 0:
                    raise InvariantError(f"{node.id}: Persist not first/unique in {step.effects}")
                seen_persist = True
                self._check_persist(node, eff)
                node.durable = (eff.term, eff.voted_for)
                if self.trace_persist:
                    self.log(f"{node.id} persist term={eff.term} voted={eff.voted_for or '-'}")
            elif isinstance(eff, RoleChanged):
                self._on_role(node, eff)
            elif isinstance(eff, Send):
                self._send(node, eff)
            elif isinstance(eff, Reply):
                self._reply(node, eff, request, extra)
        node.deadline = step.next_deadline_ms

    def _check_persist(self, node: SimNode, eff: Persist) -> None:
        old_term, old_vote = node.durable
        if eff.term < old_term:
            raise InvariantError(f"{node.id}: term went back {old_term} -> {eff.term}")
        if eff.term == old_term and old_vote is not None and eff.voted_for != old_vote:
            raise InvariantError(f"{node.id}: vote changed in term {eff.term}: "
                                 f"{old_vote} -> {eff.voted_for}")
        if eff.voted_for is not None:
            self._record_vote(node.id, eff.term, eff.voted_for)

    def _record_vote(self, voter: str, term: int, cand: str) -> None:
        prev = self.votes.setdefault((voter, term), cand)
        if prev != cand:
            raise InvariantError(f"{voter} voted for {prev} and {cand} in term {term}")

    def _on_role(self, node: SimNode, eff: RoleChanged) -> None:
        self.role_changes += 1
        self.log(f"{node.id} {eff.role.name} term={eff.term} leader={eff.leader_id or '-'}")
        if eff.role == Role.LEADER:
            prev = self.leaders.setdefault(eff.term, node.id)
            if prev != node.id:
                raise InvariantError(f"two leaders in term {eff.term}: {prev} and {node.id}")
            if eff.term in self.led:
                raise InvariantError(f"{node.id} became leader of term {eff.term} a second time")
            self.led.add(eff.term)
            # A new leader writes its no-op entry in its own term (docs/contracts.md C9, DLedger #305).
            if self.noop:
                node.ledger = LedgerEnd(node.ledger.index + 1, eff.term)

    def _send(self, node: SimNode, eff: Send) -> None:
        dst = self.nodes[eff.peer]
        msg = eff.message
        if not dst.alive:
            # IMMEDIATE dealer, peer's connection gone: the send fails at once.
            self._schedule(node.id, "unreachable", msg.request_id, delay=1)
            return
        if not self._link_ok(node.id, eff.peer):
            return
        extra = node.ledger if isinstance(msg, HeartbeatRequest) else None
        self._schedule(eff.peer, "deliver", msg, token=(node.id, msg.request_id), extra=extra)

    def _reply(self, node: SimNode, eff: Reply, request, extra) -> None:
        msg = eff.message
        if isinstance(msg, VoteResponse) and msg.vote_result == VoteResult.ACCEPT:
            assert isinstance(request, VoteRequest)
            # A grant is a vote in the REQUEST's term, durable before it leaves.
            if node.durable != (request.term, request.leader_id):
                raise InvariantError(f"{node.id} sent ACCEPT for {request.leader_id} in term "
                                     f"{request.term} without having persisted exactly that "
                                     f"vote ({node.durable})")
            self._record_vote(node.id, request.term, request.leader_id)
        if isinstance(msg, HeartbeatResponse) and msg.code == ResponseCode.SUCCESS \
                and extra is not None:
            node.ledger = extra  # replication, abstracted: the follower now has the leader's log
        if isinstance(msg, TakeLeadershipResponse):
            self.take_replies.append(msg)
            self.log(f"{node.id} take-leadership reply {ResponseCode.name_of(msg.code)} "
                     f"term={msg.term}")
            return
        dst, _rid = eff.token
        if dst == "client":
            return
        if self._link_ok(node.id, dst):
            self._schedule(dst, "deliver", msg)
