"""`DLedgerClient`: the public face of the client library (docs/client.md).

Why a facade: the caller-side API (argument checks, the synchronous methods as async machinery
plus a wait, backpressure, multi-request operations such as `get_range`'s continuation and
`transfer_leadership`'s polling) is kept apart from the I/O thread (io_thread.py) that owns the
sockets; callers only hand calls to it and wait on their futures. A counting semaphore bounds
the calls in flight (`max_in_flight`): submitting more blocks the caller until a slot frees
(backpressure instead of unbounded memory).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ipc import protocol as P
from ipc.client import follow as follow_mod
from ipc.client.calls import (
    APPEND,
    BATCH,
    GET,
    MEMBER,
    META,
    QUERY,
    SNAPSHOT,
    TRANSFER,
    Call,
    Slots,
    backoff,
)
from ipc.client.follow import FetchResult
from ipc.client.io_thread import ClientIO
from ipc.client.results import (
    AppendResult,
    ClientClosedError,
    DLedgerError,
    DLedgerIndeterminateError,
    Entry,
    Metadata,
    QueryResult,
    build_metadata,
    decode_entries,
    member_query_done,
)
from ipc.codes import ResponseCode as RC
from ipc.codes import is_retryable
from ipc.security import client_curve
from ipc.sockets import parse_peers

DEFAULT_TIMEOUT = 3.0
DEFAULT_ATTEMPT_TIMEOUT = 1.0
"""Longest wait for one answer to an idempotent request (GET, METADATA) before trying again."""
DEFAULT_MAX_IN_FLIGHT = 1024


class DLedgerClient:
    """A thread-safe, pipelining client for one DLedger group.

    ``peers`` is DLedger's ``id-host:port;...`` string (or the dict ``parse_peers`` returns).
    ``timeout`` bounds every call (seconds), retries included; each method also takes a
    ``timeout=`` override. ``attempt_timeout`` bounds one attempt of an idempotent request
    (GET, per-node METADATA) before it is tried again. ``max_in_flight`` bounds the calls in
    flight at once; more submissions block until one completes.

    ``local_store_dir``: the store directory of a node running on this machine (a broker that
    embeds the log). Requests to that node then go through shared memory (ipc/local_link.py)
    instead of TCP, with the same sessions, retries and redirects; the other members are
    reached over the network as always. Without a node running there it is the network too.

    Create the client in the process that uses it (the ZeroMQ context never crosses a fork).
    Future callbacks run on the client's I/O thread: keep them short and do not make blocking
    calls on this client from them.
    """

    def __init__(self, peers: str | Mapping[str, tuple[str, int]], group: str = "default",
                 timeout: float = DEFAULT_TIMEOUT, *, attempt_timeout: float | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 max_body_size: int = P.DEFAULT_MAX_BODY, sessions: bool = True,
                 key_file: str | os.PathLike[str] | None = None,
                 server_keys: Mapping[str, bytes] | str | os.PathLike[str] | None = None,
                 local_store_dir: str | os.PathLike[str] | None = None) -> None:
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
        self._pid = os.getpid()

        # Caller side; everything the I/O thread owns is in `_io`.
        self._lock = threading.Lock()  # orders submissions against close()
        self._closed = False
        self._slots = Slots(max_in_flight)
        self._closed_event = threading.Event()
        # A secure group: our key pair (a `.key_secret` file) and the members' public keys
        # (`ID.key` beside it, or `server_keys`); KeyFileError (a ValueError) says what is wrong.
        curve = client_curve(key_file, server_keys) if key_file is not None else None
        self.key_file = key_file  # for tools that open sockets of their own to the same group
        self._io = ClientIO(peer_map, group, self.timeout, self.attempt_timeout, self._slots, sessions,
                            curve, None if local_store_dir is None else os.fspath(local_store_dir))
        self._thread = self._io.thread
        try:
            self._io.start()
        except BaseException:
            self._closed = True
            raise

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
        io = self._io
        if threading.get_ident() == io.ident:
            raise RuntimeError("close() called from a future callback on the client's I/O thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closed_event.set()
        io.stop()
        # Submissions the thread never took: they were not sent.
        while io.inbox:
            call = io.inbox.popleft()
            io.finish(call, exc=DLedgerError(RC.TIMEOUT, "client closed before the request was sent"),
                      live=False)
        self._slots.kick()
        io.release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def peers(self) -> dict[str, tuple[str, int]]:
        """The members known: those given, and those learned from METADATA answers."""
        return self._io.conns.peers  # replaced, never mutated, by the I/O thread

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
        call = Call(APPEND, body, time.monotonic() + (self.timeout if timeout is None else timeout))
        call.no_result = no_result
        if len(body) > self.max_body_size:
            self._io.finish(call, exc=DLedgerError(
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
        call = Call(BATCH, bodies, time.monotonic() + (self.timeout if timeout is None else timeout))
        if not bodies:
            self._io.finish(call, exc=DLedgerError(RC.REQUEST_WITH_EMPTY_BODYS, "empty batch"), live=False)
            return call.future
        big = max(len(b) for b in bodies)
        if big > self.max_body_size:
            self._io.finish(call, exc=DLedgerError(
                RC.UNEXPECTED_ARGUMENT, f"body of {big} bytes exceeds max_body_size {self.max_body_size}"), live=False)
            return call.future
        if len(bodies) > P.MAX_BATCH_COUNT:
            self._io.finish(call, exc=DLedgerError(
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
            call = Call(GET, (nxt, count - len(out), linearizable), deadline)
            try:
                resp = self._wait(self._submit(call), deadline - time.monotonic())
            except DLedgerError as e:
                if out and e.code == RC.INDEX_OUT_OF_RANGE:
                    break  # the committed end, reached on a continuation
                raise
            got = decode_entries(resp.entries, nxt, count - len(out))
            if not got:
                break
            out.extend(got)
        return out

    def fetch(self, index: int, *, max_entries: int = follow_mod.DEFAULT_MAX_ENTRIES,
              max_bytes: int = follow_mod.DEFAULT_MAX_BYTES, wait_ms: int = 0,
              read_from: str | None = None, timeout: float | None = None) -> FetchResult:
        """Committed entries from ``index`` (at most ``max_entries``, about ``max_bytes``, at
        least one when there is one), from ANY member that has them committed — followers too;
        ``read_from`` names one. With ``wait_ms`` the member holds the request until the entry
        at ``index`` commits or the wait ends (a long poll; the answer is then empty).

        Raises DLedgerError INDEX_LESS_THAN_LOCAL_BEGIN when ``index`` is below the log's begin
        on every member that answered (retention or a snapshot removed it), TIMEOUT when no
        member answered within ``timeout``. Entries are CRC-checked like ``get_range``'s."""
        follow_mod.check_args(index, max_entries, max_bytes, wait_ms)
        if read_from is not None and read_from not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{read_from!r} is not in the peers list")
        t = self.timeout if timeout is None else timeout
        rotation = follow_mod.MemberRotation(list(self.peers), lambda: self._io.discovery.leader, read_from)
        return follow_mod.fetch(self, index, max_entries, max_bytes, wait_ms, rotation,
                                time.monotonic() + max(t, wait_ms / 1000 + self.attempt_timeout))

    def follow(self, start: int | str = "earliest", *, include_noop: bool = True,
               read_from: str | None = None, wait_ms: int = follow_mod.DEFAULT_WAIT_MS,
               max_entries: int = follow_mod.DEFAULT_MAX_ENTRIES,
               max_bytes: int = follow_mod.DEFAULT_MAX_BYTES) -> Iterator[Entry]:
        """Committed entries from ``start`` in index order, for ever: across leader changes,
        node restarts and a member that dies mid-stream, with no gap and no repeat
        (docs/client.md "Following the log"). ``start``: an index, ``"earliest"`` (the lowest
        log begin of the members) or ``"latest"`` (the first index not yet committed).

        Each step is a FETCH long poll (``wait_ms``) to one member — a follower by preference
        — that answers up to the committed index it knows; an idle reader costs a member one
        request per ``wait_ms``. Raises DLedgerError INDEX_LESS_THAN_LOCAL_BEGIN when the next
        index is below every member's log begin (retention or a snapshot removed it). NOOP
        entries (a new leader's) are yielded too unless ``include_noop`` is False."""
        if read_from is not None and read_from not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{read_from!r} is not in the peers list")
        first = self.resolve_index(start)
        return follow_mod.follow(self, first, max_entries, max_bytes, wait_ms, read_from, include_noop)

    def resolve_index(self, where: int | str, timeout: float | None = None) -> int:
        """An index from ``"earliest"`` (`Metadata.lowest_begin`: the lowest ledger begin of the
        members that answer and hold entries; 0 for an empty log), ``"latest"`` (the leader's
        committed index + 1), or an int >= 0."""
        if isinstance(where, int) and not isinstance(where, bool):
            if where < 0:
                raise DLedgerError(RC.UNEXPECTED_ARGUMENT, f"index must be >= 0, not {where}")
            return where
        if where not in ("earliest", "latest"):
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT,
                               f"start must be an index, 'earliest' or 'latest', not {where!r}")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            md = self.metadata(max(0.1, deadline - time.monotonic()))
            alive = [n for n in md.nodes if n.alive]
            if where == "earliest" and alive:
                return md.lowest_begin()
            lead = next((n for n in alive if n.id == md.leader_id), None)
            if where == "latest" and lead is not None:
                return lead.committed_index + 1
            if time.monotonic() >= deadline:
                raise DLedgerError(RC.TIMEOUT, f"no {'member' if where == 'earliest' else 'leader'} "
                                               "answered within the timeout")
            time.sleep(0.05)

    def query(self, request: bytes | bytearray | memoryview, timeout: float | None = None, *,
              read_from: str | None = None) -> QueryResult:
        """A linearizable read of the group's state machine (its `query`): the leader confirms
        its leadership with a heartbeat round, waits until its state machine has applied
        everything committed when the read arrived, and answers from it. Idempotent: retried
        on other nodes and after timeouts within ``timeout``. UNSUPPORTED for a group without a
        state machine.

        ``read_from="n1"``: node n1 answers, whatever its role (a follower read, docs/client.md):
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
            return self._submit(Call(QUERY, bytes(request), deadline))
        if read_from not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{read_from!r} is not in the peers list")
        raw = self._submit(Call(QUERY, bytes(request), deadline, pinned=read_from))
        out: concurrent.futures.Future[QueryResult] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()
        raw.add_done_callback(lambda f: member_query_done(f, out, read_from))
        return out

    def take_snapshot(self, node_id: str, timeout: float | None = None) -> tuple[int, int]:
        """Ask node `node_id` (any role) to snapshot its state machine now; returns the (last
        index, last term) the snapshot on disk covers. UNSUPPORTED without a state machine."""
        if node_id not in self.peers:
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{node_id!r} is not in the peers list")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempt = 0
        while True:
            resp = self._wait(self._submit(Call(SNAPSHOT, None, deadline, pinned=node_id)),
                              deadline - time.monotonic())
            if isinstance(resp, P.SnapshotResponse) and resp.code == RC.SUCCESS:
                return resp.last_index, resp.last_term
            # A node whose applier is still starting (or busy) says LEADER_PENDING_FULL: a
            # passing state, asked again within the timeout like any retryable answer.
            code = getattr(resp, "code", RC.UNKNOWN)
            pause = backoff(attempt)
            if code != RC.LEADER_PENDING_FULL or time.monotonic() + pause >= deadline:
                break
            attempt += 1
            time.sleep(pause)
        raise DLedgerError(getattr(resp, "code", RC.UNKNOWN), getattr(resp, "reason", "") or f"from {node_id}",
                           node=node_id)

    def change_membership(self, kind: int, member_id: str, host: str = "", port: int = 0,
                          public_key: str = "", timeout: float | None = None) -> int:
        """One membership change (docs/membership.md): `kind` 1 adds `member_id` at
        `host`:`port` as a learner, 2 promotes a learner, 3 removes a member. Sent to the
        leader (admin right); returns the index of the configuration entry once it committed.
        Raises DLedgerError with the refusal code (MEMBERSHIP_CHANGE_IN_PROGRESS: retry later;
        MEMBERSHIP_NO_CHANGE: an earlier attempt already did it; ...)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        call = Call(MEMBER, (kind, member_id, host, port, public_key), deadline)
        return self._wait(self._submit(call), deadline - time.monotonic())

    def metadata(self, timeout: float | None = None) -> Metadata:
        """Ask every node in parallel. Silent nodes get alive=False and None fields.

        Each node gets at most ``attempt_timeout`` (within ``timeout``), so one dead node costs
        one short wait, not the whole timeout.
        """
        return build_metadata(self.group, self.peers, self._ask_all(timeout))

    def _ask_all(self, timeout: float | None) -> dict[str, P.Message | None]:
        """Every known node's METADATA answer (None: silent), asked in parallel."""
        t = self.timeout if timeout is None else timeout
        per_node = time.monotonic() + min(t, self.attempt_timeout)
        calls = [(nid, self._submit(Call(META, None, per_node, pinned=nid))) for nid in self.peers]
        answers: dict[str, P.Message | None] = {}
        for nid, fut in calls:
            try:
                answers[nid] = self._wait(fut, t)
            except DLedgerError:
                answers[nid] = None
        return answers

    def _is_member(self, node_id: str, timeout: float) -> bool:
        """`node_id` is a member this client knows, or one a node names in METADATA (a member
        added after this client was given its peers)."""
        if node_id in self.peers:
            return True
        return any(isinstance(m, P.MetadataResponse) and any(p.id == node_id for p in m.peers)
                   for m in self._ask_all(timeout).values())

    def transfer_leadership(self, target: str, timeout: float | None = None,
                            wait: bool = True) -> Metadata | None:
        """Ask the leader to hand leadership to ``target``; with ``wait``, return once
        ``target`` is the leader (polling METADATA) and return that Metadata.

        Raises DLedgerError on a refused transfer (e.g. TAKE_LEADERSHIP_FAILED, a lagging or
        dead target) or, indeterminate, if the transfer was accepted but not observed in time.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if not self._is_member(target, max(0.0, deadline - time.monotonic())):
            raise DLedgerError(RC.UNKNOWN_MEMBER, f"{target!r} is not a member")
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
                call = Call(TRANSFER, (target, m.term), deadline, pinned=m.leader_id)
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
                                           backoff(attempt + 3))):
                raise ClientClosedError("client closed")
        if accepted:
            raise DLedgerIndeterminateError(
                RC.TIMEOUT, f"transfer to {target} was accepted but {target} is not leader yet")
        if unanswered:
            raise DLedgerIndeterminateError(
                RC.TIMEOUT, f"transfer request unanswered and {target} is not leader yet")
        raise DLedgerError(last[0], last[1])

    # ------------------------------------------------------------------ caller side
    def _submit(self, call: Call) -> concurrent.futures.Future:
        """Hand a call to the I/O thread (thread-safe). Blocks for a slot (backpressure)."""
        if os.getpid() != self._pid:
            raise ClientClosedError("DLedgerClient used across fork(): create one per process")
        io = self._io
        if self._closed or io.stopping:
            raise ClientClosedError("DLedgerClient is closed")
        if threading.get_ident() == io.ident:
            ok = self._slots.acquire(False)  # the I/O thread must never block on itself
        else:
            ok = self._slots.acquire(True, max(0.0, call.deadline - time.monotonic()))
        if not ok:
            self._io.finish(call, exc=DLedgerError(
                RC.TIMEOUT, f"no free slot within the timeout ({self.max_in_flight} calls in flight)"), live=False)
            return call.future
        call.slot = True
        with self._lock:
            if self._closed:
                self._slots.release()
                raise ClientClosedError("DLedgerClient is closed")
            io.inbox.append(call)
        io.wake()
        return call.future

    def _wait(self, fut: concurrent.futures.Future, timeout: float | None = None) -> Any:
        if threading.get_ident() == self._io.ident:
            raise RuntimeError("blocking DLedgerClient call from a future callback (I/O thread)")
        # The I/O thread enforces the call's deadline; the grace period only guards against an
        # I/O thread that died, so a caller can never hang forever.
        try:
            return fut.result((self.timeout if timeout is None else timeout) + 5.0)
        except concurrent.futures.TimeoutError:
            raise DLedgerIndeterminateError(RC.TIMEOUT, "no result from the client I/O thread") from None
