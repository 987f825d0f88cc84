"""The DLedger client library: find the leader, append, read, inspect, transfer leadership.

Public API (CONTRACT "Client library")::

    from ipc.client import DLedgerClient, DLedgerError

    with DLedgerClient(peers="n0-127.0.0.1:20911;n1-127.0.0.1:20913", group="default",
                       timeout=3.0) as c:
        r = c.append(b"body")              # AppendResult(index, term, pos)
        rs = c.append_batch([b"a", b"b"])   # list[AppendResult], contiguous indexes
        f = c.append_async(b"x")            # concurrent.futures.Future[AppendResult]
        e = c.get(r.index)                  # Entry(index, term, pos, body, type)
        es = c.get_range(0, 100)            # list[Entry], committed entries only
        m = c.metadata()                    # Metadata(group, leader_id, term, nodes)
        c.transfer_leadership("n1")

Why it is built this way
------------------------
*One I/O thread, many callers.* pyzmq sockets are not thread-safe, so exactly one background
thread owns every socket (one DEALER per node). Callers hand it work through a deque plus a
wake-up file descriptor (an eventfd registered in the thread's ``zmq.Poller``), and get a
``concurrent.futures.Future`` back. Every attempt carries a fresh request id (u64) that the
node echoes, so replies are matched to calls without any ordering assumption, and thousands of
appends can be in flight on one connection (pipelining). Synchronous methods are the async
machinery plus a wait. A counting semaphore bounds the calls in flight (``max_in_flight``): submitting
more blocks the caller until a slot frees (backpressure instead of unbounded memory).

*Definite vs indeterminate (SPEC §6).* A reply of NOT_LEADER, LEADER_PENDING_FULL,
LEADER_TRANSFERRING or TERM_NOT_READY means the entry was NOT stored, so the client retries
(following ``leader_id`` redirects, with capped exponential backoff) inside the call's one
overall ``timeout``. WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED, and a request that was sent but
never answered mean the entry *may still commit*: the call ends with a
:class:`DLedgerIndeterminateError` (``.indeterminate`` is True) and is never resent, because a
resend to another node could store the body twice. A request that could not even be handed to
a connected socket was not sent, so it is retried like a definite failure. Reads and metadata
have no side effects and are retried on any retryable outcome, including timeouts.

*Sessions (exactly-once appends).* By default the client opens a session with the leader
(OPEN_SESSION) and stamps each append with (session, seq), seqs in submission order. Then an
append without a definite answer (no answer within ``attempt_timeout``, WAIT_QUORUM_ACK_TIMEOUT,
TERM_CHANGED) is *resent* under the same stamp, to whichever node leads: the leader answers a
stamp its log already holds with the original index (node/core/sessions.py). Such an append is
indeterminate only if its whole ``timeout`` passes. A session the leader no longer knows is
replaced, and a write that cannot have been stored is resent under the new one; a write that
gave up abandons its session (its seq may be a hole). docs/client.md "Sessions".

*Leader discovery.* While no leader is known, calls wait and the I/O thread asks every node
for METADATA in parallel; the first leader claim releases them, a higher-term claim in the same
round replaces it. Appends are therefore never sent "to see what happens" to a node that might
be dead, which would turn a definite failure into an indeterminate one.

*Lazy Pirate (zguide).* Each attempt has a deadline; a node that lets one pass is suspect: it
stops being the leader hint, and once nothing else is in flight on its socket the DEALER is
closed (LINGER 0, so queued frames to a stalled peer are dropped) and recreated.
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq
from zmq.utils.monitor import parse_monitor_message

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role, is_indeterminate, is_retryable
from ipc.sockets import data_address, dealer, make_context, parse_peers
from node.core.sessions import seq_add, seq_after
from node.store import codec

log = logging.getLogger("dledger.client")

DEFAULT_TIMEOUT = 3.0
DEFAULT_ATTEMPT_TIMEOUT = 1.0
"""Longest wait for one answer to an idempotent request (GET, METADATA) before trying again."""
DEFAULT_MAX_IN_FLIGHT = 1024
BACKOFF_BASE = 0.005
BACKOFF_MAX = 0.2


# ---------------------------------------------------------------------------------------------
# Results and errors
# ---------------------------------------------------------------------------------------------


class AppendResult(NamedTuple):
    """Where an acknowledged (committed) entry landed. A NamedTuple rather than a frozen
    dataclass: a batch builds one per entry, and this is half the cost (0.29 vs 0.57 µs)."""

    index: int
    term: int
    pos: int
    result: bytes | None = None  # a group with a state machine: what its `apply` returned


class QueryResult(NamedTuple):
    """A state machine's answer to `query`, and the applied index it reflects."""

    answer: bytes
    applied_index: int


@dataclass(frozen=True, slots=True)
class Entry:
    """A committed entry read back. ``type`` is "NORMAL" or "NOOP" (NOOP bodies are b"")."""

    index: int
    term: int
    pos: int
    body: bytes
    type: str


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node's view, as its METADATA answer said. All None (and alive False) if silent."""

    id: str
    address: str
    role: str | None = None
    term: int | None = None
    leader: str | None = None
    ledger_begin_index: int | None = None
    ledger_end_index: int | None = None
    committed_index: int | None = None
    alive: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The exact object `dledger metadata --json` prints per node (CONTRACT)."""
        return {"id": self.id, "address": self.address, "role": self.role, "term": self.term,
                "leader": self.leader, "ledger_begin_index": self.ledger_begin_index,
                "ledger_end_index": self.ledger_end_index,
                "committed_index": self.committed_index, "alive": self.alive}


@dataclass(frozen=True, slots=True)
class Metadata:
    """The group as seen now. ``leader_id``/``term`` come from the highest-term leader claim."""

    group: str
    leader_id: str | None
    term: int | None
    nodes: list[NodeInfo]

    def to_dict(self) -> dict[str, Any]:
        """The exact object `dledger metadata --json` prints (CONTRACT "Console scripts")."""
        return {"group": self.group, "leader": self.leader_id, "term": self.term,
                "nodes": [n.to_dict() for n in self.nodes]}

    def node(self, node_id: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.id == node_id), None)


class DLedgerError(Exception):
    """A call that did not succeed. ``code`` is DLedger's numeric response code.

    ``indeterminate`` is True when the request may have been delivered and acted on: an append
    that failed this way may still be committed later and must not be reported as "not
    written". Those errors are raised as the subclass :class:`DLedgerIndeterminateError`, so
    ``except DLedgerIndeterminateError`` catches exactly them.
    """

    def __init__(self, code: int, reason: str = "", *, indeterminate: bool = False,
                 node: str | None = None) -> None:
        self.code = int(code)
        self.name = RC.name_of(self.code)
        self.reason = reason
        self.indeterminate = bool(indeterminate)
        self.node = node
        super().__init__(self._message())

    def _message(self) -> str:
        s = f"{self.name} ({self.code})"
        if self.reason:
            s += f": {self.reason}"
        if self.indeterminate:
            s += " (indeterminate: it may still be committed)"
        return s

    @property
    def retryable(self) -> bool:
        return is_retryable(self.code)

    def __reduce__(self):  # picklable across processes (e.g. the bench's worker pool)
        return (_make_error, (self.code, self.reason, self.indeterminate, self.node))


class DLedgerIndeterminateError(DLedgerError):
    """The outcome is unknown (timeout after sending, WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED).

    SPEC §6 asks for a distinct exception type. Retrying such an append may duplicate it.
    """

    def __init__(self, code: int, reason: str = "", *, indeterminate: bool = True,
                 node: str | None = None) -> None:
        super().__init__(code, reason, indeterminate=True, node=node)


def _make_error(code: int, reason: str = "", indeterminate: bool = False,
                node: str | None = None) -> DLedgerError:
    cls = DLedgerIndeterminateError if indeterminate else DLedgerError
    return cls(code, reason, indeterminate=indeterminate, node=node)


class ClientClosedError(RuntimeError):
    """A call on a closed client (a programming error, not an outcome of the cluster)."""


# ---------------------------------------------------------------------------------------------
# Internal call records (touched by the I/O thread only, after submission)
# ---------------------------------------------------------------------------------------------

_APPEND, _BATCH, _GET, _META, _TRANSFER, _OPEN, _QUERY, _SNAPSHOT = range(8)
_NEW, _INFLIGHT, _WAITING, _BACKOFF, _DONE = range(5)
_KIND_NAMES = ("APPEND", "BATCH_APPEND", "GET", "METADATA", "LEADERSHIP_TRANSFER", "OPEN_SESSION",
               "QUERY", "SNAPSHOT")
# Answers to a session append after which the same stamp may simply be sent again: the entry
# is not in that leader's log (yet): its predecessors are missing, or the answer was lost.
_SESSION_RESEND = frozenset({RC.SESSION_SEQ_GAP})


class _Call:
    """One logical request across its attempts. At most one attempt is outstanding at a time,
    so a call can never be stored twice by this client."""

    __slots__ = ("kind", "payload", "future", "deadline", "pinned", "state", "rid", "node",
                 "attempts", "redirects", "last", "timer_seq", "slot", "sid", "seq", "unsure",
                 "no_result")

    def __init__(self, kind: int, payload: Any, deadline: float, pinned: str | None = None) -> None:
        self.kind = kind
        self.payload = payload
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()  # not cancellable: a sent append cannot be recalled
        self.deadline = deadline
        self.pinned = pinned  # METADATA / TRANSFER go to one given node and return its raw answer
        self.state = _NEW
        self.rid = 0
        self.node: _Node | None = None
        self.attempts = 0
        self.redirects = 0
        self.last: tuple[int, str] | None = None  # the last definite failure, for the final error
        self.timer_seq = -1
        self.slot = False
        self.sid = 0  # the session stamp (sid, seq) of an append, given at its first dispatch
        self.seq = 0
        self.unsure = False  # an attempt was sent and its outcome is unknown
        self.no_result = False  # an APPEND answered at commit, without the state machine's result

    @property
    def may_write(self) -> bool:
        return self.kind == _APPEND or self.kind == _BATCH

    @property
    def count(self) -> int:
        return len(self.payload) if self.kind == _BATCH else 1


class _Node:
    __slots__ = ("id", "address", "endpoint", "sock", "mon", "inflight", "suspect", "unresponsive")

    def __init__(self, node_id: str, host: str, port: int) -> None:
        self.id = node_id
        self.address = f"{host}:{port}"
        self.endpoint = data_address(host, port)
        self.sock: zmq.Socket | None = None
        self.mon: zmq.Socket | None = None  # the DEALER's monitor: its connection dropped
        self.inflight = 0
        self.suspect = False  # its socket is to be recreated once nothing is in flight on it
        self.unresponsive = False  # let a deadline pass and has not answered anything since


class _Discovery:
    """One round of "who is the leader?": METADATA to every node at once."""

    __slots__ = ("rids", "found", "best_term", "answered", "errors", "timer_seq")

    def __init__(self) -> None:
        self.rids: dict[int, str] = {}
        self.found = False
        self.best_term = -1
        self.answered = 0
        self.errors: list[tuple[int, str]] = []
        self.timer_seq = -1


class _Timer:
    __slots__ = ("timer_seq",)

    def __init__(self) -> None:
        self.timer_seq = -1


class _Waker:
    """Cross-thread wake-up for the I/O thread's poller: an eventfd (a pipe where there is none).

    A zmq PAIR/PUSH per caller thread would also work, but callers are arbitrary threads and
    sockets are not thread-safe; a file descriptor write is, and the poller watches fds too.
    """

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.rfd = self.wfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - non-Linux
            self.rfd, self.wfd = os.pipe()
            os.set_blocking(self.rfd, False)
            os.set_blocking(self.wfd, False)

    def wake(self) -> None:
        try:
            os.write(self.wfd, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except BlockingIOError:  # pipe full: it is readable anyway
            pass

    def drain(self) -> None:
        try:
            os.read(self.rfd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.rfd)
        if self.wfd != self.rfd:
            os.close(self.wfd)


class _Slots:
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


def _backoff(attempt: int) -> float:
    """Capped exponential backoff with jitter (so many clients do not retry in lockstep)."""
    return min(BACKOFF_MAX, BACKOFF_BASE * (1 << min(attempt, 10))) * (0.5 + 0.5 * random.random())


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


class DLedgerClient:
    """A thread-safe, pipelining client for one DLedger group.

    ``peers`` is DLedger's ``id-host:port;...`` string (or the dict ``parse_peers`` returns).
    ``timeout`` bounds every call (seconds), retries included; each method also takes a
    ``timeout=`` override. ``attempt_timeout`` bounds one attempt of an idempotent request
    (GET, per-node METADATA) before it is tried again. ``max_in_flight`` bounds the calls in
    flight at once; more submissions block until one completes.

    Create the client in the process that uses it (the ZeroMQ context never crosses a fork).
    Future callbacks run on the client's I/O thread: keep them short and do not make blocking
    calls on this client from them.
    """

    def __init__(self, peers: str | Mapping[str, tuple[str, int]], group: str = "default",
                 timeout: float = DEFAULT_TIMEOUT, *, attempt_timeout: float | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 max_body_size: int = P.DEFAULT_MAX_BODY, sessions: bool = True) -> None:
        peer_map = parse_peers(peers) if isinstance(peers, str) else dict(peers)
        if not peer_map:
            raise ValueError("no peers")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        P.encode(P.MetadataRequest(group, "x"))  # validates the group name early (ProtocolError)
        self.group = group
        self.timeout = float(timeout)
        self.attempt_timeout = float(attempt_timeout if attempt_timeout is not None
                                     else min(DEFAULT_ATTEMPT_TIMEOUT, timeout))
        self.max_in_flight = max_in_flight
        self.max_body_size = max_body_size
        self.peers = {nid: (h, p) for nid, (h, p) in peer_map.items()}
        self._pid = os.getpid()

        # Shared between caller threads and the I/O thread.
        self._inbox: deque[_Call] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = False
        self._wake_armed = False
        self._slots = _Slots(max_in_flight)
        self._closed_event = threading.Event()
        self._waker = _Waker()

        # Owned by the I/O thread.
        self._nodes = {nid: _Node(nid, h, p) for nid, (h, p) in self.peers.items()}
        self._node_order = list(self._nodes.values())
        self._leader: str | None = None
        self._pending: dict[int, _Call] = {}
        self._live: set[_Call] = set()
        self._waiting: list[_Call] = []
        self._timers: list[tuple[float, int, Any]] = []  # heap, for out-of-order deadlines
        # Deadlines set in non-decreasing order (every call with the default timeout) go to a
        # FIFO instead: O(1) per append where a heap of ~100k lazily-deleted entries was not.
        self._fifo: collections.deque[tuple[float, int, Any]] = collections.deque()
        self._tseq = itertools.count()
        self._rids = itertools.count(1)  # 0 is what a server echoes when it could not read the id
        self._disc: _Discovery | None = None
        self._disc_start = _Timer()
        self._disc_last = -math.inf
        self._disc_streak = 0
        self._suspects: set[_Node] = set()
        self._sock_node: dict[zmq.Socket, _Node] = {}
        self._mon_node: dict[zmq.Socket, _Node] = {}  # monitor socket -> its DEALER's node
        # Client session (exactly-once appends; docs/client.md "Sessions"): I/O thread only.
        self._sessions = sessions
        self._sid = 0  # 0: none open (yet, or abandoned)
        self._next_seq = 1
        self._opening: _Call | None = None
        self._session_waiting: list[_Call] = []
        # Order across a session change (docs/client.md "Order"): the writes of an abandoned
        # session not yet resolved, and those of them that were never stored, waiting to be
        # stamped again in their first order, ahead of every write submitted after them.
        self._draining: set[_Call] = set()
        self._restamps: list[tuple[int, _Call]] = []  # (its seq in the abandoned session, write)
        # (session, seq) of the abandoned session's append that was definitely never stored: a
        # leader stores a seq only after the one before it, so no later seq of that session can
        # have been stored either, whatever their attempts saw (they need not wait it out).
        self._hole: tuple[int, int] | None = None
        # Writes of the current session told SESSION_SEQ_GAP, by the seq they wait behind: each
        # is resent right behind the write holding that seq (when that one is sent again, or
        # succeeds), so a backlog behind one lost append drains in one pipelined burst in seq
        # order, not at each write's own backoff (in random order: a convoy that took ~0.15 s
        # a write, timing a writer's appends out for 10 s after a leader's handler was killed).
        self._gap_waiters: dict[int, _Call] = {}
        self._pulling = False

        self._ctx = make_context()
        self._thread = threading.Thread(target=self._io_main, name="dledger-client-io", daemon=True)
        self._io_ident: int | None = None
        self._started = threading.Event()
        self._setup_error: BaseException | None = None
        self._thread.start()
        self._started.wait()
        if self._setup_error is not None:
            self._thread.join()
            self._closed = True
            self._ctx.destroy(linger=0)
            self._waker.close()
            raise self._setup_error

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> DLedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the I/O thread and free every socket. Idempotent.

        Calls still in flight fail with an indeterminate error (they may have been delivered);
        calls never sent fail with a definite one.
        """
        if threading.get_ident() == self._io_ident:
            raise RuntimeError("close() called from a future callback on the client's I/O thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closed_event.set()
        self._stopping = True
        self._waker.wake()
        self._thread.join()
        # Submissions the thread never took: they were not sent.
        while self._inbox:
            call = self._inbox.popleft()
            self._finish(call, exc=DLedgerError(RC.TIMEOUT, "client closed before the request was sent"),
                         live=False)
        self._slots.kick()
        self._ctx.destroy(linger=0)
        self._waker.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ public API
    def append_async(self, body: bytes | bytearray | memoryview,
                     timeout: float | None = None, *,
                     no_result: bool = False) -> concurrent.futures.Future[AppendResult]:
        """Submit one append; the future resolves to its AppendResult once it is committed.

        Returns at once unless ``max_in_flight`` calls are already in flight (then it blocks
        until a slot frees). The future fails with DLedgerError (or its indeterminate subclass).
        ``no_result``: a group with a state machine answers at commit, without waiting for
        (and without) what `apply` returned (`AppendResult.result` is None): one hop sooner.
        """
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"body must be bytes-like, not {type(body).__name__}")
        call = _Call(_APPEND, body, time.monotonic() + (self.timeout if timeout is None else timeout))
        call.no_result = no_result
        if len(body) > self.max_body_size:
            self._finish(call, exc=DLedgerError(
                RC.UNEXPECTED_ARGUMENT, f"body of {len(body)} bytes exceeds max_body_size {self.max_body_size}"), live=False)
            return call.future
        return self._submit(call)

    def append(self, body: bytes | bytearray | memoryview,
               timeout: float | None = None, *, no_result: bool = False) -> AppendResult:
        """Append one body and wait until it is committed. Raises DLedgerError."""
        return self._wait(self.append_async(body, timeout, no_result=no_result), timeout)

    def append_batch_async(self, bodies: Sequence[bytes | bytearray | memoryview],
                           timeout: float | None = None) -> concurrent.futures.Future[list[AppendResult]]:
        """Submit one BATCH_APPEND (all bodies in one frame, contiguous indexes)."""
        bodies = list(bodies)
        for b in bodies:
            if not isinstance(b, (bytes, bytearray, memoryview)):
                raise TypeError(f"bodies must be bytes-like, not {type(b).__name__}")
        call = _Call(_BATCH, bodies, time.monotonic() + (self.timeout if timeout is None else timeout))
        if not bodies:
            self._finish(call, exc=DLedgerError(RC.REQUEST_WITH_EMPTY_BODYS, "empty batch"), live=False)
            return call.future
        big = max(len(b) for b in bodies)
        if big > self.max_body_size:
            self._finish(call, exc=DLedgerError(
                RC.UNEXPECTED_ARGUMENT, f"body of {big} bytes exceeds max_body_size {self.max_body_size}"), live=False)
            return call.future
        if len(bodies) > P.MAX_BATCH_COUNT:
            self._finish(call, exc=DLedgerError(
                RC.UNEXPECTED_ARGUMENT, f"batch of {len(bodies)} exceeds {P.MAX_BATCH_COUNT} bodies"), live=False)
            return call.future
        return self._submit(call)

    def append_batch(self, bodies: Sequence[bytes | bytearray | memoryview],
                     timeout: float | None = None) -> list[AppendResult]:
        """Append several bodies in one request; one AppendResult per body, in order.

        The batch succeeds or fails as a whole from the client's point of view (one response).
        """
        return self._wait(self.append_batch_async(bodies, timeout), timeout)

    def get(self, index: int, timeout: float | None = None, *,
            linearizable: bool = False) -> Entry:
        """The committed entry at ``index``; INDEX_OUT_OF_RANGE if it is not (yet) committed."""
        es = self.get_range(index, 1, timeout, linearizable=linearizable)
        if not es:
            raise DLedgerError(RC.INDEX_OUT_OF_RANGE, f"index {index} is not committed")
        return es[0]

    def get_range(self, start: int, count: int, timeout: float | None = None, *,
                  linearizable: bool = False) -> list[Entry]:
        """Up to ``count`` committed entries from ``start``; fewer at the committed end.

        A node caps the bytes of one answer, so this keeps asking from where the last answer
        stopped until it has ``count`` entries or reaches the committed end. A ``start`` that
        is not committed at all raises INDEX_OUT_OF_RANGE. Every entry's CRC is verified: a
        mismatch raises DISK_ERROR (the entry is never returned damaged).
        """
        if start < 0 or count <= 0:
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT, "start must be >= 0 and count > 0")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[Entry] = []
        while len(out) < count:
            nxt = start + len(out)
            call = _Call(_GET, (nxt, count - len(out), linearizable), deadline)
            try:
                resp = self._wait(self._submit(call), deadline - time.monotonic())
            except DLedgerError as e:
                if out and e.code == RC.INDEX_OUT_OF_RANGE:
                    break  # the committed end, reached on a continuation
                raise
            got = _decode_entries(resp.entries, nxt, count - len(out))
            if not got:
                break
            out.extend(got)
        return out

    def query(self, request: bytes | bytearray | memoryview, timeout: float | None = None, *,
              read_from: str | None = None) -> QueryResult:
        """A linearizable read of the group's state machine (its `query`): the leader confirms
        its leadership with a heartbeat round, waits until its state machine has applied
        everything committed when the read arrived, and answers from it. Idempotent: retried
        on other nodes and after timeouts within ``timeout``. UNSUPPORTED for a group without a
        state machine.

        ``read_from="n1"``: node n1 answers, whatever its role (a follower read, issue 11 §5):
        it asks the leader for a read index, waits until its own state machine has applied it
        and answers from it — just as linearizable, and it spreads reads over the replicas.
        Sent to that node only, not retried elsewhere: a node that knows no leader, or cannot
        reach it, answers NOT_LEADER (raised as DLedgerError)."""
        return self._wait(self.query_async(request, timeout, read_from=read_from), timeout)

    def query_async(self, request: bytes | bytearray | memoryview, timeout: float | None = None, *,
                    read_from: str | None = None) -> concurrent.futures.Future[QueryResult]:
        """Submit one `query` (arguments as there); the future resolves to its QueryResult.
        Many can be in flight on one client, pipelined like `append_async` (one connection,
        answers matched by request id): what 64 threads each waiting in `query` cost in
        throughput. Blocks only while ``max_in_flight`` calls are in flight."""
        if not isinstance(request, bytes | bytearray | memoryview):
            raise TypeError(f"query request must be bytes, not {type(request).__name__}")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if read_from is None:
            return self._submit(_Call(_QUERY, bytes(request), deadline))
        if read_from not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{read_from!r} is not in the peers list")
        raw = self._submit(_Call(_QUERY, bytes(request), deadline, pinned=read_from))
        out: concurrent.futures.Future[QueryResult] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()
        raw.add_done_callback(lambda f: _member_query_done(f, out, read_from))
        return out

    def take_snapshot(self, node_id: str, timeout: float | None = None) -> tuple[int, int]:
        """Ask node `node_id` (any role) to snapshot its state machine now; returns the (last
        index, last term) the snapshot on disk covers. UNSUPPORTED without a state machine."""
        if node_id not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{node_id!r} is not in the peers list")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempt = 0
        while True:
            resp = self._wait(self._submit(_Call(_SNAPSHOT, None, deadline, pinned=node_id)),
                              deadline - time.monotonic())
            if isinstance(resp, P.SnapshotResponse) and resp.code == RC.SUCCESS:
                return resp.last_index, resp.last_term
            # A node whose applier is still starting (or busy) says LEADER_PENDING_FULL: a
            # passing state, asked again within the timeout like any retryable answer.
            code = getattr(resp, "code", RC.UNKNOWN)
            pause = _backoff(attempt)
            if code != RC.LEADER_PENDING_FULL or time.monotonic() + pause >= deadline:
                break
            attempt += 1
            time.sleep(pause)
        raise DLedgerError(getattr(resp, "code", RC.UNKNOWN), getattr(resp, "reason", "") or f"from {node_id}",
                           node=node_id)

    def metadata(self, timeout: float | None = None) -> Metadata:
        """Ask every node in parallel. Silent nodes get alive=False and None fields.

        Each node gets at most ``attempt_timeout`` (within ``timeout``), so one dead node costs
        one short wait, not the whole timeout.
        """
        t = self.timeout if timeout is None else timeout
        per_node = time.monotonic() + min(t, self.attempt_timeout)
        calls = [(nid, self._submit(_Call(_META, None, per_node, pinned=nid))) for nid in self.peers]
        answers: dict[str, P.Message | None] = {}
        for nid, fut in calls:
            try:
                answers[nid] = self._wait(fut, t)
            except DLedgerError:
                answers[nid] = None
        return self._build_metadata(answers)

    def transfer_leadership(self, target: str, timeout: float | None = None,
                            wait: bool = True) -> Metadata | None:
        """Ask the leader to hand leadership to ``target``; with ``wait``, return once
        ``target`` is the leader (polling METADATA) and return that Metadata.

        Raises DLedgerError on a refused transfer (e.g. TAKE_LEADERSHIP_FAILED, a lagging or
        dead target) or, indeterminate, if the transfer was accepted but not observed in time.
        """
        if target not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{target!r} is not in the peers list")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        accepted = False
        unanswered = False  # a transfer request went out and its answer never came
        last: tuple[int, str] = (RC.TIMEOUT, "no leader found to transfer from within the timeout")
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            m = self.metadata(remaining)
            if m.leader_id == target:
                return m
            if accepted and not wait:
                return None
            if not accepted and m.leader_id is not None and m.term is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                call = _Call(_TRANSFER, (target, m.term), deadline, pinned=m.leader_id)
                try:
                    resp = self._wait(self._submit(call), remaining)
                except DLedgerError as e:
                    if e.code != RC.TIMEOUT:
                        raise
                    resp = None
                    last = (e.code, e.reason)
                    unanswered = unanswered or e.indeterminate
                if resp is not None:
                    if resp.code == RC.SUCCESS:
                        accepted = True
                        if not wait:
                            return None
                        continue  # look at once: a DLedger-style transfer answers when done
                    reason = getattr(resp, "reason", "")
                    last = (resp.code, reason or f"answer from {m.leader_id}")
                    if not is_retryable(resp.code):
                        again = self.metadata(max(0.0, deadline - time.monotonic()))
                        if again.leader_id == target:
                            return again
                        raise DLedgerError(resp.code, reason or f"{m.leader_id} refused the transfer",
                                           node=m.leader_id)
            attempt += 1
            if self._closed_event.wait(min(max(0.0, deadline - time.monotonic()),
                                           _backoff(attempt + 3))):
                raise ClientClosedError("client closed")
        if accepted:
            raise DLedgerIndeterminateError(
                RC.TIMEOUT, f"transfer to {target} was accepted but {target} is not leader yet")
        if unanswered:
            raise DLedgerIndeterminateError(
                RC.TIMEOUT, f"transfer request unanswered and {target} is not leader yet")
        raise DLedgerError(last[0], last[1])

    # ------------------------------------------------------------------ caller side
    def _submit(self, call: _Call) -> concurrent.futures.Future:
        """Hand a call to the I/O thread (thread-safe). Blocks for a slot (backpressure)."""
        if os.getpid() != self._pid:
            raise ClientClosedError("DLedgerClient used across fork(): create one per process")
        if self._closed or self._stopping:
            raise ClientClosedError("DLedgerClient is closed")
        if threading.get_ident() == self._io_ident:
            ok = self._slots.acquire(False)  # the I/O thread must never block on itself
        else:
            ok = self._slots.acquire(True, max(0.0, call.deadline - time.monotonic()))
        if not ok:
            self._finish(call, exc=DLedgerError(
                RC.TIMEOUT, f"no free slot within the timeout ({self.max_in_flight} calls in flight)"), live=False)
            return call.future
        call.slot = True
        with self._lock:
            if self._closed:
                self._slots.release()
                raise ClientClosedError("DLedgerClient is closed")
            self._inbox.append(call)
        # Order matters (see _io_main): append first, then check the flag.
        if not self._wake_armed:
            self._wake_armed = True
            self._waker.wake()
        return call.future

    def _wait(self, fut: concurrent.futures.Future, timeout: float | None = None) -> Any:
        if threading.get_ident() == self._io_ident:
            raise RuntimeError("blocking DLedgerClient call from a future callback (I/O thread)")
        # The I/O thread enforces the call's deadline; the grace period only guards against an
        # I/O thread that died, so a caller can never hang forever.
        try:
            return fut.result((self.timeout if timeout is None else timeout) + 5.0)
        except concurrent.futures.TimeoutError:
            raise DLedgerIndeterminateError(RC.TIMEOUT, "no result from the client I/O thread") from None

    def _build_metadata(self, answers: Mapping[str, P.Message | None]) -> Metadata:
        nodes: list[NodeInfo] = []
        best: tuple[int, int, str] | None = None  # (term, self-claim?, leader id)
        max_term: int | None = None
        errors: list[DLedgerError] = []
        for nid, (host, port) in self.peers.items():
            msg = answers.get(nid)
            addr = f"{host}:{port}"
            if isinstance(msg, P.MetadataResponse) and msg.code == RC.SUCCESS:
                leader = msg.leader_id or None
                if msg.role == Role.LEADER and not leader:
                    leader = nid
                nodes.append(NodeInfo(nid, addr, Role(msg.role).name, msg.term, leader,
                                      msg.ledger_begin_index, msg.ledger_end_index,
                                      msg.committed_index, True))
                max_term = msg.term if max_term is None else max(max_term, msg.term)
                if leader is not None:
                    claim = (msg.term, 1 if (msg.role == Role.LEADER and leader == nid) else 0, leader)
                    if best is None or claim[:2] > best[:2]:
                        best = claim
            elif msg is not None:
                # It answered, so it is up, but it would not describe itself (wrong group...).
                nodes.append(NodeInfo(nid, addr, alive=True))
                errors.append(DLedgerError(msg.code, getattr(msg, "reason", ""), node=nid))
            else:
                nodes.append(NodeInfo(nid, addr))
        if errors and len(errors) == sum(1 for n in nodes if n.alive):
            raise errors[0]  # nobody described itself: a configuration error, say which
        if best is not None:
            return Metadata(self.group, best[2], best[0], nodes)
        return Metadata(self.group, None, max_term, nodes)

    # ------------------------------------------------------------------ I/O thread
    def _io_main(self) -> None:
        self._io_ident = threading.get_ident()
        poller = zmq.Poller()
        self._poller = poller
        try:
            for node in self._node_order:
                self._open_socket(node)
            poller.register(self._waker.rfd, zmq.POLLIN)
        except BaseException as e:  # e.g. a bad endpoint: report it from __init__
            self._setup_error = e
            for node in self._node_order:
                if node.sock is not None:
                    self._close_socket(node)
            return
        finally:
            self._started.set()
        wake_fd = self._waker.rfd
        inbox = self._inbox
        try:
            while not self._stopping:
                due = self._next_due()
                if due is not None:
                    wait_ms = max(0, math.ceil((due - time.monotonic()) * 1000))
                    wait_ms = min(wait_ms, 1000)
                else:
                    wait_ms = 1000
                for sock, _ev in poller.poll(wait_ms):
                    if sock == wake_fd:
                        self._waker.drain()
                        # Cleared after draining the fd and before draining the inbox: a
                        # caller that appends after our drain sees False and wakes us again.
                        self._wake_armed = False
                    elif sock in self._mon_node:
                        self._on_monitor(sock)
                    else:
                        self._recv_all(sock)
                if inbox:
                    now = time.monotonic()
                    popleft = inbox.popleft
                    out: dict[_Node, list[tuple[_Call, int, bytes]]] = {}
                    while inbox:
                        call = popleft()
                        self._live.add(call)
                        self._dispatch(call, now, out)
                    self._send_collected(out, now)
                due = self._next_due()
                if due is not None and due <= time.monotonic():
                    self._run_timers(time.monotonic())
                if self._suspects:
                    self._reset_suspects()
                self._slots.kick()
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("client I/O thread crashed")
        finally:
            self._stopping = True  # later submissions fail fast instead of waiting for nobody
            self._fail_all_on_close()
            self._slots.kick()
            for node in self._node_order:
                if node.sock is not None:
                    self._close_socket(node)

    def _open_socket(self, node: _Node) -> None:
        node.sock = dealer(self._ctx, node.endpoint)
        self._sock_node[node.sock] = node
        self._poller.register(node.sock, zmq.POLLIN)
        node.mon = node.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._mon_node[node.mon] = node
        self._poller.register(node.mon, zmq.POLLIN)

    def _close_socket(self, node: _Node) -> None:
        if node.mon is not None:
            self._poller.unregister(node.mon)
            self._mon_node.pop(node.mon, None)
            try:
                node.sock.disable_monitor()
            except zmq.ZMQError:  # pragma: no cover - already gone
                pass
            node.mon.close(linger=0)
            node.mon = None
        if node.sock is not None:
            self._poller.unregister(node.sock)
            self._sock_node.pop(node.sock, None)
            node.sock.close(linger=0)
            node.sock = None

    def _on_monitor(self, mon: zmq.Socket) -> None:
        """The connection to a node dropped (its process died, or it closed us): no answer to
        what is in flight there can come any more (a DEALER's reconnection is a new peer to
        the node's ROUTER). Reads and session writes are resent at once — the leader
        deduplicates a write it already holds — and a write without a session fails now as
        indeterminate instead of at its deadline. docs/client.md "Sessions"."""
        node = self._mon_node.get(mon)
        dropped = False
        for _ in range(64):
            try:
                event = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                dropped = dropped or parse_monitor_message(event)["event"] == zmq.EVENT_DISCONNECTED
            except (ValueError, KeyError, IndexError):  # pragma: no cover - a libzmq we do not know
                continue
        if node is None or not dropped:
            return
        now = time.monotonic()
        lost = [c for c in self._pending.values() if c.node is node and c.state == _INFLIGHT]
        if not lost:
            return
        log.debug("connection to %s lost with %d requests in flight", node.id, len(lost))
        self._mark_suspect(node)
        for call in lost:
            self._pending.pop(call.rid, None)
            call.rid = 0
            node.inflight -= 1
            call.last = (RC.NETWORK_ERROR, f"connection to {node.id} lost")
            if call.may_write and not call.sid:
                self._finish(call, exc=_make_error(
                    RC.NETWORK_ERROR, f"{_KIND_NAMES[call.kind]} in flight to {node.id} when its "
                    "connection dropped", indeterminate=True, node=node.id))
                continue
            if call.pinned is not None:
                self._finish(call, None)  # a per-node METADATA: that node does not answer
                continue
            call.unsure = call.unsure or call.may_write
            self._retry_later(call, now)

    def _reset_suspects(self) -> None:
        """Lazy Pirate: recreate the DEALER of a node that let a deadline pass, once nothing
        else is in flight on it (so no live call loses its reply)."""
        for node in list(self._suspects):
            if node.inflight == 0:
                self._suspects.discard(node)
                node.suspect = False
                self._close_socket(node)
                self._open_socket(node)
                log.debug("recreated the socket to %s after a timeout", node.id)

    def _mark_suspect(self, node: _Node) -> None:
        node.suspect = True
        node.unresponsive = True
        self._suspects.add(node)
        if self._leader == node.id:
            self._leader = None

    def _set_timer(self, obj: Any, at: float) -> None:
        seq = next(self._tseq)
        obj.timer_seq = seq
        fifo = self._fifo
        if not fifo or at >= fifo[-1][0]:
            fifo.append((at, seq, obj))
            return
        heapq.heappush(self._timers, (at, seq, obj))
        if len(self._timers) > 65536 and len(self._timers) > 8 * (len(self._live) + 8):
            # Completed calls leave their timer entries behind (lazy deletion): prune.
            # In place: loops hold references to this list.
            self._timers[:] = [t for t in self._timers if t[2].timer_seq == t[1]]
            heapq.heapify(self._timers)

    def _next_due(self) -> float | None:
        """The earliest timer (stale entries included: they only cause an early wake-up)."""
        fifo, heap = self._fifo, self._timers
        while fifo and fifo[0][2].timer_seq != fifo[0][1]:
            fifo.popleft()  # completed calls: dropped as they reach the head
        if fifo:
            return min(fifo[0][0], heap[0][0]) if heap else fifo[0][0]
        return heap[0][0] if heap else None

    def _pop_due(self, now: float) -> tuple[float, int, Any] | None:
        fifo, heap = self._fifo, self._timers
        if fifo and fifo[0][0] <= now and (not heap or fifo[0][0] <= heap[0][0]):
            return fifo.popleft()
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)
        return None

    def _run_timers(self, now: float) -> None:
        while (t := self._pop_due(now)) is not None:
            _at, seq, obj = t
            if obj.timer_seq != seq:
                continue  # stale: the call completed or moved on
            obj.timer_seq = -1
            if isinstance(obj, _Call):
                self._on_call_timer(obj, now)
            elif obj is self._disc_start:
                if self._leader is not None:
                    self._release_waiting(now)
                elif self._has_waiting():
                    self._start_round(now)
            elif obj is self._disc:
                for nid in obj.rids.values():
                    self._mark_suspect(self._nodes[nid])
                self._end_round(now)

    def _on_call_timer(self, call: _Call, now: float) -> None:
        state = call.state
        if state == _INFLIGHT:
            node = call.node
            self._pending.pop(call.rid, None)
            call.rid = 0
            node.inflight -= 1
            self._mark_suspect(node)
            if (not call.may_write or call.sid) and call.pinned is None and now < call.deadline:
                call.last = (RC.TIMEOUT, f"no answer from {node.id}")
                # reads are idempotent, and a session write's resend is deduplicated by the
                # leader: try again (elsewhere)
                call.unsure = call.unsure or call.may_write
                self._retry_later(call, now)
                return
            what = _KIND_NAMES[call.kind]
            self._finish(call, exc=_make_error(
                RC.TIMEOUT, f"{what} sent to {node.id}, no answer within the timeout",
                indeterminate=True, node=node.id))
        elif state == _BACKOFF:
            self._dispatch(call, now)
        elif state == _WAITING:
            self._give_up(call)

    def _has_waiting(self) -> bool:
        return any(c.state == _WAITING for c in self._waiting)

    def _dispatch(self, call: _Call, now: float,
                  out: dict[_Node, list[tuple[_Call, int, bytes]]] | None = None) -> None:
        """Send one attempt of `call`, or park it until a leader is known. With `out`, the
        encoded frame is collected there instead, for `_send_collected` to send many at once."""
        if now >= call.deadline:
            self._give_up(call)
            return
        if call.may_write and self._sessions and call.sid == 0 and not self._stamp(call, now):
            return
        node_id = call.pinned or self._leader
        if node_id is None:
            call.state = _WAITING
            self._waiting.append(call)
            self._set_timer(call, call.deadline)
            self._need_leader(now)
            return
        node = self._nodes[node_id]
        rid = next(self._rids)
        try:
            frame = self._encode(call, node_id, rid)
        except P.ProtocolError as e:
            self._finish(call, exc=DLedgerError(RC.UNEXPECTED_ARGUMENT, str(e)))
            return
        if out is not None:
            out.setdefault(node, []).append((call, rid, frame))
            return
        try:
            node.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self._not_sent(call, node, now)
            return
        self._sent(call, node, rid, now)

    # ------------------------------------------------------------------ sessions
    def _stamp(self, call: _Call, now: float) -> bool:
        """Give a write its (session, seq), in dispatch order; False when it must wait for a
        session to be opened (it is parked and resumed by `_session_opened`), or for the writes
        of an abandoned session to be resolved (resumed by `_drained`). While any is unresolved
        there is no session: abandoning clears `_sid`, and no OPEN is sent until they are."""
        if self._sid == 0:
            call.state = _WAITING
            self._session_waiting.append(call)
            self._set_timer(call, call.deadline)
            if self._opening is None and not self._draining:
                self._opening = _Call(_OPEN, None, now + self.timeout)
                self._live.add(self._opening)
                self._dispatch(self._opening, now)
            return False
        call.sid, call.seq = self._sid, self._next_seq
        self._next_seq = seq_add(self._next_seq, call.count)
        return True

    def _session_opened(self, sid: int, now: float) -> None:
        self._sid, self._next_seq = sid, 1
        log.debug("client session %#x opened", sid)
        self._release_session_waiting(now)

    def _session_refused(self, code: int, reason: str, now: float) -> None:
        """OPEN_SESSION failed for good. A node too old to know it (UNSUPPORTED): go on
        without sessions (appends as before). Anything else fails the writes that wait."""
        if code == RC.UNSUPPORTED:
            log.warning("the group does not offer client sessions (%s): appends are not "
                        "deduplicated", reason)
            self._sessions = False
            self._release_session_waiting(now)
            return
        waiting, self._session_waiting = self._session_waiting, []
        for call in waiting:
            if call.state == _WAITING:
                self._finish(call, exc=DLedgerError(code, f"cannot open a client session: {reason}"))

    def _release_session_waiting(self, now: float) -> None:
        waiting, self._session_waiting = self._session_waiting, []
        for call in waiting:
            if call.state == _WAITING:
                self._dispatch(call, now)

    def _abandon_session(self, call: _Call, forgotten: bool = False, definite: bool = False) -> None:
        """A stamped write failed (definitely or not), or the leader forgot the session: its
        seq may be a hole the leader waits for forever. Later writes get a new session, and
        writes of this one that meet the hole (SESSION_SEQ_GAP) move to it if they cannot
        have been stored. Except when it was the newest stamp handed out and it cannot have
        been stored: then its seqs are simply handed out again (no hole, no new session) —
        unless the leader has forgotten the session itself (`forgotten`)."""
        if (not forgotten and call.sid and call.sid == self._sid and not call.unsure
                and seq_add(call.seq, call.count) == self._next_seq):
            self._next_seq = call.seq
            return
        if call.sid and call.sid == self._sid:
            log.debug("client session %#x abandoned at seq %d", self._sid, call.seq)
            old, self._sid = self._sid, 0
            self._hole = (old, call.seq) if definite and not forgotten else None
            # Its other writes still unresolved hold back every later write until each one is
            # acknowledged, fails, or is known never stored (`_restamp`): a later write stamped
            # in a new session meanwhile would be stored before them.
            self._draining = {c for c in self._live if c.sid == old and c is not call
                              and c.state != _DONE and c.may_write}

    def _pull_gap_waiters(self, call: _Call, now: float) -> None:
        """`call` was just sent (or succeeded): send the write waiting behind its last seq right
        after it, then the one behind that, and so on down the backlog (iteratively: each send
        would otherwise pull the next one recursively)."""
        if self._pulling:
            return
        self._pulling = True
        try:
            head = call
            while True:
                waiter = self._gap_waiters.pop(seq_add(head.seq, head.count - 1), None)
                if waiter is None or waiter.state != _BACKOFF or waiter.sid != head.sid:
                    break
                self._dispatch(waiter, now)
                if waiter.state != _INFLIGHT:
                    break  # not sent (no connection, no leader): its own timer takes over
                head = waiter
        finally:
            self._pulling = False
        if len(self._gap_waiters) > 4096:  # entries whose writes moved on: forget them
            self._gap_waiters = {k: c for k, c in self._gap_waiters.items() if c.state == _BACKOFF}

    def _behind_hole(self, call: _Call) -> bool:
        """A write of the abandoned session after its definitely-never-stored seq."""
        h = self._hole
        return h is not None and call.sid == h[0] and seq_after(h[1], call.seq) > 0

    def _resolved(self, call: _Call, now: float) -> None:
        """`call`, a write of an abandoned session, is resolved; the last one releases the rest."""
        d = self._draining
        if call in d:
            d.discard(call)
            if not d:
                self._drained(now)

    def _drained(self, now: float) -> None:
        """Every write of the abandoned session is resolved: those never stored are stamped in a
        new session first, in their first order, then the writes submitted meanwhile."""
        waiting = [(seq, c) for seq, c in self._restamps if c.state == _WAITING]
        self._restamps = []
        if waiting:  # one session's seqs: ordered relative to any one of them (they may wrap)
            base = waiting[0][0]
            waiting.sort(key=lambda sc: seq_after(base, sc[0]))
        self._session_waiting = [c for _seq, c in waiting] + self._session_waiting
        self._release_session_waiting(now)

    def _restamp(self, call: _Call, now: float) -> None:
        """Send a write that was definitely not stored under a fresh session: once every write of
        its old session is resolved (it is one of them), ahead of the writes submitted later."""
        old_seq = call.seq
        call.sid = call.seq = 0
        if call not in self._draining:
            self._dispatch(call, now)
            return
        call.state = _WAITING
        self._restamps.append((old_seq, call))
        self._set_timer(call, call.deadline)
        self._resolved(call, now)

    def _send_collected(self, out: dict[_Node, list[tuple[_Call, int, bytes]]], now: float) -> None:
        """Send each node's collected requests as one MULTI frame (one frame if just one).

        On 2 cores every ZeroMQ message costs wake-ups of two I/O threads; a pipelining
        caller's burst of single appends was paying that per append."""
        for node, items in out.items():
            for i in range(0, len(items), P.MAX_MULTI_COUNT):
                chunk = items[i:i + P.MAX_MULTI_COUNT]
                try:
                    node.sock.send(P.encode_multi([f for _c, _r, f in chunk]), zmq.NOBLOCK)
                except zmq.Again:
                    for call, _rid, _f in chunk:
                        self._not_sent(call, node, now)
                    continue
                for call, rid, _f in chunk:
                    self._sent(call, node, rid, now)

    def _not_sent(self, call: _Call, node: _Node, now: float) -> None:
        # IMMEDIATE: no connection to that node (or its queue is full). Nothing was sent,
        # so this is a definite failure and retrying is safe.
        call.last = (RC.NETWORK_ERROR, f"no connection to {node.id}")
        if call.pinned is None and self._leader == node.id:
            self._leader = None
        self._retry_later(call, now)

    def _sent(self, call: _Call, node: _Node, rid: int, now: float) -> None:
        call.state = _INFLIGHT
        call.rid = rid
        call.node = node
        node.inflight += 1
        self._pending[rid] = call
        if (call.may_write and not call.sid) or call.pinned is not None:
            self._set_timer(call, call.deadline)  # never resent: wait for the whole timeout
        else:
            self._set_timer(call, min(call.deadline, now + self.attempt_timeout))
            if self._gap_waiters and call.sid and call.sid == self._sid:
                self._pull_gap_waiters(call, now)

    def _encode(self, call: _Call, node_id: str, rid: int) -> bytes:
        k = call.kind
        if k == _APPEND:
            return P.encode_append(self.group, node_id, call.payload, rid, call.sid, call.seq, call.no_result)
        if k == _BATCH:
            return P.encode(P.BatchAppendRequest(self.group, node_id, call.payload, rid, call.sid, call.seq))
        if k == _OPEN:
            return P.encode(P.OpenSessionRequest(self.group, node_id, rid))
        if k == _GET:
            index, count, lin = call.payload
            return P.encode(P.GetRequest(self.group, node_id, index, count, lin, rid))
        if k == _META:
            return P.encode(P.MetadataRequest(self.group, node_id, rid))
        if k == _QUERY:  # to a named node (read_from): any member may answer
            return P.encode(P.QueryRequest(self.group, node_id, call.payload, rid,
                                           any_member=call.pinned is not None))
        if k == _SNAPSHOT:
            return P.encode(P.SnapshotRequest(self.group, node_id, rid))
        target, term = call.payload
        return P.encode(P.LeadershipTransferRequest(self.group, node_id, target, term, rid))

    def _retry_later(self, call: _Call, now: float) -> None:
        call.attempts += 1
        at = now + _backoff(call.attempts)
        if at >= call.deadline:
            self._give_up(call)  # with the last definite outcome: nothing was left pending
            return
        call.state = _BACKOFF
        self._set_timer(call, at)

    def _give_up(self, call: _Call) -> None:
        """The deadline passed with nothing outstanding: report the last definite outcome (an
        indeterminate one if an attempt of a session write may have been stored)."""
        if call.kind == _OPEN:
            self._finish(call, exc=DLedgerError(RC.TIMEOUT, "no leader answered OPEN_SESSION "
                                                            "within the timeout"))
            return
        if call.unsure:
            code, reason = call.last or (RC.TIMEOUT, "no answer")
            self._finish(call, exc=_make_error(
                code, f"{reason} (resent under its session for the whole timeout; it may "
                      "still be committed)", indeterminate=True, node=call.node.id if call.node else None))
            return
        if call.last is None:
            err = DLedgerError(RC.TIMEOUT, "no reachable leader found within the timeout "
                                           "(nothing was sent)")
        else:
            code, reason = call.last
            err = DLedgerError(code, f"{reason} (gave up after {call.attempts + 1} attempts "
                                     "within the timeout)")
        self._finish(call, exc=err)

    def _finish(self, call: _Call, result: Any = None, exc: BaseException | None = None,
                live: bool = True) -> None:
        """Complete a call: free its slot first (a blocked submitter may proceed), then resolve.

        `live=False` on caller threads: `_live` belongs to the I/O thread.
        """
        if call.state == _DONE:  # e.g. closing: a write already failed with its session's opening
            return
        call.state = _DONE
        if live and self._draining:
            self._resolved(call, time.monotonic())
        call.timer_seq = -1
        if live:
            self._live.discard(call)
        if call.slot:
            call.slot = False
            self._slots.release()
        if exc is None:
            call.future.set_result(result)
            if self._gap_waiters and call.sid and call.sid == self._sid:
                self._pull_gap_waiters(call, time.monotonic())
        else:
            call.future.set_exception(exc)
            if call.sid:  # its seq was not (knowably) stored: a hole the leader would wait on
                self._abandon_session(call, definite=not call.unsure
                                      and not getattr(exc, "indeterminate", True))
        # A finished call may still sit in the timer FIFO until its deadline (lazy deletion):
        # it must not keep its bodies alive there (a group refusing every append at the
        # request rate made that hundreds of MB).
        call.payload = None
        if call is self._opening:  # however OPEN_SESSION ended, the writes waiting for it move on
            self._opening = None
            if exc is None:
                self._session_opened(result, time.monotonic())
            else:
                self._session_refused(getattr(exc, "code", RC.UNKNOWN), getattr(exc, "reason", str(exc)),
                                      time.monotonic())

    def _recv_all(self, sock: zmq.Socket) -> None:
        node = self._sock_node.get(sock)
        if node is None:
            return
        for _ in range(4096):  # bounded, so timers and submissions get their turn
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = P.decode(frame)
            except P.ProtocolError as e:
                log.warning("undecodable reply from %s: %s", node.id, e)
                continue
            if type(msg) is P.Multi:
                for inner in msg.frames:
                    try:
                        self._on_reply(node, P.decode(inner))
                    except P.ProtocolError as e:
                        log.warning("undecodable reply from %s: %s", node.id, e)
                continue
            self._on_reply(node, msg)

    def _on_reply(self, node: _Node, msg: P.Message) -> None:
        rid = msg.request_id
        call = self._pending.pop(rid, None)
        node.unresponsive = False
        if node.suspect:
            node.suspect = False
            self._suspects.discard(node)
        if call is None:
            d = self._disc
            if d is not None and rid in d.rids:
                self._on_discovery_reply(d, rid, msg)
            return  # else: a late answer to an attempt we already gave up on
        node.inflight -= 1
        call.rid = 0
        if call.pinned is not None:
            self._finish(call, msg)  # the caller interprets the node's raw answer
            return
        code = getattr(msg, "code", RC.UNKNOWN)
        kind = call.kind
        if code == RC.SUCCESS:
            self._disc_streak = 0
            if kind == _APPEND and type(msg) is P.AppendResponse:
                r = msg.result
                self._finish(call, AppendResult(msg.index, msg.term, msg.pos, None if r is None else bytes(r)))
                return
            if kind == _BATCH and type(msg) is P.BatchAppendResponse:
                n = len(call.payload)
                if len(msg.positions) == n:
                    first, term = msg.first_index, msg.term
                    if msg.results is None:
                        self._finish(call, [AppendResult(first + i, term, p)
                                            for i, p in enumerate(msg.positions)])
                    else:
                        self._finish(call, [AppendResult(first + i, term, p, None if r is None else bytes(r))
                                            for i, (p, r) in enumerate(zip(msg.positions, msg.results,
                                                                           strict=True))])
                    return
            if kind == _QUERY and type(msg) is P.QueryResponse:
                self._finish(call, QueryResult(bytes(msg.answer), msg.applied_index))
                return
            if kind == _GET and type(msg) is P.GetResponse:
                self._finish(call, msg)
                return
            if kind == _OPEN and type(msg) is P.OpenSessionResponse:
                self._finish(call, msg.session)
                return
            self._finish(call, exc=_make_error(
                RC.UNKNOWN, f"unexpected {type(msg).__name__} to {_KIND_NAMES[kind]} from {node.id}",
                indeterminate=call.may_write, node=node.id))
            return
        self._on_failure(call, node, msg, code, time.monotonic())

    def _on_failure(self, call: _Call, node: _Node, msg: P.Message, code: int, now: float) -> None:
        reason = getattr(msg, "reason", "") or f"from {node.id}"
        if call.kind == _OPEN and not is_retryable(code):
            self._finish(call, exc=DLedgerError(code, reason))
            return
        if call.may_write and call.sid and self._on_session_failure(call, code, reason, now):
            return
        if call.may_write and is_indeterminate(code):
            # WAIT_QUORUM_ACK_TIMEOUT / TERM_CHANGED / TIMEOUT: stored on the leader, maybe on a
            # quorum. A resend could store it twice, so the caller decides.
            self._finish(call, exc=_make_error(code, reason, indeterminate=True, node=node.id))
            return
        if not is_retryable(code):
            # A refusal speaks for this attempt only: if an earlier attempt of a stamped write
            # may have been stored (a lost answer, a dead leader), it still may, so the outcome
            # is indeterminate. A caller retries a definite failure, which would store it twice.
            self._finish(call, exc=_make_error(code, reason, indeterminate=call.may_write and call.unsure,
                                               node=node.id))
            return
        call.last = (code, reason)
        if code == RC.NOT_LEADER:
            hint = getattr(msg, "leader_id", "")
            if hint and hint != node.id and hint in self._nodes:
                self._set_leader(hint, now)
                call.redirects += 1
                if call.redirects <= 2 * len(self._nodes):
                    self._dispatch(call, now)  # follow the redirect at once
                    return
            elif self._leader == node.id:
                self._leader = None
        self._retry_later(call, now)

    def _on_session_failure(self, call: _Call, code: int, reason: str, now: float) -> bool:
        """A stamped write's failure; True if handled here. An answer that leaves the outcome
        open is resent under the same stamp (the leader deduplicates); a session the leader
        does not know (or one abandoned meanwhile) is left for a fresh one if this write was
        never possibly stored."""
        if is_indeterminate(code) or code in _SESSION_RESEND:
            call.unsure = call.unsure or is_indeterminate(code)
            call.last = (code, reason)
            if code in _SESSION_RESEND and call.sid != self._sid and (not call.unsure or self._behind_hole(call)):
                call.unsure = False  # never stored (behind a hole that never was, if it was unsure)
                self._restamp(call, now)  # its session was abandoned: the hole stays open
                return True
            self._retry_later(call, now)  # also the fallback if the write before it never succeeds
            if code in _SESSION_RESEND and call.sid == self._sid and call.state == _BACKOFF:
                self._gap_waiters[seq_add(call.seq, -1)] = call
            return True
        if code == RC.SESSION_EXPIRED:
            self._abandon_session(call, forgotten=True)
            if not call.unsure:
                self._restamp(call, now)
                return True
            self._finish(call, exc=_make_error(code, f"{reason}; an earlier attempt may have been "
                                                     "stored", indeterminate=True, node=call.node.id if call.node else None))
            return True
        if code == RC.SESSION_SEQ_TOO_OLD:
            # Stored, but where is no longer known: never a definite failure, which a caller
            # would retry (storing it twice); indeterminate is the error that says "do not".
            self._finish(call, exc=_make_error(code, f"{reason}: stored long ago, its index is no "
                                                     "longer known", indeterminate=True,
                                               node=call.node.id if call.node else None))
            return True
        if code == RC.SESSION_SEQ_INVALID:
            self._finish(call, exc=_make_error(code, reason, indeterminate=call.unsure))
            return True
        return False

    # ------------------------------------------------------------------ leader discovery
    def _need_leader(self, now: float) -> None:
        d = self._disc
        if d is not None and not d.found:
            return  # a round is already asking
        if self._disc_start.timer_seq >= 0:
            return  # a round is already scheduled
        gap = 0.0 if self._disc_streak == 0 else _backoff(self._disc_streak)
        if now - self._disc_last >= gap:
            self._start_round(now)
        else:
            self._set_timer(self._disc_start, self._disc_last + gap)

    def _start_round(self, now: float) -> None:
        self._disc_last = now
        self._disc_streak += 1
        d = _Discovery()
        self._disc = d
        for node in self._node_order:
            rid = next(self._rids)
            try:
                node.sock.send(P.encode(P.MetadataRequest(self.group, node.id, rid)), zmq.NOBLOCK)
            except zmq.Again:
                continue
            d.rids[rid] = node.id
        if not d.rids:
            self._end_round(now)
            return
        self._set_timer(d, now + self.attempt_timeout)

    def _on_discovery_reply(self, d: _Discovery, rid: int, msg: P.Message) -> None:
        node_id = d.rids.pop(rid)
        d.answered += 1
        code = getattr(msg, "code", RC.UNKNOWN)
        if isinstance(msg, P.MetadataResponse) and code == RC.SUCCESS:
            self._learn_members(msg.peers)
            claim = node_id if msg.role == Role.LEADER else msg.leader_id
            # A follower may still name a leader that stopped answering us (stalled or dead,
            # the election not over yet): sending appends there would only make them
            # indeterminate, so wait for a claim naming a node that answers.
            if (claim in self._nodes and msg.term >= d.best_term
                    and not self._nodes[claim].unresponsive):
                d.best_term = msg.term
                d.found = True
                if self._leader != claim:
                    log.debug("leader is %s (term %d, said %s)", claim, msg.term, node_id)
                self._set_leader(claim, time.monotonic())
        elif not is_retryable(code):
            d.errors.append((code, getattr(msg, "reason", "") or f"from {node_id}"))
        if self._disc is d and not d.found and all(
                self._nodes[n].unresponsive for n in d.rids.values()):
            # Everyone still expected is a node known to be silent: do not wait for it, ask
            # again soon instead (an election may be finishing elsewhere).
            d.timer_seq = -1
            self._end_round(time.monotonic())
        elif not d.rids and self._disc is d:
            d.timer_seq = -1
            self._end_round(time.monotonic())

    def _learn_members(self, peers: Sequence[P.PeerInfo]) -> None:
        """Bootstrap (Kafka's bootstrap.servers): members a node names in METADATA that this
        client was not given are added, so a client started from any one reachable node finds
        the leader and fails over like one given the whole peers string. I/O thread only;
        `self.peers` is replaced, never mutated, because caller threads iterate it."""
        new = {}
        for info in peers:
            if info.id in self._nodes or not info.address:
                continue
            host, colon, port_s = info.address.rpartition(":")
            try:
                port = int(port_s)
            except ValueError:
                continue
            if not colon or not host or not 0 < port < 65536:
                continue
            new[info.id] = (host.strip("[]"), port)
        for nid, (host, port) in list(new.items()):
            node = _Node(nid, host, port)
            try:
                self._open_socket(node)
            except zmq.ZMQError as e:
                # An address libzmq refuses (a node's misconfigured --peers, a hostile answer):
                # that member is left out; it must never take the I/O thread down with it.
                self._close_socket(node)
                del new[nid]
                log.warning("member %s named in METADATA has an unusable address %r: %s", nid,
                            f"{host}:{port}", e)
                continue
            self._nodes[nid] = node
            self._node_order.append(node)
        if not new:
            return
        self.peers = {**self.peers, **new}
        log.debug("learned members %s from METADATA", ", ".join(new))

    def _end_round(self, now: float) -> None:
        d = self._disc
        self._disc = None
        if self._leader is not None:
            self._release_waiting(now)
            return
        if not self._has_waiting():
            return
        if d is not None and d.answered and len(d.errors) == d.answered:
            # Every node that answered refused us (wrong group, unknown member...): waiting
            # would only end in a timeout that hides the real problem.
            code, reason = d.errors[0]
            for call in self._take_waiting():
                self._finish(call, exc=DLedgerError(code, reason))
            return
        self._need_leader(now)

    def _set_leader(self, node_id: str, now: float) -> None:
        """A leader is known: every call parked for one is sent now.

        Invariant: a call waits in `_waiting` only while no leader is known. A send that
        fails (no connection yet) forgets the leader and parks the call again, and a later
        answer may name the same leader while a discovery round is scheduled; a call parked
        then and not released here would sit until its deadline with the leader known."""
        self._leader = node_id
        if self._waiting:
            self._release_waiting(now)

    def _take_waiting(self) -> list[_Call]:
        w, self._waiting = self._waiting, []
        return [c for c in w if c.state == _WAITING]

    def _release_waiting(self, now: float) -> None:
        for call in self._take_waiting():
            self._dispatch(call, now)

    def _fail_all_on_close(self) -> None:
        self._draining.clear()  # nothing is released any more: every call fails below
        self._restamps.clear()
        for call in list(self._live):
            if call.state == _INFLIGHT:
                self._finish(call, exc=_make_error(
                    RC.TIMEOUT, "client closed while the request was in flight",
                    indeterminate=True, node=call.node.id if call.node else None))
            else:
                self._finish(call, exc=DLedgerError(
                    RC.TIMEOUT, "client closed before the request was sent"))
        self._pending.clear()
        self._waiting.clear()


def _member_query_done(raw: concurrent.futures.Future, out: concurrent.futures.Future,
                       node_id: str) -> None:
    """A query sent to one named node (read_from) comes back as that node's raw answer (a
    pinned call): turn it into what `query` returns or raises. Runs on the I/O thread."""
    exc = raw.exception()
    if exc is not None:
        out.set_exception(exc)
        return
    msg = raw.result()
    if isinstance(msg, P.QueryResponse) and msg.code == RC.SUCCESS:
        out.set_result(QueryResult(bytes(msg.answer), msg.applied_index))
        return
    code = getattr(msg, "code", RC.UNKNOWN)
    out.set_exception(_make_error(code if code != RC.SUCCESS else RC.UNKNOWN,
                                  getattr(msg, "reason", "") or f"from {node_id}", node=node_id))


def _decode_entries(blob: P.Buffer, start: int, limit: int) -> list[Entry]:
    """Store-format entries from a GET answer, verified (CRC, contiguous from `start`)."""
    out: list[Entry] = []
    try:
        for _off, e in codec.iter_entries(blob, verify_crc=True):
            if e.index != start + len(out):
                raise DLedgerError(RC.INCONSISTENT_INDEX,
                                   f"expected index {start + len(out)}, the node sent {e.index}")
            if e.magic == codec.MAGIC_NOOP:
                out.append(Entry(e.index, e.term, e.pos, b"", "NOOP"))
            else:
                out.append(Entry(e.index, e.term, e.pos, bytes(e.body), "NORMAL"))
    except codec.CodecError as e:
        raise DLedgerError(RC.DISK_ERROR, f"entry failed verification: {e}") from None
    if len(out) > limit:
        raise DLedgerError(RC.UNEXPECTED_ARGUMENT, f"asked for {limit} entries, got {len(out)}")
    return out


from ipc.kv_client import KVClient, KVError  # noqa: E402 - built on DLedgerClient above

__all__ = [
    "AppendResult",
    "KVClient",
    "KVError",
    "QueryResult",
    "ClientClosedError",
    "DLedgerClient",
    "DLedgerError",
    "DLedgerIndeterminateError",
    "Entry",
    "Metadata",
    "NodeInfo",
]
