"""Ask every node of a group for METADATA with the status trailer, in parallel, once or again
and again (`dledger health`, `dledger top`).

Why not `DLedgerClient.metadata()`: these tools need each node's raw answer -- its peers'
match indexes and the status trailer (version, disk, append-latency buckets) -- and a dead
node must cost one short wait per refresh, not a client's retries. One DEALER per node, kept
open across refreshes (reconnects are ZeroMQ's); answers are matched by request id, so a late
answer to an earlier round is ignored.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.security import client_curve
from ipc.sockets import data_address, parse_peers


@dataclass
class NodeAnswer:
    """One node's answer in one round (``meta`` None: it did not answer in time)."""

    id: str
    address: str
    meta: P.MetadataResponse | None = None
    error: str = ""
    at: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.meta is not None

    @property
    def role(self) -> str | None:
        return Role(self.meta.role).name if self.meta is not None else None


class GroupProbe:
    """Persistent per-node sockets; `round()` asks everyone and waits up to `timeout` s."""

    def __init__(self, peers: str, group: str = "default", timeout: float = 1.0,
                 key_file: str | os.PathLike[str] | None = None) -> None:
        self.peers = parse_peers(peers)
        # a secure group: every probe socket is a CURVE client with this key (ipc.security)
        curve = client_curve(key_file) if key_file is not None else None
        self.group = group
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.socks: dict[str, zmq.Socket] = {}
        self.rid = 0
        for nid, (host, port) in self.peers.items():
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 16)
            s.setsockopt(zmq.MAXMSGSIZE, P.DEFAULT_MAX_FRAME)
            try:
                if curve is not None:
                    curve.apply(s, nid)
                s.connect(data_address(host, port))
            except (zmq.ZMQError, ValueError):
                s.close(linger=0)
                self.close()
                raise
            self.socks[nid] = s

    def round(self, want_config: bool = False) -> list[NodeAnswer]:
        """One METADATA (with status; with `want_config` the newest configuration in each
        node's log too) to every node; answers in peers order."""
        self.rid += 1
        rid = self.rid
        answers = {nid: NodeAnswer(nid, f"{h}:{p}") for nid, (h, p) in self.peers.items()}
        poller = zmq.Poller()
        waiting: dict[zmq.Socket, str] = {}
        for nid, s in self.socks.items():
            try:
                s.send(P.encode(P.MetadataRequest(self.group, nid, rid, want_status=True,
                                                  want_config=want_config)), zmq.NOBLOCK)
            except zmq.Again:
                answers[nid].error = "send queue full"
                continue
            poller.register(s, zmq.POLLIN)
            waiting[s] = nid
        deadline = time.monotonic() + self.timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for s, _ev in poller.poll(left * 1000):
                nid = waiting.get(s)
                while nid is not None:
                    try:
                        frame = s.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        msg = P.decode(frame)
                    except P.ProtocolError as e:
                        answers[nid].error = f"bad answer: {e}"
                        continue
                    if msg.request_id != rid:
                        continue  # a late answer to an earlier round
                    if isinstance(msg, P.MetadataResponse) and msg.code == RC.SUCCESS:
                        answers[nid].meta = msg
                        answers[nid].at = time.monotonic()
                    else:
                        answers[nid].error = f"{RC.name_of(getattr(msg, 'code', -1))}: " \
                                             f"{getattr(msg, 'reason', '')}".rstrip(": ")
                    poller.unregister(s)
                    del waiting[s]
                    nid = None
        return [answers[nid] for nid in self.peers]

    def close(self) -> None:
        for s in self.socks.values():
            s.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> GroupProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class GroupView:
    """What a round says about the group as a whole (health's and top's common reading)."""

    answers: list[NodeAnswer]
    leaders: list[NodeAnswer]  # nodes that claim LEADER in the highest claimed term
    term: int | None
    leader: NodeAnswer | None
    lag: dict[str, int]  # follower id -> leader end index - its match index (leader's view)


def read_group(answers: list[NodeAnswer]) -> GroupView:
    """Leaders (of the highest term claimed), the leader if exactly one, followers' lag."""
    live = [a for a in answers if a.meta is not None]
    claims = [a for a in live if a.meta.role == Role.LEADER]
    term = max((a.meta.term for a in live), default=None)
    top_term = max((a.meta.term for a in claims), default=None)
    leaders = [a for a in claims if a.meta.term == top_term]
    leader = leaders[0] if len(leaders) == 1 else None
    lag: dict[str, int] = {}
    if leader is not None:
        end = leader.meta.ledger_end_index
        for p in leader.meta.peers:
            if p.id != leader.id:
                lag[p.id] = max(0, end - p.match_index)
    return GroupView(answers, leaders, term, leader, lag)


def member_set_problem(answers: list[NodeAnswer]) -> str | None:
    """Why the members that answered do not agree on who the members are (each METADATA lists
    its node's whole member set with addresses), or None. A node started with another peers
    string (a 4th member the others do not know, a changed address) can never be elected and
    keeps the group from being what the operator thinks it is."""
    sets: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for a in answers:
        if a.meta is not None:
            key = tuple(sorted((p.id, p.address) for p in a.meta.peers))
            sets.setdefault(key, []).append(a.id)
    given = tuple(sorted((a.id, a.address) for a in answers))
    if len(sets) > 1:
        views = "; ".join(f"{', '.join(ids)} list {', '.join(f'{i}-{addr}' for i, addr in key)}"
                          for key, ids in sorted(sets.items(), key=lambda kv: kv[1]))
        return f"members disagree on the member set: {views}"
    if sets:
        (key,) = sets
        # Members added or removed online (docs/operations.md "Membership changes") make the
        # group's set differ from a --peers string written before: not a problem. The same id
        # at another address is (a wrong --peers, or two machines claiming one id).
        listed = dict(key)
        moved = [i for i, addr in given if i in listed and listed[i] != addr]
        if moved:
            return (f"the group's members are {', '.join(f'{i}-{addr}' for i, addr in key)}, "
                    "not the --peers given")
    return None


def node_extras(peers: str, group: str, timeout: float,
                key_file: str | os.PathLike[str] | None = None) -> dict[str, dict[str, object]]:
    """Per node id: `lag` (entries behind the leader, leader's view; None for the leader and
    when unknown), `version`, `store_bytes`, `disk_usage_ratio`, and from the newest
    configuration in the node's own log `config_index` (-1: still the `--peers` one) and
    `member` (voter, learner or removed, as that node sees itself) -- what `dledger metadata`
    adds to the documented fields of `dledger metadata --json` (docs/client.md "CLI") (None where a
    node did not answer with a status trailer, or is older than the configuration)."""
    with GroupProbe(peers, group, timeout=timeout, key_file=key_file) as probe:
        view = read_group(probe.round(want_config=True))
    out: dict[str, dict[str, object]] = {}
    for a in view.answers:
        st = a.meta.status if a.meta is not None else None
        conf = st.configuration if st else None
        member = None
        if conf is not None:
            member = "voter" if a.id in conf[1] else "learner" if a.id in conf[2] else "removed"
        out[a.id] = {"lag": view.lag.get(a.id),
                     "version": st.version if st else None,
                     "store_bytes": st.store_bytes if st else None,
                     "disk_usage_ratio": round(st.disk_usage_ratio, 4) if st else None,
                     "config_index": conf[0] if conf is not None else None,
                     "member": member}
    return out
