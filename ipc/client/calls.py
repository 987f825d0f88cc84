"""The record of one logical client request across its attempts, and the small pieces every
part of the client shares about it: its kind, its state, its backoff, its wire encoding, and
the bound on how many may be in flight.

A call is created on a caller thread and, once submitted, touched by the I/O thread only: no
lock guards its fields. Kinds and states are small ints (not enums) because the I/O thread
tests them once per append on the hot path.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.client.results import AppendResult, DLedgerError, QueryResult, _make_error
from ipc.codes import ResponseCode as RC

if TYPE_CHECKING:
    from ipc.client.connections import Node

BACKOFF_BASE = 0.005
BACKOFF_MAX = 0.2

# Kinds of call.
APPEND, BATCH, GET, META, TRANSFER, OPEN, QUERY, SNAPSHOT, FETCH, MEMBER = range(10)
KIND_NAMES = ("APPEND", "BATCH_APPEND", "GET", "METADATA", "LEADERSHIP_TRANSFER", "OPEN_SESSION",
              "QUERY", "SNAPSHOT", "FETCH", "MEMBER_CHANGE")
# States of a call: not yet dispatched, one attempt outstanding, parked (for a leader or a
# session), waiting out a backoff, completed.
NEW, INFLIGHT, WAITING, BACKOFF, DONE = range(5)
# Answers to a session append after which the same stamp may simply be sent again: the entry
# is not in that leader's log (yet): its predecessors are missing, or the answer was lost.
SESSION_RESEND = frozenset({RC.SESSION_SEQ_GAP})


class Call:
    """One logical request across its attempts. At most one attempt is outstanding at a time,
    so a call can never be stored twice by this client."""

    __slots__ = ("kind", "payload", "future", "deadline", "pinned", "state", "rid", "node",
                 "attempts", "redirects", "last", "timer_seq", "slot", "sid", "seq", "unsure",
                 "no_result", "fixed")

    def __init__(self, kind: int, payload: Any, deadline: float, pinned: str | None = None) -> None:
        self.kind = kind
        self.payload = payload
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()  # not cancellable: a sent append cannot be recalled
        self.deadline = deadline
        self.pinned = pinned  # METADATA / TRANSFER go to one given node and return its raw answer
        self.state = NEW
        self.rid = 0
        self.node: Node | None = None
        self.attempts = 0
        self.redirects = 0
        self.last: tuple[int, str] | None = None  # the last definite failure, for the final error
        self.timer_seq = -1
        self.slot = False
        self.sid = 0  # the session stamp (sid, seq) of an append, given at its first dispatch
        self.seq = 0
        self.unsure = False  # an attempt was sent and its outcome is unknown
        self.no_result = False  # an APPEND answered at commit, without the state machine's result
        # A stamp the caller chose (ipc/client/writer.py): resent under it, never re-stamped, and
        # a session the leader forgot fails the call instead of moving it to a new session.
        self.fixed = False

    @property
    def may_write(self) -> bool:
        return self.kind == APPEND or self.kind == BATCH

    @property
    def count(self) -> int:
        return len(self.payload) if self.kind == BATCH else 1


def backoff(attempt: int) -> float:
    """Capped exponential backoff with jitter (so many clients do not retry in lockstep)."""
    return min(BACKOFF_MAX, BACKOFF_BASE * (1 << min(attempt, 10))) * (0.5 + 0.5 * random.random())


def give_up_error(call: Call) -> DLedgerError:
    """What a call whose deadline passed with nothing outstanding fails with: the last definite
    outcome, or an indeterminate one if an attempt of a session write may have been stored."""
    if call.kind == OPEN:
        return DLedgerError(RC.TIMEOUT, "no leader answered OPEN_SESSION within the timeout")
    if call.unsure:
        code, reason = call.last or (RC.TIMEOUT, "no answer")
        return _make_error(code, f"{reason} (resent under its session for the whole timeout; it may "
                                 "still be committed)", indeterminate=True,
                           node=call.node.id if call.node else None)
    if call.last is None:
        return DLedgerError(RC.TIMEOUT, "no reachable leader found within the timeout "
                                        "(nothing was sent)")
    code, reason = call.last
    return DLedgerError(code, f"{reason} (gave up after {call.attempts + 1} attempts "
                              "within the timeout)")


def encode_request(group: str, call: Call, node_id: str, rid: int) -> bytes:
    """The frame of one attempt of `call` to `node_id`, under request id `rid`."""
    k = call.kind
    if k == APPEND:
        return P.encode_append(group, node_id, call.payload, rid, call.sid, call.seq, call.no_result)
    if k == BATCH:
        return P.encode(P.BatchAppendRequest(group, node_id, call.payload, rid, call.sid, call.seq))
    if k == OPEN:
        return P.encode(P.OpenSessionRequest(group, node_id, rid))
    if k == GET:
        index, count, lin = call.payload
        return P.encode(P.GetRequest(group, node_id, index, count, lin, rid))
    if k == META:
        return P.encode(P.MetadataRequest(group, node_id, rid))
    if k == QUERY:  # to a named node (read_from): any member may answer
        return P.encode(P.QueryRequest(group, node_id, call.payload, rid,
                                       any_member=call.pinned is not None))
    if k == SNAPSHOT:
        return P.encode(P.SnapshotRequest(group, node_id, rid))
    if k == MEMBER:
        return P.encode(P.MemberChangeRequest(group, node_id, *call.payload, request_id=rid))
    if k == FETCH:  # always to a named node: any member answers
        index, max_entries, max_bytes, wait_ms = call.payload
        return P.encode(P.FetchRequest(group, node_id, index, max_entries, max_bytes, wait_ms, rid))
    target, term = call.payload
    return P.encode(P.LeadershipTransferRequest(group, node_id, target, term, rid))


UNEXPECTED = object()
"""`success_value`'s answer to a SUCCESS whose message type does not fit the call."""


def success_value(call: Call, msg: P.Message) -> Any:
    """What a SUCCESS answer resolves `call` with (a pinned call's caller reads the raw answer
    itself), or UNEXPECTED."""
    kind = call.kind
    if kind == APPEND and type(msg) is P.AppendResponse:
        r = msg.result
        return AppendResult(msg.index, msg.term, msg.pos, None if r is None else bytes(r))
    if kind == BATCH and type(msg) is P.BatchAppendResponse:
        n = len(call.payload)
        if len(msg.positions) == n:
            first, term = msg.first_index, msg.term
            if msg.results is None:
                return [AppendResult(first + i, term, p) for i, p in enumerate(msg.positions)]
            return [AppendResult(first + i, term, p, None if r is None else bytes(r))
                    for i, (p, r) in enumerate(zip(msg.positions, msg.results, strict=True))]
        return UNEXPECTED
    if kind == MEMBER and type(msg) is P.AppendResponse:
        return msg.index  # the configuration entry's index, committed
    if kind == QUERY and type(msg) is P.QueryResponse:
        return QueryResult(bytes(msg.answer), msg.applied_index)
    if kind == GET and type(msg) is P.GetResponse:
        return msg
    if kind == OPEN and type(msg) is P.OpenSessionResponse:
        return msg.session
    return UNEXPECTED


class Slots:
    """The in-flight bound: a counting semaphore whose waiters are woken with hysteresis.

    threading.Semaphore wakes a blocked submitter on every release; with a full window that is
    one thread switch per completed append. Here a blocked submitter is woken once the window
    has drained to a low-water mark (or at the end of an I/O loop turn that freed slots, see
    `kick`), and then refills it in one go.
    """

    __slots__ = ("limit", "low", "used", "waiters", "cond")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.low = limit - max(1, limit // 4)
        self.used = 0
        self.waiters = 0
        self.cond = threading.Condition(threading.Lock())

    def acquire(self, blocking: bool, timeout: float = 0.0) -> bool:
        with self.cond:
            if self.used < self.limit:
                self.used += 1
                return True
            if not blocking:
                return False
            deadline = time.monotonic() + timeout
            self.waiters += 1
            try:
                while self.used >= self.limit:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.cond.wait(left):
                        if self.used < self.limit:
                            break
                        return False
            finally:
                self.waiters -= 1
            self.used += 1
            return True

    def release(self) -> None:
        with self.cond:
            self.used -= 1
            if self.waiters and self.used <= self.low:
                self.cond.notify_all()

    def kick(self) -> None:
        """Wake blocked submitters if any slot is free (once per I/O loop turn, so a window
        that never drains to the low-water mark still lets them in)."""
        if self.waiters and self.used < self.limit:
            with self.cond:
                self.cond.notify_all()
