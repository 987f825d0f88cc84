"""Client sessions (exactly-once appends, docs/client.md "Sessions"): the stamping decisions,
free of sockets and threads so they can be driven and tested on their own.

The client opens a session with the leader (OPEN_SESSION) and stamps each write with
(session, seq), seqs in dispatch order. A write whose outcome is open is resent under the same
stamp (the leader answers a stamp its log already holds with the original index). A write that
failed, or that the leader's forgotten session left behind, *abandons* the session: its seq may
be a hole the leader would wait on forever, so later writes get a new session.

Order across a session change (docs/client.md "Order"): the abandoned session's writes still
unresolved hold back every later write (the *drain*); those of them that were never stored are
stamped again in the new session in their first order, ahead of every write submitted after
them. Writes told SESSION_SEQ_GAP wait behind the write holding the seq before theirs and are
resent right behind it (`gap_waiters`), so a backlog behind one lost append drains in one
pipelined burst in seq order.

`ClientSessions` acts only through `SessionHost` (dispatch, park, retry, finish, launch): the
I/O thread implements it with sockets and timers, a unit test with lists.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from ipc.client.calls import BACKOFF, DONE, INFLIGHT, OPEN, SESSION_RESEND, WAITING, Call
from ipc.client.results import DLedgerError, _make_error
from ipc.codes import ResponseCode as RC
from ipc.codes import is_indeterminate
from ipc.seq import seq_add, seq_after

log = logging.getLogger("dledger.client")


class SessionHost(Protocol):
    """What the session logic asks of the I/O thread."""

    def dispatch(self, call: Call, now: float) -> None:
        """Send an attempt of `call` now (stamping it first via `stamp` if it has no stamp)."""

    def park(self, call: Call) -> None:
        """Mark `call` WAITING with a timer at its deadline (it gives up if never released)."""

    def retry_later(self, call: Call, now: float) -> None:
        """Send `call` again after a backoff (or give up if its deadline comes first)."""

    def finish(self, call: Call, result: Any = None, exc: BaseException | None = None) -> None:
        """Complete `call`; the host calls back `on_done`, `after_outcome` and `on_open_done`."""

    def launch(self, call: Call, now: float) -> None:
        """Start a call of the client's own (OPEN_SESSION): make it live and dispatch it."""

    def live_calls(self) -> Iterable[Call]:
        """Every call submitted and not completed."""


class ClientSessions:
    """The session state of one client: the open session and its next seq, the writes waiting
    for a session, and the drain of an abandoned one. I/O thread only."""

    def __init__(self, host: SessionHost, enabled: bool, open_timeout: float) -> None:
        self.host = host
        self.enabled = enabled  # False: appends are sent unstamped (or the group has no sessions)
        self.open_timeout = open_timeout
        self.sid = 0  # 0: none open (yet, or abandoned)
        self.next_seq = 1
        self.opening: Call | None = None
        self.waiting: list[Call] = []  # writes parked until a session is open
        # The writes of an abandoned session not yet resolved, and those of them that were never
        # stored, waiting to be stamped again in their first order.
        self.draining: set[Call] = set()
        self.restamps: list[tuple[int, Call]] = []  # (its seq in the abandoned session, write)
        # (session, seq) of the abandoned session's append that was definitely never stored: a
        # leader stores a seq only after the one before it, so no later seq of that session can
        # have been stored either, whatever their attempts saw (they need not wait it out).
        self.hole: tuple[int, int] | None = None
        # Writes of the current session told SESSION_SEQ_GAP, by the seq they wait behind: each
        # is resent right behind the write holding that seq (when that one is sent again, or
        # succeeds), so a backlog behind one lost append drains in one pipelined burst in seq
        # order, not at each write's own backoff (in random order: a convoy that took ~0.15 s
        # a write, timing a writer's appends out for 10 s after a leader's handler was killed).
        self.gap_waiters: dict[int, Call] = {}
        self._pulling = False

    # ------------------------------------------------------------------ stamping
    def stamp(self, call: Call, now: float) -> bool:
        """Give a write its (session, seq), in dispatch order; False when it must wait for a
        session to be opened (it is parked and resumed by `_opened`), or for the writes of an
        abandoned session to be resolved (resumed by `_drained`). While any is unresolved
        there is no session: abandoning clears `sid`, and no OPEN is sent until they are."""
        if self.sid == 0:
            self.host.park(call)
            self.waiting.append(call)
            if self.opening is None and not self.draining:
                self.opening = Call(OPEN, None, now + self.open_timeout)
                self.host.launch(self.opening, now)
            return False
        call.sid, call.seq = self.sid, self.next_seq
        self.next_seq = seq_add(self.next_seq, call.count)
        return True

    def _opened(self, sid: int, now: float) -> None:
        self.sid, self.next_seq = sid, 1
        log.debug("client session %#x opened", sid)
        self._release_waiting(now)

    def _refused(self, code: int, reason: str, now: float) -> None:
        """OPEN_SESSION failed for good. A node too old to know it (UNSUPPORTED): go on
        without sessions (appends as before). Anything else fails the writes that wait."""
        if code == RC.UNSUPPORTED:
            log.warning("the group does not offer client sessions (%s): appends are not "
                        "deduplicated", reason)
            self.enabled = False
            self._release_waiting(now)
            return
        waiting, self.waiting = self.waiting, []
        for call in waiting:
            if call.state == WAITING:
                self.host.finish(call, exc=DLedgerError(code, f"cannot open a client session: {reason}"))

    def _release_waiting(self, now: float) -> None:
        waiting, self.waiting = self.waiting, []
        for call in waiting:
            if call.state == WAITING:
                self.host.dispatch(call, now)

    # ------------------------------------------------------------------ host events
    def on_sent(self, call: Call, now: float) -> None:
        """An attempt of `call` went out: the writes waiting behind it follow it."""
        if self.gap_waiters and call.sid and call.sid == self.sid:
            self._pull_gap_waiters(call, now)

    def on_done(self, call: Call, now: float) -> None:
        """`call` completed (just marked DONE, its future not yet set)."""
        if self.draining:
            self._resolved(call, now)

    def after_outcome(self, call: Call, exc: BaseException | None, now: float) -> None:
        """`call`'s future is set: a success lets the writes behind it follow; a failed
        stamped write's seq was not (knowably) stored, a hole the leader would wait on."""
        if exc is None:
            if self.gap_waiters and call.sid and call.sid == self.sid:
                self._pull_gap_waiters(call, now)
        elif call.sid and not call.fixed:
            self.abandon(call, definite=not call.unsure and not getattr(exc, "indeterminate", True))

    def on_open_done(self, call: Call, result: Any, exc: BaseException | None, now: float) -> None:
        """However OPEN_SESSION ended, the writes waiting for it move on."""
        if call is not self.opening:
            return
        self.opening = None
        if exc is None:
            self._opened(result, now)
        else:
            self._refused(getattr(exc, "code", RC.UNKNOWN), getattr(exc, "reason", str(exc)), now)

    def clear(self) -> None:
        """The client is closing: nothing is released any more (every call fails)."""
        self.draining.clear()
        self.restamps.clear()

    # ------------------------------------------------------------------ failures
    def on_failure(self, call: Call, code: int, reason: str, now: float) -> bool:
        """A stamped write's failure; True if handled here. An answer that leaves the outcome
        open is resent under the same stamp (the leader deduplicates); a session the leader
        does not know (or one abandoned meanwhile) is left for a fresh one if this write was
        never possibly stored."""
        if call.fixed:
            return self._on_fixed_failure(call, code, reason, now)
        if is_indeterminate(code) or code in SESSION_RESEND:
            call.unsure = call.unsure or is_indeterminate(code)
            call.last = (code, reason)
            if code in SESSION_RESEND and call.sid != self.sid and (not call.unsure or self._behind_hole(call)):
                call.unsure = False  # never stored (behind a hole that never was, if it was unsure)
                self._restamp(call, now)  # its session was abandoned: the hole stays open
                return True
            self.host.retry_later(call, now)  # also the fallback if the write before it never succeeds
            if code in SESSION_RESEND and call.sid == self.sid and call.state == BACKOFF:
                self.gap_waiters[seq_add(call.seq, -1)] = call
            return True
        node = call.node.id if call.node else None
        if code == RC.SESSION_EXPIRED:
            self.abandon(call, forgotten=True)
            if not call.unsure:
                self._restamp(call, now)
                return True
            self.host.finish(call, exc=_make_error(code, f"{reason}; an earlier attempt may have been "
                                                         "stored", indeterminate=True, node=node))
            return True
        if code == RC.SESSION_SEQ_TOO_OLD:
            # Stored, but where is no longer known: never a definite failure, which a caller
            # would retry (storing it twice); indeterminate is the error that says "do not".
            self.host.finish(call, exc=_make_error(code, f"{reason}: stored long ago, its index is no "
                                                         "longer known", indeterminate=True, node=node))
            return True
        if code == RC.SESSION_SEQ_INVALID:
            self.host.finish(call, exc=_make_error(code, reason, indeterminate=call.unsure))
            return True
        return False

    def _on_fixed_failure(self, call: Call, code: int, reason: str, now: float) -> bool:
        """A write under a caller-chosen stamp (ipc/client/writer.py): it is not this client's
        session, so nothing here is abandoned or re-stamped. An open outcome is resent under
        the same stamp; a session the leader cannot vouch for ends the call — indeterminate,
        because another process may have written under that stamp before (the very case such
        stamps exist for), so "not stored" can never be concluded here."""
        if is_indeterminate(code) or code in SESSION_RESEND:
            call.unsure = call.unsure or is_indeterminate(code)
            call.last = (code, reason)
            self.host.retry_later(call, now)
            return True
        if code in (RC.SESSION_EXPIRED, RC.SESSION_SEQ_TOO_OLD, RC.SESSION_SEQ_INVALID):
            node = call.node.id if call.node else None
            self.host.finish(call, exc=_make_error(code, f"{reason} (session {call.sid:#x}, seq {call.seq}: "
                                                         "it may hold an earlier write)",
                                                   indeterminate=True, node=node))
            return True
        return False

    def abandon(self, call: Call, forgotten: bool = False, definite: bool = False) -> None:
        """A stamped write failed (definitely or not), or the leader forgot the session: its
        seq may be a hole the leader waits for forever. Later writes get a new session, and
        writes of this one that meet the hole (SESSION_SEQ_GAP) move to it if they cannot
        have been stored. Except when it was the newest stamp handed out and it cannot have
        been stored: then its seqs are simply handed out again (no hole, no new session) —
        unless the leader has forgotten the session itself (`forgotten`)."""
        if (not forgotten and call.sid and call.sid == self.sid and not call.unsure
                and seq_add(call.seq, call.count) == self.next_seq):
            self.next_seq = call.seq
            return
        if call.sid and call.sid == self.sid:
            log.debug("client session %#x abandoned at seq %d", self.sid, call.seq)
            old, self.sid = self.sid, 0
            self.hole = (old, call.seq) if definite and not forgotten else None
            # Its other writes still unresolved hold back every later write until each one is
            # acknowledged, fails, or is known never stored (`_restamp`): a later write stamped
            # in a new session meanwhile would be stored before them.
            self.draining = {c for c in self.host.live_calls() if c.sid == old and c is not call
                             and c.state != DONE and c.may_write}

    # ------------------------------------------------------------------ internals
    def _pull_gap_waiters(self, call: Call, now: float) -> None:
        """`call` was just sent (or succeeded): send the write waiting behind its last seq right
        after it, then the one behind that, and so on down the backlog (iteratively: each send
        would otherwise pull the next one recursively)."""
        if self._pulling:
            return
        self._pulling = True
        try:
            head = call
            while True:
                waiter = self.gap_waiters.pop(seq_add(head.seq, head.count - 1), None)
                if waiter is None or waiter.state != BACKOFF or waiter.sid != head.sid:
                    break
                self.host.dispatch(waiter, now)
                if waiter.state != INFLIGHT:
                    break  # not sent (no connection, no leader): its own timer takes over
                head = waiter
        finally:
            self._pulling = False
        if len(self.gap_waiters) > 4096:  # entries whose writes moved on: forget them
            self.gap_waiters = {k: c for k, c in self.gap_waiters.items() if c.state == BACKOFF}

    def _behind_hole(self, call: Call) -> bool:
        """A write of the abandoned session after its definitely-never-stored seq."""
        h = self.hole
        return h is not None and call.sid == h[0] and seq_after(h[1], call.seq) > 0

    def _resolved(self, call: Call, now: float) -> None:
        """`call`, a write of an abandoned session, is resolved; the last one releases the rest."""
        d = self.draining
        if call in d:
            d.discard(call)
            if not d:
                self._drained(now)

    def _drained(self, now: float) -> None:
        """Every write of the abandoned session is resolved: those never stored are stamped in a
        new session first, in their first order, then the writes submitted meanwhile."""
        waiting = [(seq, c) for seq, c in self.restamps if c.state == WAITING]
        self.restamps = []
        if waiting:  # one session's seqs: ordered relative to any one of them (they may wrap)
            base = waiting[0][0]
            waiting.sort(key=lambda sc: seq_after(base, sc[0]))
        self.waiting = [c for _seq, c in waiting] + self.waiting
        self._release_waiting(now)

    def _restamp(self, call: Call, now: float) -> None:
        """Send a write that was definitely not stored under a fresh session: once every write of
        its old session is resolved (it is one of them), ahead of the writes submitted later."""
        old_seq = call.seq
        call.sid = call.seq = 0
        if call not in self.draining:
            self.host.dispatch(call, now)
            return
        self.host.park(call)
        self.restamps.append((old_seq, call))
        self._resolved(call, now)
