"""The deterministic cluster simulator: scheduler, network, faults, clients and invariants.

One `Sim` is one seed: a whole cluster of nodes, each node a set of actors (elector, handler,
one dispatcher per peer, ack checker) running the real role classes (tools/sim/actors.py),
plus client writers, all in one process on virtual time. Every random choice comes from one
`random.Random(seed)`; nothing reads the wall clock, iterates a set, or depends on `id()`, so
a seed replays exactly (`python -m tools.simulate --seed S`).

Scheduling. Virtual time only moves when no actor can run. At each instant the scheduler
picks a random ready actor (one with inbox items or a due timer) and runs one step of it. Any
read of the shared block is a preemption point (tools/sim/state.py): the scheduler may run
other ready actors' steps nested there, respecting the member lock.

See docs/testing.md for the fault model, the invariants and how to read a trace.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import hashlib
import heapq
import logging
import os
import random
import re
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role, is_indeterminate, is_retryable
from node import channels
from node.config import NodeConfig
from node.core.sessions import seq_add
from node.store import codec
from node.store.base import StoreError
from node.store.stamps import _STAMP
from tools.sim import actors as A
from tools.sim.state import NodeBlock, SimLock

ALL_FAULTS = ("drop", "delay", "dup", "reorder", "partition", "crash", "role-crash", "pause", "truncate",
              "clock")
# Opt-in (not in the default set, so default seeds keep their histories):
# corrupt: flip a byte of a push (docs/contracts.md C12); eager-commit: leaders also send COMMIT
# pushes at any time, before COMPARE too (mutation t3-two-reads needs it: see
# DispatcherActor.eager_commit).
# disk-full: a node's appends fail with DiskFull for a while, and at the heal the leader's disk
# fills for 6 s: the group must fail over (docs/contracts.md C5).
# Session faults (each turns the writers' sessions on; see docs/testing.md "Client sessions"):
# session-evict: tiny session-table limits and short sessions; handler-restart: a leader's
# handler killed right after a stamped append reached it; disk-probe: a node's disk probe
# reads full for a while (appends refused before the session check); retention: (segment
# store) every disk reads above the clean ratio, so retention deletes old files under resends;
# bad-client: a writer that sends malformed and duplicated stamps, in MULTI frames.
SESSION_FAULTS = ("session-evict", "handler-restart", "disk-probe", "retention", "bad-client")
# figure8 (5 nodes): the history of Raft's Figure 8, where committing an old-term entry by
# counting replicas loses it (Sim._figure8_shape).
OPT_IN_FAULTS = ("corrupt", "eager-commit", "disk-full", "figure8") + SESSION_FAULTS
TRACE_LEN = 60
RETENTION_RATIO = 0.87  # --state-machine --store segment: the disk every handler measures (clean < it < full)
FAILOVER_MS = 4000  # disk-full: an append must be acknowledged in the last half of this after the fill
CLIENT = -1  # node index of the clients' side of a link


class Violation(BaseException):  # noqa: N818 - BaseException: role code must never swallow it
    """An invariant does not hold."""


class _SimNodeConfig(NodeConfig):
    """NodeConfig with the parsed peer list cached (roles read it on hot paths)."""

    @functools.cached_property
    def peer_map(self) -> dict[str, tuple[str, int]]:  # type: ignore[override]
        return NodeConfig.peer_map.fget(self)  # type: ignore[attr-defined]

    @functools.cached_property
    def peer_ids(self) -> list[str]:  # type: ignore[override]
        return list(self.peer_map)


@dataclass
class SimConfig:
    seed: int = 0
    nodes: int = 3
    faults: tuple[str, ...] = ALL_FAULTS
    steps: int = 500
    store: str = "memory"
    writers: int = 2
    trace_len: int = TRACE_LEN
    hash_trace: bool = False
    heal_ms: int = 20_000  # after the fault phase: time allowed to converge
    preempt: float = 0.25  # probability that a block read is a preemption point that runs others
    max_depth: int = 3
    tmp_root: str | None = None
    sessions: bool = False  # about half the writers use client sessions and resend (exactly-once)
    state_machine: str = ""  # "kv" or "chain": every node runs an applier (tools/sim/smcheck.py)
    installs: bool = True  # with a state machine and the segment store: retention may strand a
    # lagging follower, which the leader then sends its snapshot (False: the old retention floor)


@dataclass
class Node:
    sim: Sim
    idx: int
    id: str
    cfg: NodeConfig
    dir: str
    block: NodeBlock = None  # type: ignore[assignment]
    lock: SimLock = None  # type: ignore[assignment]
    clock_offset: int = 0
    disk_full_until: int = 0  # fault disk-full: its store's appends fail until then
    probe_full_until: int = 0  # fault disk-probe: its disk measurement reads full until then
    answers_lost_until: int = 0  # fault disk-probe: its answers to clients are lost until then
    max_committed: int = -1  # the highest committed index its store or block ever showed
    up: bool = True
    memstore: Any = None  # the memory store outlives handler crashes (it stands for the disk)
    store: Any = None  # the handler's open store, for the invariant checks
    checked: int = -1  # committed entries of this node compared with the history so far
    max_term: int = -1  # highest term its elector ever published (across restarts)
    last_wrote: tuple[int, int] = (0, 0)
    roles: dict[str, A.Actor] = field(default_factory=dict)

    def clock(self) -> int:
        return self.sim.now + self.clock_offset


@dataclass
class Writer:
    wid: int
    window: int = 1  # requests in flight at once (a pipelining client)
    target: int = 0
    next_send: int = 0
    rid: int = 0
    out: dict[int, tuple[list[bytes], int, int]] = field(default_factory=dict)  # rid -> (bodies, node, deadline)
    # client sessions (SimConfig.sessions): rid -> (session, seq, resends, unsure) of a stamped request
    stamps: dict[int, tuple[int, int, int, bool]] = field(default_factory=dict)
    session: bool = False
    attempt_ms: int = 3000  # how long an attempt waits for its answer before it is resent
    short: float = 0.0  # fault session-evict: chance to abandon the session after a send
    requeue: list[list[bytes]] = field(default_factory=list)  # never stored: restamp in a new session
    sid: int = 0
    next_seq: int = 1
    opening: int = 0  # rid of an OPEN_SESSION in flight (0: none)
    acks: dict[tuple[int, int], list[tuple[int, int, int]]] = field(default_factory=dict)
    # (node, term) -> sorted [(rid, first index, last index)]: one leader appends one
    # connection's requests in the order they arrive


# codes a real client (ipc/client/) retries or resends: anything else ends a stamped call
_SESSION_CODES = frozenset({RC.SESSION_EXPIRED, RC.SESSION_SEQ_GAP, RC.SESSION_SEQ_INVALID, RC.SESSION_SEQ_TOO_OLD,
                            RC.SESSION_LIMIT})


def definite_failure(code: int) -> bool:
    """A code ipc/client/ reports as a definite failure of an append ("not stored": raises
    `DLedgerError` with indeterminate=False): neither retryable nor indeterminate, and not
    one of the session codes, which have their own meanings (docs/client.md)."""
    return (code != RC.SUCCESS and not is_retryable(code) and not is_indeterminate(code)
            and code not in _SESSION_CODES)


class ClientActor(A.Actor):
    """A writer: up to `window` APPEND / BATCH_APPEND requests in flight, unique bodies. Without
    a session no payload is retried (an indeterminate failure is simply abandoned). With one
    (SimConfig.sessions), as ipc/client/ does: every request is stamped (session, seq) and
    resent under the same stamp after a timeout, an indeterminate answer, a retryable refusal
    or a gap, so the leader's deduplication (node/core/sessions.py) is what keeps a body from
    being committed twice (the history check) or acknowledged at an index holding something
    else (`on_ack`). A definite refusal ends the call as a definite failure (`Sim.on_definite`:
    its body must never commit); SESSION_EXPIRED restamps it in a new session when no attempt
    can have been stored."""

    MAX_RESENDS = 12
    check_order = True
    # ipc/client/: a definite code ends a stamped call as a definite failure only when no
    # earlier attempt of it is unsure (timed out, WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED);
    # otherwise the call is indeterminate (False: the client before that rule).
    UNSURE_DEFINITE_IS_INDETERMINATE = True

    def __init__(self, sim: Sim, wid: int) -> None:
        super().__init__(sim, None, f"client{wid}")
        r = sim.rng
        self.w = Writer(wid, window=r.choice((1, 2, 4, 8, 16, 32)), target=r.randrange(sim.cfg.nodes))
        if sim.sessions:  # drawn only then: seeds without sessions keep their histories
            self.w.session = r.random() < 0.5
        if sim.session_faults:  # drawn only then: --sessions seeds keep theirs
            self.w.session = self.w.session or r.random() < 0.5
            self.w.attempt_ms = r.choice((300, 1000, 3000))
            if "session-evict" in sim.faults:
                self.w.short = r.choice((0.0, 0.1, 0.3, 0.6))
        self.ident = b"c:%d" % wid

    def step(self) -> None:
        sim, w = self.sim, self.w
        for kind, payload in self.take_burst():
            if kind == "reply":
                self._on_reply(payload)
        now = sim.now
        for rid in [rid for rid, o in w.out.items() if now >= o[2]]:
            sim.trace_event(self.key, "timeout", rid)
            bodies, _node, _d = w.out.pop(rid)
            w.target = sim.rng.randrange(sim.cfg.nodes)
            if rid == w.opening:
                w.opening = 0
            elif rid in w.stamps:
                self._resend(rid, bodies, unsure=True)
        while sim.writing and len(w.out) < w.window and now >= w.next_send:
            if w.session and not w.sid:
                if not w.opening:
                    self._open()
                break
            self._send()
            w.next_send = now + sim.rng.choice((0, 1, 5, 10, 30))
        due = [now + 1000]
        due.extend(o[2] for o in w.out.values())
        if sim.writing and len(w.out) < w.window:
            due.append(w.next_send)
        self.wake_at = max(now + 1, min(due))

    def _bodies(self, n: int) -> list[bytes]:
        sim, w = self.sim, self.w
        rng = sim.rng
        bodies = []
        for i in range(n):
            pad = rng.choice((0, 8, 40, 200, 700)) + rng.randint(0, 20)
            tag = b"w%d.r%d.%d|" % (w.wid, w.rid, i)
            b = tag + b"x" * pad if sim.smc is None else sim.smc.command(rng, tag, pad)
            if b in sim.sent:  # a KV delete: the same bytes may be committed once per send
                sim.repeats[b] += 1
            sim.sent[b] = (w.wid, w.rid)
            bodies.append(b)
        return bodies

    def _send(self) -> None:
        sim, w = self.sim, self.w
        if w.requeue and w.session:
            bodies = w.requeue.pop(0)  # never stored in its abandoned session: a new stamp
            w.rid += 1
        else:
            n = 1 if sim.rng.random() < 0.75 else sim.rng.randint(2, 4)
            w.rid += 1
            bodies = self._bodies(n)
        if w.session:
            w.stamps[w.rid] = (w.sid, w.next_seq, 0, False)
            w.next_seq = seq_add(w.next_seq, len(bodies))
        self._transmit(w.rid, bodies)
        if w.short and w.session and sim.rng.random() < w.short:
            w.sid = 0  # session-evict: a short session (its requests keep their stamps)

    def _transmit(self, rid: int, bodies: list[bytes]) -> None:
        sim, w = self.sim, self.w
        node = sim.nodes[w.target]
        sid, seq, _k, _u = w.stamps.get(rid, (0, 0, 0, False))
        if len(bodies) == 1:
            msg: Any = P.AppendRequest(sim.group, node.id, bodies[0], rid, sid, seq)
        else:
            msg = P.BatchAppendRequest(sim.group, node.id, bodies, rid, sid, seq)
        w.out[rid] = (bodies, w.target, sim.now + w.attempt_ms)
        sim.trace_event(self.key, "send", (node.id, rid, sid, seq, [b[:12] for b in bodies]))
        if sid:
            sim.stamped[(self.ident, rid)] = (sid, seq, bodies)
        sim.client_send(self, w.target, P.encode(msg))

    def _open(self) -> None:
        sim, w = self.sim, self.w
        w.rid += 1
        w.opening = w.rid
        w.out[w.rid] = ([], w.target, sim.now + w.attempt_ms)
        sim.client_send(self, w.target, P.encode(P.OpenSessionRequest(sim.group, sim.nodes[w.target].id, w.rid)))

    def _resend(self, rid: int, bodies: list[bytes], unsure: bool) -> None:
        """A stamped request again, under a new request id and the same stamp; after
        MAX_RESENDS it is abandoned (indeterminate) and so is its session (a possible hole)."""
        w = self.w
        sid, seq, k, was_unsure = w.stamps.pop(rid)
        if k >= self.MAX_RESENDS:
            if w.sid == sid:
                w.sid = 0
            return
        w.rid += 1
        w.stamps[w.rid] = (sid, seq, k + 1, was_unsure or unsure)
        self._transmit(w.rid, bodies)

    def _on_reply(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame)
        except P.ProtocolError:
            raise Violation(f"{self.key}: undecodable reply {frame[:40]!r}") from None
        if isinstance(msg, P.Multi):  # answers to a MULTI (bad-client), one by one
            for f in msg.frames:
                self._on_reply(bytes(f))
            return
        self._on_msg(msg)

    def _on_msg(self, msg: Any) -> None:
        sim, w = self.sim, self.w
        sim.trace_event(self.key, "reply", _summ(msg))
        o = w.out.pop(msg.request_id, None)
        if o is None:
            return  # it timed out here already: a late answer tells nothing the checks need
        bodies, node, _deadline = o
        if msg.request_id == w.opening:
            w.opening = 0
            if isinstance(msg, P.OpenSessionResponse) and msg.code == RC.SUCCESS:
                w.sid, w.next_seq = msg.session, 1
            else:
                self._retarget(msg)
            return
        stamp = w.stamps.pop(msg.request_id, None)
        if msg.code == RC.SUCCESS:
            if isinstance(msg, P.AppendResponse):
                first = msg.index
            elif isinstance(msg, P.BatchAppendResponse):
                first = msg.first_index
                if len(msg.positions) != len(bodies):
                    raise Violation(f"{self.key}: batch reply with {len(msg.positions)} positions for "
                                    f"{len(bodies)} bodies")
            else:
                raise Violation(f"{self.key}: SUCCESS reply of type {type(msg).__name__}")
            for i, b in enumerate(bodies):
                sim.on_ack(first + i, b, msg.term)
            if sim.smc is not None:
                results = msg.results if isinstance(msg, P.BatchAppendResponse) else [msg.result]
                if results is None or any(r is None for r in results):
                    sim.stats["results_missing"] += 1  # results evicted, lost, or never seen here
                for i, r in enumerate(results or ()):
                    if r is not None:
                        sim.smc.on_result(first + i, bytes(r), f"{self.key} (request {msg.request_id})")
            if self.check_order and (stamp is None or stamp[2] == 0):  # a resend: maybe an earlier index
                self._check_order(node, msg.term, msg.request_id, first, first + len(bodies) - 1)
            return
        self._retarget(msg)
        if stamp is None:
            return
        self._on_stamped_failure(msg, bodies, stamp)

    def _on_stamped_failure(self, msg: Any, bodies: list[bytes], stamp: tuple[int, int, int, bool]) -> None:
        """ipc/client/'s reaction to a stamped append's failure (docs/client.md "Sessions")."""
        sim, w = self.sim, self.w
        sid, seq, _k, unsure = stamp
        if definite_failure(msg.code):
            if w.sid == sid:
                w.sid = 0  # its seq may be a hole: later appends go to a new session
            if unsure and self.UNSURE_DEFINITE_IS_INDETERMINATE:
                return  # an earlier attempt may be stored: indeterminate
            sim.on_definite(bodies, msg.code, f"{self.key} request {msg.request_id} (session {sid:#x} seq {seq}"
                            f"{', unsure' if unsure else ''}) answered {RC(msg.code).name} by "
                            f"{getattr(msg, 'leader_id', '') or '?'}")
            return
        if msg.code == RC.SESSION_EXPIRED:
            if w.sid == sid:
                w.sid = 0
            if not unsure and w.session:
                w.requeue.append(bodies)  # no attempt can have been stored: a new session
            return
        if msg.code in (RC.SESSION_SEQ_INVALID, RC.SESSION_SEQ_TOO_OLD, RC.SESSION_LIMIT):
            if w.sid == sid:  # given up (its outcome is what the code says)
                w.sid = 0
            return
        w.stamps[msg.request_id] = stamp
        self._resend(msg.request_id, bodies, unsure=is_indeterminate(msg.code))

    def _retarget(self, msg: Any) -> None:
        sim, w = self.sim, self.w
        leader = getattr(msg, "leader_id", "")
        ids = [n.id for n in sim.nodes]
        if msg.code == RC.NOT_LEADER and leader in ids:
            w.target = ids.index(leader)
        else:
            w.target = sim.rng.randrange(sim.cfg.nodes)
        w.next_send = sim.now + sim.rng.randint(5, 60)

    def _check_order(self, node: int, term: int, rid: int, first: int, last: int) -> None:
        """Requests one writer sent to one leader in one term are appended in sending order."""
        lst = self.w.acks.setdefault((node, term), [])
        k = bisect.bisect(lst, (rid, first, last))
        before = lst[k - 1] if k > 0 else None
        after = lst[k] if k < len(lst) else None
        if (before is not None and before[2] >= first) or (after is not None and after[1] <= last):
            self.sim.fail(f"{self.key}: request {rid} acknowledged at [{first}, {last}] by n{node} in term "
                          f"{term}, out of sending order with {before} / {after} (rid, first, last)")
        lst.insert(k, (rid, first, last))


class BadWriterActor(ClientActor):
    """Fault `bad-client`: a writer with a session whose requests are not well-formed, as
    another client implementation (or a bug) may send them: its appends go in MULTI frames of
    single APPENDs, with the same (session, seq) twice in one frame (same body: a resend
    within the frame), a seq 0, a batch straddling the session's last seq, or an old stamp
    again. A correct leader writes each stamp once and answers the rest with its index or a
    SESSION_* code; the history checks hold it to that."""

    check_order = False  # a duplicate in a frame is answered with an earlier index

    def __init__(self, sim: Sim, wid: int) -> None:
        super().__init__(sim, wid)
        self.w.session = True
        self.malformed: set[int] = set()  # rids of requests no correct client sends (not checked)
        # (session, seq, bodies) of its single appends acknowledged so far: the stamps it may
        # send again (a stale resend) or straddle (known stored: a correct leader never writes
        # a request that starts there again, whatever else it holds)
        self.sent_stamps: list[tuple[int, int, list[bytes]]] = []
        self.singles: dict[int, tuple[int, int, list[bytes]]] = {}  # rid -> its stamp, of good singles

    def _send(self) -> None:
        sim, w = self.sim, self.w
        r = sim.rng
        frames: list[bytes] = []
        node = sim.nodes[w.target]
        reqs: list[tuple[int, list[bytes], int, int, bool]] = []  # (rid, bodies, session, seq, well-formed)
        last = seq_add(w.next_seq, -1)  # the session's last seq handed out before this frame
        for _ in range(r.randint(1, 4)):
            w.rid += 1
            reqs.append((w.rid, self._bodies(1), w.sid, w.next_seq, True))
            w.next_seq = seq_add(w.next_seq, 1)
        shape = r.choice(("dup", "dup", "seq0", "straddle", "stale"))
        if shape == "dup":  # one of them again, later in the same frame
            k = r.randrange(len(reqs))
            w.rid += 1
            reqs.insert(r.randint(k + 1, len(reqs)), (w.rid, reqs[k][1], reqs[k][2], reqs[k][3], True))
        elif shape == "seq0":
            w.rid += 1
            reqs.insert(r.randint(0, len(reqs)), (w.rid, self._bodies(1), w.sid, 0, False))
        elif shape == "straddle" and self.sent_stamps and self.sent_stamps[-1][:2] == (w.sid, last):
            sid, seq, bodies = self.sent_stamps[-1]
            w.rid += 1
            reqs.append((w.rid, bodies + self._bodies(r.randint(1, 2)), sid, seq, False))
        elif shape == "stale" and self.sent_stamps:
            sid, seq, bodies = r.choice(self.sent_stamps[-8:])
            w.rid += 1
            reqs.insert(r.randint(0, len(reqs)), (w.rid, bodies, sid, seq, True))
        for rid, bodies, sid, seq, good in reqs:
            if len(bodies) == 1:
                msg: Any = P.AppendRequest(sim.group, node.id, bodies[0], rid, sid, seq)
            else:
                msg = P.BatchAppendRequest(sim.group, node.id, bodies, rid, sid, seq)
            frames.append(P.encode(msg))
            w.out[rid] = (bodies, w.target, sim.now + w.attempt_ms)
            if not good:
                self.malformed.add(rid)
            else:
                w.stamps[rid] = (sid, seq, 0, False)
                sim.stamped[(self.ident, rid)] = (sid, seq, bodies)
                if len(bodies) == 1:
                    self.singles[rid] = (sid, seq, bodies)
            sim.trace_event(self.key, "send", (node.id, rid, sid, seq, [b[:12] for b in bodies], shape))
        del self.sent_stamps[:-32]
        sim.stats["bad_client_" + shape.replace("-", "_")] += 1
        sim.client_send(self, w.target, P.encode_multi(frames))

    def _on_msg(self, msg: Any) -> None:
        single = self.singles.pop(msg.request_id, None)
        if single is not None and msg.code == RC.SUCCESS and msg.request_id in self.w.out:
            self.sent_stamps.append(single)
        if msg.request_id in self.malformed:
            self.malformed.discard(msg.request_id)
            self.sim.trace_event(self.key, "reply", _summ(msg))
            if self.w.out.pop(msg.request_id, None) is not None and msg.code != RC.SUCCESS:
                self._retarget(msg)
                self.w.sid = 0  # as a client told SESSION_SEQ_INVALID would
            return
        super()._on_msg(msg)


class ReaderActor(A.Actor):
    """A reader: GETs of committed entries, mostly linearizable. Whatever is served must be the
    committed history; a linearizable GET must see every append acknowledged before it was sent.
    With a state machine, half its reads are QUERYs of it (read-index: linearizable), checked
    against the reference (tools/sim/smcheck.py), and now and then it asks a node to snapshot."""

    def __init__(self, sim: Sim) -> None:
        super().__init__(sim, None, "reader")
        self.ident = b"c:r"
        self.target = sim.rng.randrange(sim.cfg.nodes)
        self.rid = 0
        self.out: dict[int, tuple[int, int, bool, int]] = {}  # rid -> (index, acked max, lin, deadline)
        self.sm_out: dict[int, tuple[bytes | None, int, int, str]] = {}  # rid -> (query, acked max, deadline, node)
        self.wake_at = sim.rng.randint(100, 400)

    def step(self) -> None:
        sim = self.sim
        for kind, payload in self.take_burst():
            if kind == "reply":
                self._on_reply(payload)
        now = sim.now
        for rid in [rid for rid, o in self.out.items() if now >= o[3]]:
            del self.out[rid]
        for rid in [rid for rid, o in self.sm_out.items() if now >= o[2]]:
            del self.sm_out[rid]
        if now >= self.wake_at and sim.writing and len(self.out) + len(self.sm_out) < 2:
            r = sim.rng
            if sim.smc is not None and r.random() < 0.5:
                self._send_sm(r)
                self.wake_at = now + r.randint(20, 200)
                return
            top = max(sim.acked_max, len(sim.chist) - 1)
            index = r.randint(0, max(0, top + 1)) if r.random() < 0.4 else max(0, top - r.randint(0, 4))
            lin = r.random() < 0.8
            self.rid += 1
            self.out[self.rid] = (index, sim.acked_max, lin, now + 3000)
            node = sim.nodes[self.target]
            frame = P.encode(P.GetRequest(sim.group, node.id, index, r.randint(1, 3), lin, self.rid))
            sim.trace_event(self.key, "send", (node.id, self.rid, f"GET {index} lin={lin}"))
            sim.client_send(self, self.target, frame)
        self.wake_at = now + sim.rng.randint(20, 200)

    def _send_sm(self, r: random.Random) -> None:
        """A QUERY to the node it believes leads, or (1 in 10) a SNAPSHOT request to any node."""
        sim = self.sim
        self.rid += 1
        if r.random() < 0.1:
            node = r.choice(sim.nodes)
            self.sm_out[self.rid] = (None, sim.acked_max, sim.now + 3000, node.id)
            sim.trace_event(self.key, "send", (node.id, self.rid, "SNAPSHOT"))
            sim.client_send(self, node.idx, P.encode(P.SnapshotRequest(sim.group, node.id, self.rid)))
            return
        node = sim.nodes[self.target]
        request = sim.smc.query_request(r)
        self.sm_out[self.rid] = (request, sim.acked_max, sim.now + 3000, node.id)
        sim.trace_event(self.key, "send", (node.id, self.rid, f"QUERY {request[:12]!r}"))
        sim.client_send(self, self.target, P.encode(P.QueryRequest(sim.group, node.id, request, self.rid)))

    def _on_sm_reply(self, msg: Any) -> None:
        sim = self.sim
        request, acked_max, _d, node = self.sm_out.pop(msg.request_id)
        if request is None:
            sim.smc.check_snapshot_reply(msg, node)
            return
        sim.smc.check_query(request, msg, acked_max, f"{self.key} (request {msg.request_id} to {node})")
        if msg.code != RC.SUCCESS:
            ids = [n.id for n in sim.nodes]
            leader = getattr(msg, "leader_id", "")
            self.target = ids.index(leader) if leader in ids else sim.rng.randrange(sim.cfg.nodes)

    def _on_reply(self, frame: bytes) -> None:
        sim = self.sim
        msg = P.decode(frame)
        sim.trace_event(self.key, "reply", _summ(msg))
        if msg.request_id in self.sm_out:
            self._on_sm_reply(msg)
            return
        o = self.out.pop(msg.request_id, None)
        if o is None:
            return
        index, acked_max, lin, _d = o
        sim.stats[f"get_{'lin_' if lin else ''}{RC(msg.code).name.lower()}"] += 1
        if msg.code == RC.SUCCESS and isinstance(msg, P.GetResponse):
            h = sim.chist
            i = index
            for _off, e in codec.iter_entries(msg.entries):
                got = (e.term, e.magic, bytes(e.body))
                if e.index != i or e.index >= len(h) or h[e.index] != got:
                    sim.fail(f"GET {index} served entry {e.index} (term {e.term}, {got[2][:24]!r}), which is not "
                             f"the committed entry there ({h[e.index][:2] if e.index < len(h) else 'none yet'})")
                i += 1
            return
        if lin and msg.code == RC.INDEX_OUT_OF_RANGE and index <= acked_max and not _compacted(index, msg):
            sim.fail(f"stale linearizable read: GET {index} answered INDEX_OUT_OF_RANGE by {msg.leader_id or '?'} "
                     f"(term {msg.term}) after index {acked_max} was acknowledged")
        if msg.code != RC.INDEX_OUT_OF_RANGE:
            ids = [n.id for n in sim.nodes]
            leader = getattr(msg, "leader_id", "")
            self.target = ids.index(leader) if leader in ids else sim.rng.randrange(sim.cfg.nodes)


_CHANNEL_NAME = {"dispatcher": "dispatchers", "ack_checker": "ack"}
_RANGE = re.compile(r"committed range is \[(-?\d+), (-?\d+)\]")


def _compacted(index: int, msg: Any) -> bool:
    """An INDEX_OUT_OF_RANGE for an index retention deleted (below the ledger begin it names)."""
    m = _RANGE.search(getattr(msg, "reason", "") or "")
    return m is not None and index < int(m.group(1))


def _summ(msg: Any) -> str:
    """A one-line view of a decoded protocol message, without payload bytes."""
    name = type(msg).__name__
    parts = []
    for k in getattr(msg, "__slots__", ()):
        if k in ("group", "entries", "index_records", "body", "bodies", "positions", "reason"):
            if k == "bodies":
                parts.append(f"n={len(msg.bodies)}")
            elif k == "entries" and len(msg.entries):
                parts.append(f"entries={len(msg.entries)}B")
            elif k == "reason" and msg.reason:
                parts.append(f"reason={msg.reason[:60]!r}")
            continue
        v = getattr(msg, k)
        if k == "code":
            with contextlib.suppress(ValueError):
                v = RC(v).name
        elif k == "kind":
            v = getattr(v, "name", v)
        elif isinstance(v, memoryview):  # a result or answer: its repr names an address
            v = f"{len(v)}B"
        elif isinstance(v, list) and any(isinstance(x, memoryview) for x in v):
            v = [f"{len(x)}B" if isinstance(x, memoryview) else x for x in v]
        parts.append(f"{k}={v}")
    return f"{name}({', '.join(parts)})"


def _fmt_payload(kind: str, payload: Any) -> str:
    try:
        if isinstance(payload, tuple) and len(payload) == 2 and isinstance(payload[1], bytes | bytearray):
            return _summ(P.decode(payload[1]))
        if isinstance(payload, bytes | bytearray) and kind in ("reply", "resp", "ctlreply"):
            return _summ(P.decode(payload))
        if kind == "results":
            got = channels.decode_results(payload)
            if got is not None:
                return f"results {got[0]}..{got[0] + len(got[1]) - 1}"
        if kind in ("query", "qreply"):
            frame = payload[1] if kind == "query" else payload
            q = channels.decode_query(frame) if kind == "query" else channels.decode_query_reply(frame)
            return f"tag={q[0]} " + (f"read_index={q[1]}" if kind == "query" else f"status={q[1]} applied={q[2]}")
        if kind == "role":
            r = channels.decode_role_msg(payload)
            if r is not None:
                return f"{r[0].name} term={r[1]} leader=n{r[2]} epoch={r[3]}"
    except Exception:  # noqa: BLE001 - a trace line must never fail
        pass
    return repr(payload)[:120]


class Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.faults = set(cfg.faults)
        self.store_kind = cfg.store
        self.group = "g"
        self.now = 0
        self.steps = 0
        self._inc = 0
        self._seq = 0
        self.heap: list = []
        self.stack: list[A.Actor] = []
        self.trace: collections.deque = collections.deque(maxlen=cfg.trace_len)
        self.hash = hashlib.sha256() if cfg.hash_trace else None
        self.events = 0
        self.writing = True
        self.faulting = True
        self.blocked: set[tuple[int, int]] = set()
        self.fifo: dict[tuple[str, str], int] = {}
        self.leaders: dict[int, str] = {}
        self.led: set[tuple[str, int]] = set()  # (node, term) leaderships
        self.chist: list[tuple[int, int, bytes]] = []  # committed history: (term, magic, body)
        self.chist_where: dict[bytes, int] = {}
        self.acked: dict[int, tuple[bytes, int]] = {}  # index -> (body, term) acknowledged
        self.acked_max = -1
        self.last_ack_at = -1
        self.sent: dict[bytes, tuple[int, int]] = {}
        self.stats = collections.Counter()
        self._tmp = tempfile.mkdtemp(prefix=f"dlsim-{cfg.seed}-", dir=cfg.tmp_root or _tmp_root())
        # network conditions for this seed
        r = self.rng
        self.p_drop = r.uniform(0.0, 0.08) if "drop" in self.faults else 0.0
        self.p_dup = r.uniform(0.0, 0.05) if "dup" in self.faults else 0.0
        self.p_reorder = r.uniform(0.0, 0.1) if "reorder" in self.faults else 0.0
        self.p_spike = r.uniform(0.0, 0.05) if "delay" in self.faults else 0.0
        self.p_corrupt = r.uniform(0.0, 0.05) if "corrupt" in self.faults else 0.0
        self.p_eager_commit = r.uniform(0.05, 0.5) if "eager-commit" in self.faults else 0.0
        self.p_preempt = cfg.preempt
        self.p_midcrash = 0.002 if "role-crash" in self.faults else 0.0
        self.fault_every = (r.randint(100, 600), r.randint(600, 2500))
        self.next_fault = r.randint(*self.fault_every)
        self.quiet_until = 0
        sm: dict[str, Any] = {}
        # client sessions: the session faults turn them on (and draw only when named)
        self.session_faults = [f for f in SESSION_FAULTS if f in self.faults]
        self.sessions = cfg.sessions or bool(self.session_faults)
        self.stamped: dict[tuple[bytes, int], tuple[int, int, list[bytes]]] = {}  # (ident, rid) -> stamp, bodies
        self.definite: dict[bytes, str] = {}  # body -> the definite failure a client reported for it
        self.stamp_where: dict[tuple[int, int], int] = {}  # (session, seq) -> committed index
        self.p_handler_restart = 0.0
        self.retention_on = False
        if "session-evict" in self.faults:  # tiny tables: sessions evicted, few seqs' indexes kept
            sm.update(max_sessions=r.choice((1, 2, 3)), session_window=r.choice((1, 2, 4, 16)))
        if "handler-restart" in self.faults:  # short rebuild scans: a restart forgets sessions
            sm.update(session_scan_entries=r.choice((1, 3, 8, 20, 100_000)))
            self.p_handler_restart = r.uniform(0.005, 0.05)
        if "retention" in self.faults and cfg.store == "segment":
            self.retention_on = True
            sm.setdefault("file_reserved_hours", 0)
        self.disk_ratio = 0.0  # what every handler's disk measurement says (retention, DISK_FULL)
        if cfg.state_machine:  # drawn only then: seeds without a state machine keep their histories
            from tools.sim.smcheck import SPECS
            sm = dict(state_machine=SPECS[cfg.state_machine], snapshot_threshold=r.choice((3, 8, 20, 50)),
                      max_snapshots_kept=r.choice((1, 2, 3)), file_reserved_hours=0)
            if cfg.store == "segment":  # retention deletes what snapshots and every replica allow
                self.disk_ratio = RETENTION_RATIO
        if self.retention_on:
            self.disk_ratio = RETENTION_RATIO
        self.f8: dict[str, Any] | None = None  # fault figure8: the shape in progress
        if "figure8" in self.faults:
            # one entry per push, one push in flight: a follower catches up entry by entry
            sm.update(enable_batch_push=False, max_pending_pushes=1)
        ids = [f"n{i}" for i in range(cfg.nodes)]
        peers = ";".join(f"{i}-127.0.0.1:{30000 + 2 * k}" for k, i in enumerate(ids))
        self.nodes: list[Node] = []
        for k, nid in enumerate(ids):
            d = f"{self._tmp}/{nid}"
            ncfg = _SimNodeConfig(id=nid, peers=peers, group=self.group, store_dir=d, run_dir=d,
                              data_file_size=4096, index_file_size=8 * 32, **sm)
            os.makedirs(d, exist_ok=True)
            self.nodes.append(Node(self, k, nid, ncfg, d))
        self.smc: Any = None
        # Install snapshot (smcheck.py): retention strands lagging followers, the leader sends
        # them its snapshot in chunks of a size drawn per seed (real snapshots here are a few
        # hundred bytes to a few KB: 1 MiB chunks would make every install one chunk).
        self.installs = bool(cfg.state_machine and cfg.store == "segment" and cfg.installs)
        self.install_cfg: Any = None
        self.p_install_fault = 0.0
        if self.installs:  # drawn only then: other seeds keep their histories
            from node.core.install import InstallConfig
            self.install_cfg = InstallConfig(chunk_bytes=r.choice((64, 200, 512, 1500)),
                                             window=r.choice((1, 2, 4)),
                                             chunk_timeout_ms=r.choice((300, 1000, 5000)))
            self.p_install_fault = r.uniform(0.01, 0.08)
            self.install_faults = [w for w, f in (
                ("follower-applier", "role-crash"), ("follower-handler", "role-crash"),
                ("leader-dispatcher", "role-crash"), ("follower-node", "crash"), ("leader-node", "crash"),
                ("pause-applier", "pause"), ("new-leader", "partition")) if f in self.faults]
            if not self.install_faults:
                self.p_install_fault = 0.0
        if cfg.state_machine:
            from tools.sim.smcheck import StateMachineChecks
            self.smc = StateMachineChecks(self, cfg.state_machine)
        self.repeats: collections.Counter = collections.Counter()  # bodies sent more than once (KV deletes)
        self.actors: list[A.Actor] = []
        self.slots: dict[str, int] = {}
        global _ACTIVE
        _ACTIVE = self
        self._log_undo = _capture_logs()
        for n in self.nodes:
            self._start_node(n)
        for w in range(cfg.writers):
            self._add_actor(ClientActor(self, w))
        if "session-evict" in self.faults:  # more sessions than the table holds
            for w in range(cfg.writers, cfg.writers + 2):
                self._add_actor(ClientActor(self, w))
        if "bad-client" in self.faults:
            self._add_actor(BadWriterActor(self, cfg.writers + 2))
        self._add_actor(ReaderActor(self))

    # ------------------------------------------------------------------ bookkeeping
    def disk_ratio_at(self, path: Any) -> float:
        """What a node's disk measurement reads (the handler measures its store directory):
        full while fault disk-probe holds it, else the seed's ratio (retention modelled or not)."""
        p = str(path)
        for n in self.nodes:
            if n.probe_full_until > self.now and (p == n.dir or p.startswith(n.dir + "/")):
                return 0.97
        return self.disk_ratio

    def retention_floor(self) -> int:
        """Fault retention without a state machine (no snapshot to install): the highest index
        retention may delete, one below what every replica has committed, so a lagging replica
        still finds every entry it needs in the leader's log."""
        return min(n.max_committed for n in self.nodes) - 1

    def next_inc(self) -> int:
        self._inc += 1
        return self._inc

    def _add_actor(self, a: A.Actor) -> None:
        pos = self.slots.get(a.key)
        if pos is None:
            self.slots[a.key] = len(self.actors)
            self.actors.append(a)
        else:
            self.actors[pos] = a
        if a.node is not None:
            a.node.roles[a.role if a.role != "dispatcher" else a.key] = a

    def actor(self, key: str) -> A.Actor | None:
        pos = self.slots.get(key)
        return None if pos is None else self.actors[pos]

    def current(self) -> A.Actor | None:
        return self.stack[-1] if self.stack else None

    @contextlib.contextmanager
    def acting(self, actor: A.Actor) -> Iterator[None]:
        """Run construction code as `actor` (its clock, no preemption)."""
        self.stack.append(actor)
        actor.busy = True
        saved, self.p_preempt = self.p_preempt, 0.0
        try:
            yield
        finally:
            self.p_preempt = saved
            actor.busy = False
            self.stack.pop()

    def clock_now(self) -> int:
        a = self.current()
        if a is not None and a.node is not None:
            return self.now + a.node.clock_offset
        return self.now

    # ------------------------------------------------------------------ trace
    def trace_event(self, key: str, kind: str, data: Any) -> None:
        ev = (self.now, key, kind, data)
        self.trace.append(ev)
        self.events += 1
        if self.hash is not None:  # the temporary directory's name is the one random thing
            self.hash.update(repr(ev).replace(self._tmp, "TMP").encode())

    def trace_in(self, key: str, kind: str, payload: Any) -> None:
        self.trace_event(key, "<" + kind, payload)

    def format_trace(self) -> str:
        lines = []
        for t, key, kind, data in self.trace:
            if kind == "log":
                level, msg, args = data
                try:
                    text = msg % args
                except Exception:  # noqa: BLE001
                    text = f"{msg} {args}"
                lines.append(f"{t:>7} {key:<12} log {level} {text}")
            elif kind.startswith("<") or kind in ("drop", "send>"):
                lines.append(f"{t:>7} {key:<12} {kind:<8} {_fmt_payload(kind.lstrip('<'), data)}")
            else:
                lines.append(f"{t:>7} {key:<12} {kind:<8} {data}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ nodes
    def _start_node(self, n: Node) -> None:
        n.block = NodeBlock(self.cfg.nodes, n.idx)
        n.lock = SimLock(self, n)
        n.up = True
        self._add_actor(A.HandlerActor(self, n))
        self._add_actor(A.ElectorActor(self, n))
        for peer in n.cfg.peer_ids:
            if peer != n.id:
                self._add_actor(A.DispatcherActor(self, n, peer))
        self._add_actor(A.AckActor(self, n))
        if n.cfg.state_machine:
            self._add_actor(A.ApplierActor(self, n))

    def _restart_role(self, n: Node, key: str) -> None:
        old = self.actor(key)
        if old is None or old.alive or not n.up:
            return
        cls = type(old)
        if cls is A.DispatcherActor:
            new: A.Actor = A.DispatcherActor(self, n, old.peer)  # type: ignore[attr-defined]
        else:
            new = cls(self, n)  # type: ignore[call-arg]
        self._add_actor(new)
        self.trace_event(key, "restart", "")

    def kill_actor(self, a: A.Actor, why: str) -> None:
        if not a.alive:
            return
        a.kill()
        self.trace_event(a.key, "crash", why)
        self.stats["role_crashes"] += 1
        n = a.node
        if n is not None and n.up:
            delay = self.rng.randint(5, 400)
            self.schedule(self.now + delay, "call", lambda: self._restart_role(n, a.key))

    def pause_actor(self, a: A.Actor, ms: int) -> None:
        """SIGSTOP: the process runs nothing (its inputs queue up) until SIGCONT."""
        if not a.alive:
            return
        a.listening = False
        a.paused = True
        a.wake_at = max(a.wake_at, self.now + ms)
        self.trace_event(a.key, "pause", f"{ms} ms")

        def resume() -> None:
            if a.alive and a.paused:
                self.resume_actor(a)

        self.schedule(self.now + ms, "call", resume)

    def resume_actor(self, a: A.Actor) -> None:
        """SIGCONT."""
        a.paused = False
        a.listening = getattr(a, "started", True)
        a.wake_at = min(a.wake_at, self.now)
        self.trace_event(a.key, "resume", "")

    def crash_node(self, n: Node, torn: bool, down_ms: int | None = None) -> None:
        if not n.up:
            return
        for a in list(n.roles.values()):
            if a.alive:
                a.kill()
        n.up = False
        n.lock = SimLock(self, n)
        what = ""
        if torn and self.store_kind == "segment":
            what = " torn tail: " + A.write_torn_tail(n, self.rng)
        self.trace_event(n.id, "crash", "node" + what)
        self.stats["node_crashes"] += 1
        if down_ms is None:
            down_ms = self.rng.randint(50, 2500)
        self.schedule(self.now + down_ms, "call", lambda: self.restart_node(n))

    def restart_node(self, n: Node) -> None:
        if n.up:
            return
        self.trace_event(n.id, "restart", "node")
        self._start_node(n)

    # ------------------------------------------------------------------ events
    def schedule(self, at: int, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, self._seq, kind, data))

    def _deliver_due(self) -> None:
        h = self.heap
        while h and h[0][0] <= self.now:
            _at, _s, kind, data = heapq.heappop(h)
            if kind == "msg":
                key, inc, mkind, payload = data
                a = self.actor(key)
                if a is not None and a.alive and a.inc == inc:
                    a.inbox.append((mkind, payload))
            elif kind == "call":
                data()

    # ------------------------------------------------------------------ transport
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
        dst = self.nodes[n.cfg.peer_ids.index(peer)]
        a = self._node_actor(dst, "elector")
        if a is None:
            return False  # IMMEDIATE dealer: nobody listening there
        ident = b"e:%d:%d" % (n.idx, src.inc)
        self.net_send(n.idx, dst.idx, a, "req", (ident, frame), src.key)
        return True

    def data_send(self, n: Node, src: A.Actor, peer: str, payload: tuple[bytes, bytes]) -> bool:
        dst = self.nodes[n.cfg.peer_ids.index(peer)]
        a = self._node_actor(dst, "handler")
        if a is None:
            return False
        if self.installs:
            self._install_frame(n, dst, src, payload[1])
        if self.faulting and self.p_corrupt and self.rng.random() < self.p_corrupt:
            payload = self._corrupt_push(payload, src.key)
        self.net_send(n.idx, dst.idx, a, "frame", payload, src.key)
        return True

    def _install_frame(self, n: Node, dst: Node, src: A.Actor, frame: bytes) -> None:
        """An INSTALL chunk leaving a leader's dispatcher: counted, and (while faulting, with
        the seed's `p_install_fault`) the cue for a fault aimed at the install in progress: kill
        the follower's applier or handler, the leader's dispatcher, or the whole leader or
        follower node; pause the follower's applier; or cut the leader off (a new leader
        takes over mid-install), 0-30 ms after the chunk left."""
        hdr = P.peek_header(frame)
        if hdr is None or hdr[1] != P.MsgType.INSTALL:
            return
        msg = P.decode(frame)
        self.stats["install_chunks_sent" if len(msg.data) else "install_probes_sent"] += 1
        r = self.rng
        if not self.faulting or r.random() >= self.p_install_fault:
            return
        what = r.choice(self.install_faults)
        self.stats["install_faults"] += 1

        def strike() -> None:
            if not self.faulting:
                return
            self.trace_event("sim", "install-fault", f"{what} (install {n.id} -> {dst.id})")
            if what == "follower-applier" and (a := self._node_actor(dst, "applier")) is not None:
                self.kill_actor(a, "install fault")
            elif what == "follower-handler" and (a := self._node_actor(dst, "handler")) is not None:
                self.kill_actor(a, "install fault")
            elif what == "leader-dispatcher" and src.alive:
                self.kill_actor(src, "install fault")
            elif what == "follower-node":
                self.crash_node(dst, torn=r.random() < 0.5)
            elif what == "leader-node":
                self.crash_node(n, torn=r.random() < 0.5)
            elif what == "pause-applier" and (a := self._node_actor(dst, "applier")) is not None:
                self.pause_actor(a, r.choice((100, 300, 1000, 3000)))
            elif what == "new-leader":
                self._cut(self._isolate([n.idx]), f"isolate installing leader {n.id}", r.randint(500, 3000))

        self.schedule(self.now + r.randint(0, 30), "call", strike)

    def _corrupt_push(self, payload: tuple[bytes, bytes], src_key: str) -> tuple[bytes, bytes]:
        """Fault `corrupt`: flip one byte of the entries a push carries, between nodes (a bad
        NIC, memory or disk on the leader; docs/contracts.md C12). Clients' bytes are never touched: the
        history check must know what was written."""
        ident, frame = payload
        msg = P.decode(frame)
        if isinstance(msg, P.InstallRequest) and len(msg.data):
            # a chunk of the leader's snapshot: only the follower's whole-file checksum can tell
            data = bytearray(msg.data)
            at = self.rng.randrange(len(data))
            data[at] ^= 1 << self.rng.randrange(8)
            msg.data = bytes(data)
            self.trace_event(src_key, "corrupt", f"install chunk at {msg.offset} byte {at}")
            self.stats["install_chunks_corrupted"] += 1
            return ident, P.encode(msg)
        if not isinstance(msg, P.PushRequest) or msg.kind != P.PushKind.APPEND or not msg.entries:
            return payload
        blob = bytearray(msg.entries)
        at = self.rng.randrange(len(blob))
        blob[at] ^= 1 << self.rng.randrange(8)
        msg.entries = bytes(blob)
        self.trace_event(src_key, "corrupt", f"push {msg.first_index}+{msg.count} byte {at}")
        return ident, P.encode(msg)

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

    # ------------------------------------------------------------------ scheduling
    def _run_step(self, a: A.Actor) -> None:
        if self.stack:
            self.trace_event(a.key, "nested", f"runs inside {self.stack[-1].key}'s block read")
        a.busy = True
        self.stack.append(a)
        try:
            a.step()
        except A.SimCrash:
            self.kill_actor(a, "mid-step")
        except A.SimFatal as e:
            raise Violation(f"{a.key} stopped the node (fatal): {e}") from None
        except Violation:
            raise
        except Exception as e:  # noqa: BLE001 - a role that raises is a finding
            tb = traceback.format_exc(limit=8)
            raise Violation(f"{a.key} crashed: {e!r}\n{tb}") from None
        finally:
            self.stack.pop()
            a.busy = False

    def preempt(self, reader: A.Actor) -> None:
        """A block read: maybe crash the reader here, maybe run other actors first."""
        r = self.rng
        if self.p_midcrash and self.faulting and r.random() < self.p_midcrash and reader in self.stack:
            if reader is self.stack[-1] and reader.node is not None:
                raise A.SimCrash()
        if len(self.stack) > self.cfg.max_depth or r.random() >= self.p_preempt:
            return
        now = self.now
        cands = [a for a in self.actors
                 if a.alive and not a.busy and (a.wake_at <= now or (a.inbox and a.listening)) and not (a.takes_lock and a.node is not None and a.node.lock.holder is not None)]
        if not cands:
            return
        self.stats["nested"] += 1
        self._run_step(r.choice(cands))

    def at_write(self, writer: A.Actor) -> None:
        if self.p_midcrash and self.faulting and self.rng.random() < self.p_midcrash:
            if self.stack and writer is self.stack[-1] and writer.node is not None:
                raise A.SimCrash()

    def step_once(self) -> bool:
        """Run one top-level step (advancing virtual time if nobody is ready)."""
        if self.heap and self.heap[0][0] <= self.now:
            self._deliver_due()
        now = self.now
        ready = [a for a in self.actors
                 if a.alive and (a.wake_at <= now or (a.inbox and a.listening))]
        if not ready:
            nxt = min([a.wake_at for a in self.actors if a.alive] or [now + 1000])
            if self.heap and self.heap[0][0] < nxt:
                nxt = self.heap[0][0]
            if self.faulting and self.next_fault < nxt:
                nxt = self.next_fault
            self.now = max(now + 1, nxt)
            if self.faulting and self.now >= self.next_fault:
                self._inject_fault()
            return False
        self._run_step(ready[0] if len(ready) == 1 else self.rng.choice(ready))
        self.steps += 1
        self.check()
        return True

    # ------------------------------------------------------------------ faults
    def _inject_fault(self) -> None:
        r = self.rng
        self.next_fault = self.now + r.randint(*self.fault_every)
        if self.now < self.quiet_until:
            return  # a multi-step fault shape is playing out
        kinds = [k for k in ("partition", "crash", "role-crash", "pause", "truncate", "clock") if k in self.faults]
        if "eager-commit" in self.faults:
            kinds.append("lagging-follower")
        if "disk-full" in self.faults:
            kinds.append("disk-full")
        if "disk-probe" in self.faults:
            kinds += ["disk-probe"] * 4  # a seed's fault phase is short: drawn often
        if "figure8" in self.faults and self.cfg.nodes == 5:
            kinds += ["figure8"] * 4
        if self.smc is not None and "role-crash" in self.faults:
            kinds.append("applier-crash")  # its restart restores a snapshot and replays: often
        if self.installs and ("partition" in self.faults or "crash" in self.faults):
            kinds += ["lagging-install", "lagging-install"]
        if not kinds:
            return
        k = r.choice(kinds)
        n = r.choice(self.nodes)
        if k == "partition":
            others = [m.idx for m in self.nodes if m is not n]
            if r.random() < 0.5:
                cut = [(n.idx, o) for o in others] + [(o, n.idx) for o in others]
                desc = f"isolate {n.id}"
            elif r.random() < 0.5:
                o = r.choice(others)
                cut = [(n.idx, o)]
                desc = f"one-way {n.id}->n{o}"
            else:
                side = set(r.sample(others, r.randint(1, max(1, len(others) // 2))))
                cut = [(a, b) for a in side for b in others + [n.idx] if b not in side]
                cut += [(b, a) for a, b in cut]
                desc = f"split {sorted(side)}"
            self._cut(cut, desc, r.randint(100, 3000))
        elif k == "crash":
            if n.up:
                self.crash_node(n, torn=r.random() < 0.5)
        elif k == "role-crash":
            if n.up:
                a = r.choice(list(n.roles.values()))
                self.kill_actor(a, "between steps")
        elif k == "applier-crash":
            a = self._node_actor(n, "applier")
            if n.up and a is not None:
                self.kill_actor(a, "applier crash")
        elif k == "pause":
            if n.up:
                self.pause_actor(r.choice(list(n.roles.values())), r.choice((100, 300, 1000, 3000, 6000)))
        elif k == "truncate":
            self._truncate_shape()
        elif k == "lagging-follower":
            self._lagging_follower_shape()
        elif k == "lagging-install":
            self._lagging_install_shape()
        elif k == "figure8":
            self._figure8_shape()
        elif k == "disk-full":
            ms = r.randint(100, 3000)
            n.disk_full_until = self.now + ms
            self.trace_event(n.id, "disk-full", f"for {ms} ms")
        elif k == "disk-probe":
            lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
            ms = r.randint(100, 4000)
            if lead and r.random() < 0.7:
                # Mostly the leader, and its answers to clients are lost for a moment as the
                # disk fills (a broken connection): the resends of appends it stored meet
                # DISK_FULL (the handler measures the disk once a second)
                n = lead[0]
                ms = r.randint(1500, 5000)
                lost = r.randint(200, 1500)
                n.answers_lost_until = self.now + lost
                self.trace_event(n.id, "answers-lost", f"for {lost} ms")
            n.probe_full_until = self.now + ms
            self.stats["disk_probe_full"] += 1
            self.trace_event(n.id, "disk-probe", f"reads full for {ms} ms")
        elif k == "clock":
            j = r.randint(1, 150)
            n.clock_offset += j
            self.trace_event(n.id, "clock", f"+{j} ms")

    def _isolate(self, nodes: list[int]) -> list[tuple[int, int]]:
        inside = set(nodes)
        outside = [m.idx for m in self.nodes if m.idx not in inside]
        return [(a, b) for a in sorted(inside) for b in outside] + [(b, a) for a in sorted(inside) for b in outside]

    def _truncate_shape(self) -> None:
        """A deposed leader's uncommitted tail gets truncated (segment files deleted and
        re-created) and that node leads again while a peer still holds the old tail -- the
        shape that broke the generation fence (docs/contracts.md C1): cut the leader X off with one
        follower Z while clients write to X; rejoin X (it follows the new leader and truncates) but
        keep Z away; then cut the new leader off so X may win; finally bring Z back."""
        r = self.rng
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead:
            return
        x = lead[0]
        z = r.choice([m for m in self.nodes if m is not x])
        t1 = r.randint(2000, 4000)
        self._cut(self._isolate([x.idx, z.idx]), f"isolate old leader {x.id} with {z.id}", t1)
        t2 = t1 + r.randint(3000, 6000)
        self.quiet_until = self.now + t2

        def rejoin() -> None:
            if not self.faulting:
                return  # the heal came first
            self._cut(self._isolate([z.idx]), f"keep {z.id} away", t2 - t1)
            self.writing = False  # writers pause: the new leader's log stays short of X's old tail
            self.trace_event("sim", "writers", "pause")

        def resume() -> None:
            if self.faulting:
                self.writing = True
                self.trace_event("sim", "writers", "resume")

        self.schedule(self.now + t1, "call", rejoin)
        self.schedule(self.now + t2, "call", resume)

        def depose() -> None:
            now_lead = [m for m in self.nodes if m.up and m is not x and m.block.member.role == Role.LEADER]
            if now_lead:
                self._cut(self._isolate([now_lead[0].idx]), f"isolate new leader {now_lead[0].id}",
                          r.randint(1500, 3000))

        self.schedule(self.now + t1 + r.randint(200, 1000), "call", depose)

    def _fill_leaders_disk(self) -> int | None:
        """Fault `disk-full`, at the heal (docs/contracts.md C5): the leader's disk fills for 6 s
        while the others are healthy and clients keep writing. A leader that cannot write must step
        down so that the group fails over: some append must be acknowledged again within FAILOVER_MS
        (checked in `run`). Returns when the disk filled (None: no leader now)."""
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead:
            return None
        n = lead[0]
        n.disk_full_until = self.now + 6000
        self.trace_event(n.id, "disk-full", "leader's disk full for 6000 ms")
        return self.now

    def _lagging_follower_shape(self) -> None:
        """A follower that learns of a new leader late (part of fault `eager-commit`, the shape
        mutation t3-two-reads needs, docs/contracts.md C2): cut the leader X off with one follower Z
        while clients write to X (Z stores X's tail, which cannot commit), and stall Z's elector
        (SIGSTOP) for as long; the rest (5 nodes) elect a new leader that commits over X's tail. The
        cut heals a little before Z's elector resumes, so the new leader's pushes -- a COMMIT first,
        with eager-commit -- reach Z's handler while Z's block still says FOLLOWER of X, and Z's
        elector switches to the new leader while the handler is deciding one of them."""
        r = self.rng
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead:
            return
        x = lead[0]
        zs = [m for m in self.nodes if m is not x and m.up and self._node_actor(m, "elector") is not None]
        if not zs:
            return
        z = r.choice(zs)
        t1 = r.randint(2500, 5000)
        until = self.now + t1 + r.randint(250, 700)  # both resume after 1-3 heartbeats queued
        self._cut(self._isolate([x.idx, z.idx]), f"isolate leader {x.id} with {z.id}", t1)
        self.pause_actor(z.roles["elector"], until - self.now)

        healed = self.now + t1

        def stall_handler() -> None:
            # After X's last pushes (its lease is gone), the handler queues the new leader's
            # pushes while the elector queues its heartbeats, and both resume at once. X is cut
            # off from Z too: its candidacy would otherwise reach Z's elector first.
            h = self._node_actor(z, "handler")
            if h is not None and until > self.now and self.faulting:
                self.pause_actor(h, until - self.now)
            if healed > self.now:
                self._cut([(x.idx, z.idx), (z.idx, x.idx)], f"cut {x.id} from {z.id}", healed - self.now)

        self.schedule(self.now + r.randint(500, 900), "call", stall_handler)
        self.quiet_until = until + 500

    def _figure8_shape(self) -> None:
        """Raft's Figure 8 (5 nodes; fault figure8), in four steps driven by role changes:
        1. cut the leader X off with one follower Y while the writers write to X: a tail of X's
           term on X and Y only;
        2. the first leader Z the other three elect is cut off the moment it is elected: its
           term's NOOP stays on Z alone (its last term is now the highest);
        3. 200-800 ms later X and Y rejoin the two others (Z stays away) and one of X, Y leads
           again, catching the others up entry by entry (one entry per push in this fault);
        4. 3-15 ms after that leader first publishes a quorum index above what any node has
           committed, its node crashes (down
           4-6 s), the two others' handlers too (what was in flight to them is lost; they
           restart at once), the other of X, Y is cut off and Z comes back: Z, whose last term is higher
           than that of X's tail, can win the two others' votes and overwrite the tail on
           them. Safe only if the leader of step 3 committed nothing of X's old tail before
           its own NOOP was on a majority (Raft §5.4.2; mutation `old-term-commit`)."""
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead or self.f8 is not None or any(not m.up for m in self.nodes):
            return
        r = self.rng
        x = lead[0]
        y = r.choice([m for m in self.nodes if m is not x])
        links = self._isolate([x.idx, y.idx])
        self.blocked.update(links)
        self.f8 = dict(phase="cut", x=x.idx, y=y.idx, term=x.block.member.current_term, links=links)
        self.stats["figure8_shapes"] += 1
        self.trace_event("net", "cut", f"figure8: isolate leader {x.id} with {y.id}")
        for a in self.actors:  # the writers write to X while its lease lasts: its tail
            if isinstance(a, ClientActor):
                a.w.target = x.idx
        self.quiet_until = self.now + 15_000
        f8 = self.f8

        def abort() -> None:
            if self.f8 is f8:
                self._figure8_end(f"figure8: gave up in phase {f8['phase']}")

        self.schedule(self.now + 14_000, "call", abort)

    def _figure8_end(self, why: str) -> None:
        f8, self.f8 = self.f8, None
        if f8 is not None:
            self.stats[f"figure8_end_{f8['phase']}"] += 1
            self.blocked.difference_update(f8["links"])
            self.trace_event("net", "heal", why)
        self.quiet_until = self.now

    def _figure8_leader(self, n: Node, term: int) -> None:
        """Fault figure8, steps 2 and 3: a node became leader."""
        f8 = self.f8
        xy = (f8["x"], f8["y"])
        if f8["phase"] == "cut" and n.idx not in xy and term > f8["term"]:
            links = self._isolate([n.idx])  # Z: its NOOP goes nowhere
            self.blocked.difference_update(f8["links"])
            self.blocked.update(links)
            self.blocked.update(self._isolate(list(xy)))
            f8.update(phase="z-cut", z=n.idx, links=links + self._isolate(list(xy)))
            self.trace_event("net", "cut", f"figure8: isolate {n.id}, just elected in term {term}")

            def rejoin() -> None:
                if self.f8 is f8 and f8["phase"] == "z-cut":
                    self.blocked.difference_update(f8["links"])
                    f8["links"] = self._isolate([f8["z"]])
                    self.blocked.update(f8["links"])
                    f8["phase"] = "rejoin"
                    self.trace_event("net", "heal", f"figure8: n{f8['x']} and n{f8['y']} rejoin, n{f8['z']} stays away")

            self.schedule(self.now + self.rng.randint(200, 800), "call", rejoin)
        elif f8["phase"] == "rejoin":
            if n.idx in xy:
                f8.update(phase="leading", lead=n.idx, lead_term=term)
            else:
                self._figure8_end(f"figure8: {n.id} led instead")

    def on_quorum_write(self, n: Node, index: int, term: int) -> None:
        """Fault figure8, step 4: the leader of step 3 published its first quorum index."""
        f8 = self.f8
        if f8 is None or f8["phase"] != "leading" or n.idx != f8["lead"] or not self.faulting:
            return
        if index <= max(m.max_committed for m in self.nodes):
            return  # not a commit: the first view a new ack checker publishes
        f8["phase"] = "crash"
        lead = n
        other = self.nodes[f8["y"] if f8["lead"] == f8["x"] else f8["x"]]
        r = self.rng

        def strike() -> None:
            if self.f8 is not f8:
                return
            self.trace_event("sim", "figure8", f"crash {lead.id} after its quorum {index} (term {term}); "
                             f"{other.id} away, n{f8['z']} back")
            self.crash_node(lead, torn=False, down_ms=r.randint(4000, 6000))
            for m in self.nodes:  # the two others' handlers die too: the pushes in flight are lost
                h = self._node_actor(m, "handler") if m.idx not in (lead.idx, other.idx, f8["z"]) else None
                if h is not None:
                    self.kill_actor(h, "figure8")
            self.blocked.difference_update(f8["links"])
            f8["links"] = self._isolate([other.idx])
            self.blocked.update(f8["links"])
            f8["phase"] = "z-back"

            def done() -> None:
                if self.f8 is f8:
                    self._figure8_end("figure8: done")

            self.schedule(self.now + r.randint(3000, 5000), "call", done)

        self.schedule(self.now + r.randint(3, 15), "call", strike)

    def _lagging_install_shape(self) -> None:
        """A follower (or the leader, which then comes back as a follower with an uncommitted
        tail) is kept away -- cut off, or its node down -- for 2-8 s while the writers write:
        snapshots are taken and retention deletes the entries it would need, so when it is back
        the leader must install its snapshot. Other faults are held off while it is away, not
        during the install that follows (the install faults of `_install_frame` aim at it)."""
        r = self.rng
        up = [m for m in self.nodes if m.up]
        if not up:
            return
        lead = [m for m in up if m.block.member.role == Role.LEADER]
        followers = [m for m in up if m not in lead]
        z = lead[0] if lead and (not followers or r.random() < 0.2) else r.choice(followers or up)
        ms = r.randint(2000, 8000)
        self.quiet_until = self.now + ms
        self.stats["lagging_install_shapes"] += 1
        if r.random() < 0.6 and "partition" in self.faults or "crash" not in self.faults:
            self._cut(self._isolate([z.idx]), f"keep {z.id} away (install)", ms)
        else:
            self.trace_event("sim", "lagging", f"{z.id} down for {ms} ms (install)")
            self.crash_node(z, torn=r.random() < 0.5, down_ms=ms)

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

    def heal_all(self) -> None:
        self.faulting = False
        self.f8 = None
        self.writing = True
        self.blocked.clear()
        self.trace_event("sim", "heal", "faults off; every node and role restarted")
        for n in self.nodes:
            n.disk_full_until = 0
            n.probe_full_until = 0
            n.answers_lost_until = 0
            for a in list(n.roles.values()):
                if a.alive and a.paused:
                    self.resume_actor(a)
        for n in self.nodes:
            if not n.up:
                self.restart_node(n)
            else:
                for a in list(n.roles.values()):
                    if not a.alive:
                        self._restart_role(n, a.key)

    # ------------------------------------------------------------------ invariants
    def fail(self, what: str) -> None:
        raise Violation(what)

    def _check_answer(self, n: Node, ident: bytes, frame: bytes) -> None:
        """A node's answer to a stamped append agrees with the log: a definite refusal ("not
        stored": DISK_FULL, INTERNAL_ERROR, ...) of a stamp whose body is already committed
        is a lie the client cannot see through (docs/client.md: a resend of an entry the log
        holds is answered with its index, or SESSION_SEQ_TOO_OLD when that is gone)."""
        msg = P.decode(frame)
        for m in ([P.decode(bytes(x)) for x in msg.frames] if isinstance(msg, P.Multi) else [msg]):
            st = self.stamped.pop((ident, m.request_id), None)
            if st is None or not definite_failure(m.code):
                continue
            for b in st[2]:
                i = self.chist_where.get(b)
                if i is not None:
                    self.fail(f"{n.id} answered {RC(m.code).name} to a resend of (session {st[0]:#x}, seq "
                              f"{st[1]}), whose entry {b[:24]!r} is committed at {i} "
                              f"({getattr(m, 'reason', '')[:80]!r})")

    def on_definite(self, bodies: list[bytes], code: int, what: str) -> None:
        """A client reported a definite failure ("not stored"): none of its bodies may commit."""
        self.stats["definite_failures"] += 1
        for b in bodies:
            i = self.chist_where.get(b)
            if i is not None:
                self.fail(f"definite failure reported for an append committed at {i}: {what}")
            self.definite[b] = what

    def on_member_write(self, n: Node, old: Any, new: Any) -> None:
        if new.role != old.role or new.current_term != old.current_term or new.leader_slot != old.leader_slot:
            lead = f" leader=n{new.leader_slot}" if new.leader_slot >= 0 else ""
            self.trace_event(n.id, "member", f"{Role(new.role).name} term={new.current_term}{lead}")
        if new.current_term < n.max_term:
            self.fail(f"{n.id}: term went back from {n.max_term} to {new.current_term}")
        n.max_term = new.current_term
        if new.role == Role.LEADER:
            prev = self.leaders.get(new.current_term)
            if prev is not None and prev != n.id:
                self.fail(f"two leaders in term {new.current_term}: {prev} and {n.id}")
            self.leaders[new.current_term] = n.id
            if self.f8 is not None and (old.role != Role.LEADER or old.current_term != new.current_term):
                self._figure8_leader(n, new.current_term)
            if old.role != Role.LEADER or old.current_term != new.current_term:
                # Never lead twice in one term, across restarts too: a second leadership of one
                # term may write a different entry at an (index, term) a follower already holds.
                if (n.id, new.current_term) in self.led:
                    self.fail(f"{n.id} became leader of term {new.current_term} a second time")
                self.led.add((n.id, new.current_term))

    def on_ledger_write(self, n: Node, old: Any, new: Any) -> None:
        if new.committed_index > new.ledger_end_index:
            self.fail(f"{n.id}: published committed {new.committed_index} > ledger end {new.ledger_end_index}")
        if (new.ledger_end_index, new.committed_index) != (old.ledger_end_index, old.committed_index):
            self.trace_event(n.id, "ledger", f"begin={new.ledger_begin_index} end={new.ledger_end_index} "
                             f"term={new.ledger_end_term} committed={new.committed_index}")

    def on_ack(self, index: int, body: bytes, term: int) -> None:
        """An acknowledgement names an entry by (index, term): both must be where the body is.
        Term -1: a resend whose entry retention deleted (answered with its index only): the
        body must be committed there already."""
        self.stats["acked"] += 1
        self.last_ack_at = self.now
        if term == -1:
            if index >= len(self.chist) or self.chist[index][2] != body:
                got = self.chist[index][2][:24] if index < len(self.chist) else "nothing committed yet"
                self.fail(f"resend of {body[:24]!r} acknowledged at deleted index {index}, which holds {got!r}")
            return
        prev = self.acked.get(index)
        if prev is not None and prev != (body, term):
            self.fail(f"index {index} acknowledged twice differently: {prev[0][:24]!r} term {prev[1]} / "
                      f"{body[:24]!r} term {term}")
        self.acked[index] = (body, term)
        self.acked_max = max(self.acked_max, index)
        if index < len(self.chist) and self.chist[index][::2] != (term, body):
            self.fail(f"acknowledged append {body[:24]!r} at {index} term {term}, but the committed entry "
                      f"there is {self.chist[index][2][:24]!r} term {self.chist[index][0]}")

    def check(self) -> None:
        for n in self.nodes:
            s = n.store
            if s is None:
                continue
            c = s.committed_index
            if c > n.max_committed:
                n.max_committed = c
            if c > s.ledger_end_index:
                self.fail(f"{n.id}: committed {c} > ledger end {s.ledger_end_index}")
            if c > n.checked:
                n.checked = self._check_committed(n, s, n.checked + 1, c)
        if self.smc is not None:
            self.smc.check()

    def record_committed(self, n: Node, s: Any, count: bool = False) -> None:
        """Read (and check) the node's committed entries into the history now, before its
        retention deletes some of them (SimSegmentStore.delete_before)."""
        if count:
            self.stats["retention_deletions"] += 1
        if s.committed_index > n.checked:
            n.checked = self._check_committed(n, s, n.checked + 1, s.committed_index)

    def _check_committed(self, n: Node, s: Any, lo: int, hi: int) -> int:
        """Check the node's committed entries lo..hi against the history (extending it); return
        the highest index checked (the history's end when the node's log begins after it)."""
        lo = max(lo, s.ledger_begin_index, 0)
        h = self.chist
        if lo > len(h):
            # Its log begins after the history's end: a leader installed a snapshot here that
            # its own store has not marked committed yet (its ack checker publishes the commit
            # first). Entries before the log's begin are not here to read: wait for the history.
            return len(h) - 1
        for i in range(lo, hi + 1):
            try:
                e = s.get(i)
            except StoreError as err:  # a damaged entry was stored and then committed (t1)
                self.fail(f"{n.id}: committed entry {i} cannot be read back: {err}")
            got = (e.term, e.magic, bytes(e.body))
            if i < len(h):
                if h[i] != got:
                    self.fail(f"{n.id}: committed entry {i} is (term {got[0]}, {got[2][:24]!r}) but the "
                              f"group committed (term {h[i][0]}, {h[i][2][:24]!r})")
                continue
            if i != len(h):
                self.fail(f"{n.id}: committed {i} while the history ends at {len(h) - 1}")
            if got[1] == codec.MAGIC_NOOP:
                if got[2]:
                    self.fail(f"{n.id}: NOOP entry {i} has a body")
            elif got[2] not in self.sent:
                self.fail(f"{n.id}: committed entry {i} {got[2][:24]!r} was never written by a client")
            elif got[2] in self.chist_where:
                if self.repeats[got[2]] <= 0:
                    stamp = f", stamp (session, seq) {_stamp_at(s, i)}" if self.sessions else ""
                    self.fail(f"{n.id}: body {got[2][:24]!r} committed twice ({self.chist_where[got[2]]} and {i}"
                              f"{stamp})")
                self.repeats[got[2]] -= 1
            if got[1] != codec.MAGIC_NOOP:
                self.chist_where[got[2]] = i
                why = self.definite.get(got[2])
                if why is not None:
                    self.fail(f"{n.id}: committed entry {i} {got[2][:24]!r} was reported a definite failure: {why}")
                if self.sessions:
                    self._check_stamp(n, s, i)
            if i > 0 and got[0] < h[i - 1][0]:
                self.fail(f"{n.id}: committed term goes back at {i}")
            h.append(got)
            a = self.acked.get(i)
            if a is not None and a != (got[2], got[0]):
                self.fail(f"acknowledged append {a[0][:24]!r} at {i} term {a[1]}, but {got[2][:24]!r} term "
                          f"{got[0]} was committed there")
        return hi

    def _check_stamp(self, n: Node, s: Any, i: int) -> None:
        """Every (session, seq) is committed at most once."""
        session, seq = _stamp_at(s, i)
        if not session:
            return
        prev = self.stamp_where.get((session, seq))
        if prev is not None and prev != i:
            self.fail(f"{n.id}: (session {session:#x}, seq {seq}) committed twice: at {prev} and {i}")
        self.stamp_where[(session, seq)] = i

    def converged(self) -> str | None:
        """None when the group is settled: one leader everyone follows, identical logs, every
        entry committed, every acknowledged append in the history. Otherwise why not."""
        for n in self.nodes:
            if not n.up or any(not a.alive for a in n.roles.values()) or n.store is None:
                return f"{n.id} not fully up"
        ms = [n.block.member for n in self.nodes]
        leaders = [i for i, m in enumerate(ms) if m.role == Role.LEADER]
        if len(leaders) != 1:
            return f"leaders: {leaders}"
        lt = ms[leaders[0]].current_term
        for i, m in enumerate(ms):
            if m.current_term != lt or (i != leaders[0] and (m.role != Role.FOLLOWER or m.leader_slot != leaders[0])):
                return f"n{i} is {Role(m.role).name} term {m.current_term}"
        ls = self.nodes[leaders[0]].store
        end = ls.ledger_end_index
        if end < 0 or ls.term_at(end) != lt:
            return "leader has not appended its NOOP"
        for n in self.nodes:
            s = n.store
            if s.ledger_end_index != end or s.committed_index != end:
                lag = ""
                if s.ledger_end_index < ls.ledger_begin_index - 1:  # liveness of install snapshot
                    lag = f" (the leader's log begins at {ls.ledger_begin_index}: it needs an install)"
                return f"{n.id}: end {s.ledger_end_index} committed {s.committed_index}, leader end {end}{lag}"
        missing = [i for i in self.acked if i >= len(self.chist)]
        if missing:
            return f"acknowledged indexes {missing[:5]} not in the committed history"
        return self.smc.converged(end) if self.smc is not None else None

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        try:
            while self.steps < self.cfg.steps:
                self.step_once()
            self.heal_all()
            stop_writes = self.now + 200
            full = self._fill_leaders_disk() if "disk-full" in self.faults else None
            if full is not None:
                stop_writes = full + FAILOVER_MS
            deadline = self.now + self.cfg.heal_ms
            next_check = self.now
            while True:
                self.step_once()
                if full is not None and self.now >= full + FAILOVER_MS:
                    if self.last_ack_at < full + FAILOVER_MS // 2:
                        self.fail(f"no append acknowledged in the {FAILOVER_MS // 2}-{FAILOVER_MS} ms after the "
                                  f"leader's disk filled, with the other nodes healthy: the group did not fail over")
                    full = None
                if self.writing and self.now >= stop_writes:
                    self.writing = False
                if not self.writing and self.now >= next_check:
                    next_check = self.now + 50
                    why = self.converged()
                    if why is None:
                        break
                    if self.now >= deadline:
                        self.fail(f"no convergence {self.cfg.heal_ms} ms after the faults stopped: {why}")
            for n in self.nodes:  # final: every replica's whole log is the history
                n.checked = -1
            self.check()
            top = max(n.store.committed_index for n in self.nodes)
            if len(self.chist) - 1 < top:
                self.fail(f"entries {len(self.chist)}..{top} are committed but no replica's log held them "
                          f"where the history check could read them")
            if self.smc is not None:
                self.smc.final_check()
        finally:
            self.close()

    def close(self) -> None:
        global _ACTIVE
        for a in self.actors:
            if a.alive:
                a.kill()
        for n in self.nodes:
            s = n.store
            if s is not None:
                with contextlib.suppress(Exception):
                    s.data.close()
                    s.index.close()
        if _ACTIVE is self:
            _ACTIVE = None
        self._log_undo()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _stamp_at(s: Any, i: int) -> tuple[int, int]:
    """The (session, seq) stamped on entry `i` of store `s` ((0, 0): none)."""
    blob, k = s.get_raw(i, 1, 1 << 20)
    if not k:
        return 0, 0
    _size, _idx, session, seq = _STAMP.unpack_from(blob, 0)
    return session, seq


class _TraceLogs(logging.Handler):
    """Library loggers (the store's recovery, ...) go into the trace, not to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        s = _ACTIVE
        if s is not None and record.levelno >= logging.INFO:
            if isinstance(record.msg, str) and "opened in %" in record.msg:
                return  # the store's wall-clock open time: not part of a replayable trace
            s.trace_event(record.name.rsplit(".", 1)[-1], "log", (record.levelname[0], record.msg, record.args))
            if isinstance(record.msg, str) and record.msg.startswith("resuming install"):
                s.stats["install_resumes"] += 1  # a receiver reopened a partial install (restart)


def _capture_logs() -> Any:
    lg = logging.getLogger("dledger")
    h = _TraceLogs()
    saved = (lg.propagate, lg.level)
    lg.addHandler(h)
    lg.propagate = False
    lg.setLevel(logging.INFO)

    def undo() -> None:
        lg.removeHandler(h)
        lg.propagate, lg.level = saved[0], saved[1]
    return undo


def _tmp_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


# ---------------------------------------------------------------------------------------------
# the role modules read this clock (before C7 they call monotonic_ms() directly)
# ---------------------------------------------------------------------------------------------
_ACTIVE: Sim | None = None


def _install_clock() -> None:
    """Roles read `rc.clock` (C7); what still calls the module-level clock or measures the disk
    gets the virtual clock / the simulated disk (`Sim.disk_ratio`: empty unless retention is
    modelled) while a Sim runs, and the real ones otherwise."""
    import importlib

    from node import shared_state

    real_clock = shared_state.monotonic_ms

    def clock() -> int:
        s = _ACTIVE
        return s.clock_now() if s is not None else real_clock()

    for name in ("handler", "handling.ledger", "dispatcher", "elector", "ack_checker", "runtime"):
        try:
            mod = importlib.import_module(f"node.roles.{name}")
        except Exception:  # noqa: BLE001 - a role module mid-refactor: the run reports it
            continue
        if getattr(mod, "monotonic_ms", None) is real_clock:
            mod.monotonic_ms = clock
        real_ratio = getattr(mod, "disk_usage_ratio", None)
        if real_ratio is not None and not getattr(real_ratio, "_sim", False):
            def ratio(path: Any, _real: Any = real_ratio) -> float:
                return _ACTIVE.disk_ratio_at(path) if _ACTIVE is not None else _real(path)
            ratio._sim = True  # type: ignore[attr-defined]
            mod.disk_usage_ratio = ratio
    from node.statemachine import snapshot_take

    real_utc_now = snapshot_take.utc_now
    if not getattr(real_utc_now, "_sim", False):
        def utc_now() -> str:
            """A snapshot's `created` (informational) on the virtual clock: it travels in every
            install chunk's meta, so a wall-clock one would make traces differ between replays."""
            s = _ACTIVE
            if s is None:
                return real_utc_now()
            from datetime import UTC, datetime
            t = datetime.fromtimestamp(s.now / 1000, UTC)
            return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        utc_now._sim = True  # type: ignore[attr-defined]
        snapshot_take.utc_now = utc_now
    from node.roles import retention

    if not isinstance(retention.time, _RetentionTime):
        retention.time = _RetentionTime(retention.time)  # type: ignore[assignment]


class _RetentionTime:
    """node.roles.retention's `time` while a Sim runs: every file is old (the simulated nodes
    keep no file for `file_reserved_hours`) and durations are virtual, so a seed replays."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def time(self) -> float:
        return 1e12 if _ACTIVE is not None else self.real.time()

    def perf_counter(self) -> float:
        return _ACTIVE.now / 1000 if _ACTIVE is not None else self.real.perf_counter()


_install_clock()


@dataclass
class Result:
    seed: int
    ok: bool
    error: str = ""
    trace: str = ""
    steps: int = 0
    virtual_ms: int = 0
    trace_hash: str = ""
    stats: dict[str, int] = field(default_factory=dict)


def run_seed(cfg: SimConfig) -> Result:
    """Run one seed; never raises for an invariant violation (the Result says what broke)."""
    sim = Sim(cfg)
    try:
        sim.run()
    except Violation as v:
        return Result(cfg.seed, False, str(v), sim.format_trace(), sim.steps, sim.now,
                      sim.hash.hexdigest() if sim.hash else "", dict(sim.stats))
    return Result(cfg.seed, True, "", "", sim.steps, sim.now, sim.hash.hexdigest() if sim.hash else "",
                  dict(sim.stats))
