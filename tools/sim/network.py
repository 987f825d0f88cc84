"""The simulated network: links between nodes and clients (loss, duplication, delay,
reordering, partitions while faults are on; one connection is FIFO) and the in-node channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipc.codes import Role
from tools.sim.clients import ClientActor
from tools.sim.config import CLIENT

if TYPE_CHECKING:
    from tools.sim import actors as A
    from tools.sim.config import Node

_CHANNEL_NAME = {"dispatcher": "dispatchers", "ack_checker": "ack"}


class NetworkMixin:
    """`Sim`'s network: needs `rng`, `now`, `faulting`, `blocked`, `fifo`, the seed's
    probabilities (`p_drop`, ...) and `schedule`."""

    def _latency(self) -> int:
        r = self.rng
        d = r.randint(1, 4)
        if self.faulting and r.random() < self.p_spike:
            d += r.randint(20, 600)
        return d

    def net_send(self, src: int, dst: int, dst_actor: A.Actor, kind: str, payload: Any,
                 src_key: str, *, client: bool = False) -> None:
        """Between nodes (or a client and a node): partitions, loss, duplication, delay, reordering."""
        r = self.rng
        if self.faulting:
            if (src, dst) in self.blocked:
                self.trace_event(src_key, "drop", payload)
                return
            if r.random() < self.p_drop:
                self.trace_event(src_key, "drop", payload)
                return
        copies = 2 if (self.faulting and not client and r.random() < self.p_dup) else 1
        link = (src_key, dst_actor.key)
        for _ in range(copies):
            at = self.now + self._latency()
            if client or not (self.faulting and r.random() < self.p_reorder):
                at = max(at, self.fifo.get(link, 0))  # one connection is FIFO
                self.fifo[link] = at
            self.schedule(at, "msg", (dst_actor.key, dst_actor.inc, kind, payload))

    def _node_actor(self, n: Node, role: str) -> A.Actor | None:
        a = n.roles.get(role)
        return a if a is not None and a.alive else None

    def elector_send(self, n: Node, src: A.Actor, peer: str, frame: bytes) -> bool:
        dst = self.by_id.get(peer)
        if dst is None:
            return False
        a = self._node_actor(dst, "elector")
        if a is None:
            return False  # IMMEDIATE dealer: nobody listening there
        ident = b"e:%d:%d" % (n.idx, src.inc)
        self.net_send(n.idx, dst.idx, a, "req", (ident, frame), src.key)
        return True

    def data_send(self, n: Node, src: A.Actor, peer: str, payload: tuple[bytes, bytes]) -> bool:
        dst = self.by_id.get(peer)
        if dst is None:
            return False
        a = self._node_actor(dst, "handler")
        if a is None:
            return False
        if self.installs:
            self._install_frame(n, dst, src, payload[1])
        if self.faulting and self.p_corrupt and self.rng.random() < self.p_corrupt:
            payload = self._corrupt_push(payload, src.key)
        self.net_send(n.idx, dst.idx, a, "frame", payload, src.key)
        return True

    def client_send(self, c: ClientActor, node_idx: int, frame: bytes) -> None:
        n = self.nodes[node_idx]
        a = self._node_actor(n, "handler")
        if a is None:
            return  # connection refused: the client times out
        self.net_send(CLIENT, node_idx, a, "frame", (c.ident, frame), c.key, client=True)
        if (self.p_handler_restart and self.faulting and n.block.member.role == Role.LEADER
                and isinstance(c, ClientActor) and c.w.sid and self.rng.random() < self.p_handler_restart):
            # fault handler-restart: the leader's handler dies once this stamped append has
            # reached it (stored, its answer not sent yet, or not even read), and the
            # supervisor restarts it in the same term: the resend meets the rebuilt table
            ms = self.rng.randint(5, 40)

            def kill() -> None:
                h = self._node_actor(n, "handler")
                if h is not None and self.faulting:
                    self.stats["handler_restarts"] += 1
                    self.kill_actor(h, "after a stamped append")

            self.schedule(self.now + ms, "call", kill)

    def route_reply(self, n: Node, src: A.Actor, parts: tuple[bytes, bytes]) -> bool:
        """A ROUTER reply: the identity names the connection it goes back on."""
        ident, frame = parts
        f = ident.split(b":")
        if f[0] == b"c" and self.stamped:
            self._check_answer(n, ident, frame)
        if f[0] == b"c" and n.answers_lost_until > self.now:
            self.trace_event(src.key, "drop", frame)
            return True
        if f[0] == b"c":
            a = self.actor("reader" if f[1] == b"r" else f"client{int(f[1])}")
            if a is not None:
                self.net_send(n.idx, CLIENT, a, "reply", frame, src.key, client=True)
            return True
        if f[0] == b"e":
            dst = self.nodes[int(f[1])]
            a = self._node_actor(dst, "elector")
            if a is not None and a.inc == int(f[2]):
                self.net_send(n.idx, dst.idx, a, "resp", frame, src.key)
            return True
        if f[0] == b"d":
            dst = self.nodes[int(f[1])]
            a = self.actor(f"{dst.id}.d{int(f[2])}")
            if a is not None and a.alive and a.inc == int(f[3]):
                self.net_send(n.idx, dst.idx, a, "reply", frame, src.key)
            return True
        return True

    def intra(self, n: Node, roles: tuple[str, ...], kind: str, payload: Any) -> bool:
        """In-node channels (ipc://): no loss, sub-millisecond, hints only."""
        ok = False
        for a in list(n.roles.values()):
            if _CHANNEL_NAME.get(a.role, a.role) in roles and a.alive:
                self.schedule(self.now + self.rng.randint(0, 1), "msg", (a.key, a.inc, kind, payload))
                ok = True
        return ok

    def intra_fifo(self, src: A.Actor, dst: A.Actor, kind: str, payload: Any) -> None:
        """An in-node message on a stream (PUSH/PULL, DEALER/ROUTER over ipc://): in order, 0-1
        ms, lost if `dst` dies first."""
        link = (src.key, dst.key)
        at = max(self.now + self.rng.randint(0, 1), self.fifo.get(link, 0))
        self.fifo[link] = at
        self.schedule(at, "msg", (dst.key, dst.inc, kind, payload))

    def _isolate(self, nodes: list[int]) -> list[tuple[int, int]]:
        inside = set(nodes)
        outside = [m.idx for m in self.nodes if m.idx not in inside]
        return [(a, b) for a in sorted(inside) for b in outside] + [(b, a) for a in sorted(inside) for b in outside]

    def _cut(self, links: list[tuple[int, int]], desc: str, ms: int) -> None:
        if not self.faulting:
            return  # a shape's later step after the heal: faults are over
        links = [ln for ln in links if ln not in self.blocked]
        self.blocked.update(links)
        self.trace_event("net", "cut", f"{desc} for {ms} ms")

        def heal() -> None:
            self.blocked.difference_update(links)
            self.trace_event("net", "heal", desc)

        self.schedule(self.now + ms, "call", heal)
