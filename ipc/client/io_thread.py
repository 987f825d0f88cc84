"""The client's I/O thread: the one thread that owns every socket, and the life of each call
on it (dispatch, send, receive, retry, give up, finish).

Why one thread: pyzmq sockets are not thread-safe, so exactly one background thread owns every
socket (one DEALER per node). Callers hand it work through `inbox` plus a wake-up file
descriptor registered in its poller, and get a `concurrent.futures.Future` back. Every attempt
carries a fresh request id (u64) that the node echoes, so replies are matched to calls without
any ordering assumption, and thousands of appends can be in flight on one connection.

Definite vs indeterminate: NOT_LEADER, LEADER_PENDING_FULL, LEADER_TRANSFERRING, TERM_NOT_READY
mean the entry was NOT stored, so the call is retried (following `leader_id` redirects, with
capped exponential backoff) within its one overall deadline. WAIT_QUORUM_ACK_TIMEOUT,
TERM_CHANGED, and a request sent but never answered mean the entry *may still commit*: an
unstamped write then ends indeterminate and is never resent; a stamped one (sessions.py) is
resent under its stamp. A request that could not even be handed to a connected socket was not
sent, so it is retried like a definite failure. Reads have no side effects and are retried on
any retryable outcome, including timeouts.

Leader discovery lives in discovery.py, the session decisions in sessions.py, sockets in
connections.py, deadlines in timers.py; this module ties them to the poll loop.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import zmq

from ipc import protocol as P
from ipc.client.calls import (
    BACKOFF,
    DONE,
    INFLIGHT,
    KIND_NAMES,
    OPEN,
    QUERY,
    UNEXPECTED,
    WAITING,
    Call,
    Slots,
    backoff,
    encode_request,
    give_up_error,
    success_value,
)
from ipc.client.connections import Connections, Node, Waker
from ipc.client.discovery import LeaderDiscovery
from ipc.client.results import DLedgerError, _make_error
from ipc.client.sessions import ClientSessions
from ipc.client.timers import TimerQueue
from ipc.codes import ResponseCode as RC
from ipc.codes import is_indeterminate, is_retryable
from ipc.security import ClientCurve
from ipc.sockets import make_context

log = logging.getLogger("dledger.client")

# Answers of a named node (read_from) that say "not now": asked again until the call's deadline.
_NAMED_NODE_BUSY = frozenset({RC.LEADER_PENDING_FULL, RC.TERM_NOT_READY})

Collected = dict[Node, list[tuple[Call, int, bytes]]]


class ClientIO:
    """Everything the I/O thread owns, and the thread itself.

    Shared with caller threads: `inbox` (appended under the client's lock), `wake_armed`,
    `stopping`, `slots`; and `finish(..., live=False)` for calls that never reached the thread.
    """

    def __init__(self, peers: Mapping[str, tuple[str, int]], group: str, timeout: float,
                 attempt_timeout: float, slots: Slots, sessions: bool,
                 curve: ClientCurve | None = None, local_store_dir: str | None = None) -> None:
        self.group = group
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.slots = slots
        # Shared with caller threads.
        self.inbox: deque[Call] = deque()
        self.wake_armed = False
        self.stopping = False
        # I/O thread only (built here, before the thread starts).
        self.ctx = make_context()
        try:
            self.conns = Connections(self.ctx, peers, curve, local_store_dir)
        except BaseException:
            self.ctx.destroy(linger=0)
            raise
        self.waker = Waker()
        self.timers = TimerQueue()
        self.pending: dict[int, Call] = {}
        self.live: set[Call] = set()
        self._rids = itertools.count(1)  # 0 is what a server echoes when it could not read the id
        self.discovery = LeaderDiscovery(self)
        self.sessions = ClientSessions(self, sessions, timeout)
        self.thread = threading.Thread(target=self._main, name="dledger-client-io", daemon=True)
        self.ident: int | None = None
        self._started = threading.Event()
        self.setup_error: BaseException | None = None

    # ------------------------------------------------------------------ caller side
    def start(self) -> None:
        """Start the thread; raises what opening the sockets raised (e.g. a bad endpoint)."""
        self.thread.start()
        self._started.wait()
        if self.setup_error is not None:
            self.thread.join()
            self.release()
            raise self.setup_error

    def wake(self) -> None:
        """Wake the thread for a call just appended to `inbox` (unless a wake-up is pending).
        Order matters (see `_main`): append first, then check the flag."""
        if not self.wake_armed:
            self.wake_armed = True
            self.waker.wake()

    def stop(self) -> None:
        """Make the thread fail what it holds, close its sockets and exit; wait for it."""
        self.stopping = True
        self.waker.wake()
        self.thread.join()

    def release(self) -> None:
        self.ctx.destroy(linger=0)
        self.waker.close()

    # ------------------------------------------------------------------ host interface
    def next_rid(self) -> int:
        return next(self._rids)

    def set_timer(self, obj: Any, at: float) -> None:
        self.timers.set(obj, at, len(self.live))

    def park(self, call: Call) -> None:
        call.state = WAITING
        self.set_timer(call, call.deadline)

    def launch(self, call: Call, now: float) -> None:
        self.live.add(call)
        self.dispatch(call, now)

    def live_calls(self) -> Iterable[Call]:
        return self.live

    def mark_suspect(self, node: Node) -> None:
        self.conns.mark_suspect(node)
        self.discovery.forget(node.id)

    # ------------------------------------------------------------------ the loop
    def _main(self) -> None:
        self.ident = threading.get_ident()
        conns = self.conns
        poller = conns.poller
        try:
            conns.open_all()
            poller.register(self.waker.rfd, zmq.POLLIN)
        except BaseException as e:  # e.g. a bad endpoint: report it from __init__
            self.setup_error = e
            conns.close_all()
            return
        finally:
            self._started.set()
        wake_fd = self.waker.rfd
        inbox = self.inbox
        mon_node = conns.mon_node
        timers = self.timers
        try:
            while not self.stopping:
                due = timers.next_due()
                if due is not None:
                    wait_ms = max(0, math.ceil((due - time.monotonic()) * 1000))
                    wait_ms = min(wait_ms, 1000)
                else:
                    wait_ms = 1000
                for sock, _ev in poller.poll(wait_ms):
                    if sock == wake_fd:
                        self.waker.drain()
                        # Cleared after draining the fd and before draining the inbox: a
                        # caller that appends after our drain sees False and wakes us again.
                        self.wake_armed = False
                    elif sock in mon_node:
                        self._on_monitor(sock)
                    else:
                        self._recv_all(sock)
                if inbox:
                    now = time.monotonic()
                    popleft = inbox.popleft
                    out: Collected = {}
                    while inbox:
                        call = popleft()
                        self.live.add(call)
                        self.dispatch(call, now, out)
                    self._send_collected(out, now)
                due = timers.next_due()
                if due is not None and due <= time.monotonic():
                    self._run_timers(time.monotonic())
                conns.check_local(time.monotonic())
                if conns.suspects:
                    conns.reset_suspects()
                self.slots.kick()
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("client I/O thread crashed")
        finally:
            self.stopping = True  # later submissions fail fast instead of waiting for nobody
            self._fail_all_on_close()
            self.slots.kick()
            conns.close_all()

    def _run_timers(self, now: float) -> None:
        while (obj := self.timers.pop_due(now)) is not None:
            if isinstance(obj, Call):
                self._on_call_timer(obj, now)
            else:
                self.discovery.on_timer(obj, now)

    def _on_call_timer(self, call: Call, now: float) -> None:
        state = call.state
        if state == INFLIGHT:
            node = call.node
            self.pending.pop(call.rid, None)
            call.rid = 0
            node.inflight -= 1
            self.mark_suspect(node)
            if (not call.may_write or call.sid) and call.pinned is None and now < call.deadline:
                call.last = (RC.TIMEOUT, f"no answer from {node.id}")
                # reads are idempotent, and a session write's resend is deduplicated by the
                # leader: try again (elsewhere)
                call.unsure = call.unsure or call.may_write
                self.retry_later(call, now)
                return
            what = KIND_NAMES[call.kind]
            self.finish(call, exc=_make_error(
                RC.TIMEOUT, f"{what} sent to {node.id}, no answer within the timeout",
                indeterminate=True, node=node.id))
        elif state == BACKOFF:
            self.dispatch(call, now)
        elif state == WAITING:
            self._give_up(call)

    def _on_monitor(self, mon: zmq.Socket) -> None:
        """The connection to a node dropped (its process died, or it closed us): no answer to
        what is in flight there can come any more (a DEALER's reconnection is a new peer to
        the node's ROUTER). Reads and session writes are resent at once — the leader
        deduplicates a write it already holds — and a write without a session fails now as
        indeterminate instead of at its deadline. docs/client.md "Sessions"."""
        node = self.conns.dropped(mon)
        if node is None:
            return
        now = time.monotonic()
        lost = [c for c in self.pending.values() if c.node is node and c.state == INFLIGHT]
        if not lost:
            return
        log.debug("connection to %s lost with %d requests in flight", node.id, len(lost))
        self.mark_suspect(node)
        for call in lost:
            self.pending.pop(call.rid, None)
            call.rid = 0
            node.inflight -= 1
            call.last = (RC.NETWORK_ERROR, f"connection to {node.id} lost")
            if call.may_write and not call.sid:
                self.finish(call, exc=_make_error(
                    RC.NETWORK_ERROR, f"{KIND_NAMES[call.kind]} in flight to {node.id} when its "
                    "connection dropped", indeterminate=True, node=node.id))
                continue
            if call.pinned is not None:
                self.finish(call, None)  # a per-node METADATA: that node does not answer
                continue
            call.unsure = call.unsure or call.may_write
            self.retry_later(call, now)

    # ------------------------------------------------------------------ sending
    def dispatch(self, call: Call, now: float, out: Collected | None = None) -> None:
        """Send one attempt of `call`, or park it until a leader is known. With `out`, the
        encoded frame is collected there instead, for `_send_collected` to send many at once."""
        if now >= call.deadline:
            self._give_up(call)
            return
        sessions = self.sessions
        if call.may_write and sessions.enabled and call.sid == 0 and not sessions.stamp(call, now):
            return
        node_id = call.pinned or self.discovery.leader
        if node_id is None:
            self.discovery.park(call, now)
            return
        node = self.conns.nodes[node_id]
        rid = next(self._rids)
        try:
            frame = encode_request(self.group, call, node_id, rid)
        except P.ProtocolError as e:
            self.finish(call, exc=DLedgerError(RC.UNEXPECTED_ARGUMENT, str(e)))
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

    def _send_collected(self, out: Collected, now: float) -> None:
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

    def _not_sent(self, call: Call, node: Node, now: float) -> None:
        # IMMEDIATE: no connection to that node (or its queue is full). Nothing was sent,
        # so this is a definite failure and retrying is safe.
        call.last = (RC.NETWORK_ERROR, f"no connection to {node.id}")
        if call.pinned is None:
            self.discovery.forget(node.id)
        self.retry_later(call, now)

    def _sent(self, call: Call, node: Node, rid: int, now: float) -> None:
        call.state = INFLIGHT
        call.rid = rid
        call.node = node
        node.inflight += 1
        self.pending[rid] = call
        if (call.may_write and not call.sid) or call.pinned is not None:
            self.set_timer(call, call.deadline)  # never resent: wait for the whole timeout
        else:
            self.set_timer(call, min(call.deadline, now + self.attempt_timeout))
            self.sessions.on_sent(call, now)

    def retry_later(self, call: Call, now: float) -> None:
        call.attempts += 1
        at = now + backoff(call.attempts)
        if at >= call.deadline:
            self._give_up(call)  # with the last definite outcome: nothing was left pending
            return
        call.state = BACKOFF
        self.set_timer(call, at)

    def _give_up(self, call: Call) -> None:
        """The deadline passed with nothing outstanding (see `give_up_error`). When nothing
        was sent and members refused our CURVE handshake, that is the reason to give
        (PERMISSION_DENIED, definite: nothing was sent), naming each refusal; the members not
        named did not answer at all within the timeout."""
        exc = give_up_error(call)
        refused = [n for n in self.conns.order if n.refused]
        if call.last is None and refused and not call.unsure:
            why = "; ".join(f"{n.id}: {n.refused}" for n in refused)
            rest = "" if len(refused) == len(self.conns.order) else "; no answer from the others"
            exc = DLedgerError(RC.PERMISSION_DENIED, f"no member accepted this client ({why}{rest})")
        self.finish(call, exc=exc)

    def finish(self, call: Call, result: Any = None, exc: BaseException | None = None,
               live: bool = True) -> None:
        """Complete a call: free its slot first (a blocked submitter may proceed), then resolve.

        `live=False` on caller threads: `live` and the session state belong to the I/O thread.
        """
        if call.state == DONE:  # e.g. closing: a write already failed with its session's opening
            return
        call.state = DONE
        if live and self.sessions.draining:
            self.sessions.on_done(call, time.monotonic())
        call.timer_seq = -1
        if live:
            self.live.discard(call)
        if call.slot:
            call.slot = False
            self.slots.release()
        if exc is None:
            call.future.set_result(result)
        else:
            call.future.set_exception(exc)
        if call.sid:
            self.sessions.after_outcome(call, exc, time.monotonic())
        # A finished call may still sit in the timer FIFO until its deadline (lazy deletion):
        # it must not keep its bodies alive there (a group refusing every append at the
        # request rate made that hundreds of MB).
        call.payload = None
        if call.kind == OPEN:
            self.sessions.on_open_done(call, result, exc, time.monotonic())

    # ------------------------------------------------------------------ receiving
    def _recv_all(self, sock: zmq.Socket) -> None:
        on_reply = self._on_reply
        for node, msg in self.conns.receive(sock):
            on_reply(node, msg)

    def _on_reply(self, node: Node, msg: P.Message) -> None:
        rid = msg.request_id
        call = self.pending.pop(rid, None)
        self.conns.answered(node)
        if call is None:
            self.discovery.on_reply(rid, msg)
            return  # else: a late answer to an attempt we already gave up on
        node.inflight -= 1
        call.rid = 0
        code = getattr(msg, "code", RC.UNKNOWN)
        if call.pinned is not None:
            if call.kind == QUERY and code in _NAMED_NODE_BUSY:
                # A read from a named node that is starting (its applier not taking requests
                # yet) or busy: a read is idempotent, so ask that node again within the timeout.
                call.last = (code, getattr(msg, "reason", "") or f"from {node.id}")
                self.retry_later(call, time.monotonic())
                return
            self.finish(call, msg)  # the caller interprets the node's raw answer
            return
        if code == RC.SUCCESS:
            self.discovery.succeeded()
            value = success_value(call, msg)
            if value is not UNEXPECTED:
                self.finish(call, value)
                return
            self.finish(call, exc=_make_error(
                RC.UNKNOWN, f"unexpected {type(msg).__name__} to {KIND_NAMES[call.kind]} from {node.id}",
                indeterminate=call.may_write, node=node.id))
            return
        self._on_failure(call, node, msg, code, time.monotonic())

    def _on_failure(self, call: Call, node: Node, msg: P.Message, code: int, now: float) -> None:
        reason = getattr(msg, "reason", "") or f"from {node.id}"
        if call.kind == OPEN and not is_retryable(code):
            self.finish(call, exc=DLedgerError(code, reason))
            return
        if call.may_write and call.sid and self.sessions.on_failure(call, code, reason, now):
            return
        if call.may_write and is_indeterminate(code):
            # WAIT_QUORUM_ACK_TIMEOUT / TERM_CHANGED / TIMEOUT: stored on the leader, maybe on a
            # quorum. A resend could store it twice, so the caller decides.
            self.finish(call, exc=_make_error(code, reason, indeterminate=True, node=node.id))
            return
        if not is_retryable(code):
            # A refusal speaks for this attempt only: if an earlier attempt of a stamped write
            # may have been stored (a lost answer, a dead leader), it still may, so the outcome
            # is indeterminate. A caller retries a definite failure, which would store it twice.
            self.finish(call, exc=_make_error(code, reason, indeterminate=call.may_write and call.unsure,
                                              node=node.id))
            return
        call.last = (code, reason)
        if code == RC.NOT_LEADER:
            hint = getattr(msg, "leader_id", "")
            if hint and hint != node.id and hint in self.conns.nodes:
                self.discovery.set_leader(hint, now)
                call.redirects += 1
                if call.redirects <= 2 * len(self.conns.nodes):
                    self.dispatch(call, now)  # follow the redirect at once
                    return
            else:
                self.discovery.forget(node.id)
        self.retry_later(call, now)

    def _fail_all_on_close(self) -> None:
        self.sessions.clear()  # nothing is released any more: every call fails below
        for call in list(self.live):
            if call.state == INFLIGHT:
                self.finish(call, exc=_make_error(
                    RC.TIMEOUT, "client closed while the request was in flight",
                    indeterminate=True, node=call.node.id if call.node else None))
            else:
                self.finish(call, exc=DLedgerError(
                    RC.TIMEOUT, "client closed before the request was sent"))
        self.pending.clear()
        self.discovery.waiting.clear()
