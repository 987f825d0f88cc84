"""The simulated clients: writers (plain or with sessions, pipelining, a malformed one) and a
reader, each an actor that sends real protocol frames through the simulated network and
checks every answer against the group's history (tools/sim/invariants.py).
"""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import is_indeterminate, is_retryable
from node.core.sessions import seq_add
from node.store import codec
from tools.sim import actors as A
from tools.sim.config import Violation
from tools.sim.trace import _summ

if TYPE_CHECKING:
    from tools.sim.world import Sim

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
            # It timed out here already: the bodies are forgotten, so the late answer tells the
            # safety checks nothing; but a SUCCESS still shows the group commits (liveness), which
            # is what the disk-full failover check asks, whatever timeout this client drew.
            if msg.code == RC.SUCCESS and isinstance(msg, (P.AppendResponse, P.BatchAppendResponse)):
                sim.on_late_ack()
            return
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
            i = index
            for _off, e in codec.iter_entries(msg.entries):
                if e.index != i:
                    sim.fail(f"GET {index} served entry {e.index} at position {i - index} of its answer")
                sim.check_served(f"GET {index}", e.index, (e.term, e.magic, bytes(e.body)))
                i += 1
            return
        if lin and msg.code == RC.INDEX_OUT_OF_RANGE and index <= acked_max and not _compacted(index, msg):
            sim.fail(f"stale linearizable read: GET {index} answered INDEX_OUT_OF_RANGE by {msg.leader_id or '?'} "
                     f"(term {msg.term}) after index {acked_max} was acknowledged")
        if msg.code != RC.INDEX_OUT_OF_RANGE:
            ids = [n.id for n in sim.nodes]
            leader = getattr(msg, "leader_id", "")
            self.target = ids.index(leader) if leader in ids else sim.rng.randrange(sim.cfg.nodes)


_RANGE = re.compile(r"committed range is \[(-?\d+), (-?\d+)\]")


def _compacted(index: int, msg: Any) -> bool:
    """An INDEX_OUT_OF_RANGE for an index retention deleted (below the ledger begin it names)."""
    m = _RANGE.search(getattr(msg, "reason", "") or "")
    return m is not None and index < int(m.group(1))
