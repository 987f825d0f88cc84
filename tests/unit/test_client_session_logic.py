"""The client's session logic (ipc/client/sessions.py) on its own: stamping order, gap
resends, abandoning a session and draining it, restamping writes that were never stored.

`ClientSessions` acts only through its host interface, so these tests drive the real object
through a host that records what it was asked to do (send, park, retry, finish) instead of
touching sockets. The host completes calls in the same order of hooks as the I/O thread's
`finish`: `on_done` (while draining), the outcome, `after_outcome`, then `on_open_done`."""

from __future__ import annotations

from typing import Any

from ipc.client.calls import APPEND, BACKOFF, BATCH, DONE, INFLIGHT, OPEN, WAITING, Call
from ipc.client.results import DLedgerError, DLedgerIndeterminateError
from ipc.client.sessions import ClientSessions
from ipc.codes import ResponseCode as RC

NOW = 0.0
SID1, SID2 = 0x0001_0001, 0x0002_0001


class RecordingHost:
    """A SessionHost whose dispatch "sends" by recording (stamping first, as the I/O thread
    does), and whose finish resolves the call's future and reports back to the sessions."""

    def __init__(self, enabled: bool = True) -> None:
        self.sessions = ClientSessions(self, enabled, open_timeout=3.0)
        self.sent: list[Call] = []
        self.live: set[Call] = set()
        self.retried: list[Call] = []
        self.opens: list[Call] = []

    # SessionHost
    def dispatch(self, call: Call, now: float) -> None:
        s = self.sessions
        if call.may_write and s.enabled and call.sid == 0 and not s.stamp(call, now):
            return
        call.state = INFLIGHT
        self.sent.append(call)
        if call.kind != OPEN:
            s.on_sent(call, now)

    def park(self, call: Call) -> None:
        call.state = WAITING

    def retry_later(self, call: Call, now: float) -> None:
        call.attempts += 1
        call.state = BACKOFF
        self.retried.append(call)

    def finish(self, call: Call, result: Any = None, exc: BaseException | None = None) -> None:
        if call.state == DONE:
            return
        call.state = DONE
        if self.sessions.draining:
            self.sessions.on_done(call, NOW)
        self.live.discard(call)
        if exc is None:
            call.future.set_result(result)
        else:
            call.future.set_exception(exc)
        if call.sid:
            self.sessions.after_outcome(call, exc, NOW)
        if call.kind == OPEN:
            self.sessions.on_open_done(call, result, exc, NOW)

    def launch(self, call: Call, now: float) -> None:
        self.opens.append(call)
        self.live.add(call)
        self.dispatch(call, now)

    def live_calls(self) -> set[Call]:
        return self.live

    # driving
    def submit(self, kind: int = APPEND, n: int = 1) -> Call:
        call = Call(kind, [b"x"] * n if kind == BATCH else b"x", deadline=100.0)
        self.live.add(call)
        self.dispatch(call, NOW)
        return call

    def open_session(self, sid: int) -> None:
        opening = self.sessions.opening
        assert opening is not None and opening.state == INFLIGHT
        self.finish(opening, sid)

    def stamps(self, calls: list[Call]) -> list[tuple[int, int]]:
        return [(c.sid, c.seq) for c in calls]


def opened(sid: int = SID1) -> RecordingHost:
    """A host with session `sid` open; its first write (seq 1) succeeded, the next seq is 2."""
    h = RecordingHost()
    first = h.submit()  # the first write opens the session
    h.open_session(sid)
    h.finish(first, "ok")
    assert (first.sid, first.seq) == (sid, 1) and h.sessions.next_seq == 2
    h.sent.clear()
    return h


def test_writes_wait_for_one_open_then_are_stamped_in_submission_order() -> None:
    h = RecordingHost()
    a, b, c = h.submit(), h.submit(BATCH, 3), h.submit()
    assert [x.state for x in (a, b, c)] == [WAITING] * 3
    assert len(h.opens) == 1 and h.sent == h.opens  # one OPEN_SESSION, nothing else sent yet
    h.open_session(SID1)
    assert h.sent[1:] == [a, b, c]
    assert h.stamps([a, b, c]) == [(SID1, 1), (SID1, 2), (SID1, 5)]  # a batch of 3 takes 2..4
    assert h.sessions.next_seq == 6
    d = h.submit()
    assert (d.sid, d.seq) == (SID1, 6) and h.sent[-1] is d


def test_a_refused_open_fails_the_waiting_writes_and_unsupported_goes_on_unstamped() -> None:
    h = RecordingHost()
    a = h.submit()
    h.finish(h.sessions.opening, exc=DLedgerError(RC.UNKNOWN_GROUP, "no such group"))
    assert a.state == DONE and a.future.exception().code == RC.UNKNOWN_GROUP

    h = RecordingHost()
    a = h.submit()
    h.finish(h.sessions.opening, exc=DLedgerError(RC.UNSUPPORTED, "old node"))
    assert not h.sessions.enabled and h.sent[-1] is a and (a.sid, a.seq) == (0, 0)


def test_the_newest_write_never_stored_hands_its_seq_out_again() -> None:
    h = opened()
    a, b = h.submit(), h.submit()
    h.finish(b, exc=DLedgerError(RC.UNEXPECTED_ARGUMENT, "refused"))  # definite, newest stamp
    assert h.sessions.sid == SID1 and h.sessions.next_seq == 3  # no hole: seq 3 again
    c = h.submit()
    assert (c.sid, c.seq) == (SID1, 3) and a.state == INFLIGHT


def test_gap_waiters_are_resent_right_behind_the_write_they_wait_for_in_seq_order() -> None:
    h = opened()
    a, b, c, d = h.submit(), h.submit(), h.submit(), h.submit()
    # a's answer was lost; b, c, d reached the leader first and were told SESSION_SEQ_GAP,
    # answered out of order.
    for call in (d, b, c):
        assert h.sessions.on_failure(call, RC.SESSION_SEQ_GAP, "gap", NOW)
        assert call.state == BACKOFF
    assert h.sessions.gap_waiters == {2: b, 3: c, 4: d}  # by the seq each waits behind
    h.sent.clear()
    h.dispatch(a, NOW)  # a's resend under its stamp (after its own attempt deadline)
    assert h.sent == [a, b, c, d]  # one burst, in seq order, not at each write's own backoff
    assert h.stamps(h.sent) == [(SID1, 2), (SID1, 3), (SID1, 4), (SID1, 5)]  # same stamps
    assert h.sessions.gap_waiters == {}


def test_a_success_also_releases_the_write_waiting_behind_it() -> None:
    h = opened()
    a, b = h.submit(), h.submit()
    h.sessions.on_failure(b, RC.SESSION_SEQ_GAP, "gap", NOW)
    h.sent.clear()
    h.finish(a, "ok")
    assert h.sent == [b] and b.state == INFLIGHT and (b.sid, b.seq) == (SID1, 3)


def test_abandon_drains_then_restamps_never_stored_writes_first_in_their_first_order() -> None:
    h = opened()
    a, b, c, d, e = (h.submit() for _ in range(5))  # seqs 2..6
    # b fails definitely (a refusal of its only attempt): seq 3 is a hole the leader would
    # wait on forever, so the session is abandoned; a, c, d, e are unresolved.
    h.finish(b, exc=DLedgerError(RC.UNEXPECTED_ARGUMENT, "refused"))
    s = h.sessions
    assert s.sid == 0 and s.hole == (SID1, 3) and s.draining == {a, c, d, e}
    f = h.submit()  # submitted meanwhile: waits for the drain, and no OPEN is sent yet
    assert f.state == WAITING and s.opening is None and len(h.opens) == 1
    # e and c (in that order) meet the hole: never stored, so restamped later, in seq order.
    for call in (e, c):
        assert s.on_failure(call, RC.SESSION_SEQ_GAP, "gap", NOW)
        assert call.state == WAITING and (call.sid, call.seq) == (0, 0)
    assert s.draining == {a, d}
    h.finish(d, exc=DLedgerIndeterminateError(RC.TIMEOUT, "no answer"))  # resolved: unknown
    assert s.opening is None  # a is still unresolved: nothing is released
    h.sent.clear()
    h.finish(a, "ok")  # the last one: the drain ends, a new session is opened
    assert s.draining == set() and len(h.opens) == 2 and h.sent == [h.opens[1]]
    h.open_session(SID2)
    assert h.sent[1:] == [c, e, f]  # the restamped writes first, in their first order
    assert h.stamps([c, e, f]) == [(SID2, 1), (SID2, 2), (SID2, 3)]


def test_an_unsure_write_behind_a_definite_hole_is_restamped() -> None:
    h = opened()
    a, b, c = h.submit(), h.submit(), h.submit()
    # c's first attempt went unanswered (unsure), then the session is abandoned at b, which
    # was definitely never stored: c cannot have been stored after it.
    assert h.sessions.on_failure(c, RC.WAIT_QUORUM_ACK_TIMEOUT, "slow", NOW)
    assert c.unsure and c.state == BACKOFF
    h.finish(b, exc=DLedgerError(RC.UNEXPECTED_ARGUMENT, "refused"))
    assert h.sessions.on_failure(c, RC.SESSION_SEQ_GAP, "gap", NOW)
    assert not c.unsure and c.state == WAITING and (c.sid, c.seq) == (0, 0)
    assert a.state == INFLIGHT


def test_an_expired_session_restamps_a_sure_write_and_fails_an_unsure_one_indeterminate() -> None:
    h = opened()
    a, b = h.submit(), h.submit()
    b.unsure = True
    assert h.sessions.on_failure(b, RC.SESSION_EXPIRED, "unknown session", NOW)
    assert b.state == DONE and isinstance(b.future.exception(), DLedgerIndeterminateError)
    assert h.sessions.sid == 0 and h.sessions.draining == {a}
    assert h.sessions.on_failure(a, RC.SESSION_EXPIRED, "unknown session", NOW)
    assert a.state != DONE and (a.sid, a.seq) == (0, 0)  # never stored: resent in a new session
    assert len(h.opens) == 2 and h.sent[-1] is h.opens[1]
    h.open_session(SID2)
    assert h.sent[-1] is a and (a.sid, a.seq) == (SID2, 1)


def test_the_session_logic_imports_no_sockets() -> None:
    """Socket-free by construction: neither sessions.py nor what it imports from the client
    package (calls, results) imports zmq or the I/O modules."""
    import ast
    from pathlib import Path

    def runtime_nodes(node: ast.AST):  # every node except under `if TYPE_CHECKING:`
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                continue
            yield child
            yield from runtime_nodes(child)

    pkg = Path(__file__).resolve().parents[2] / "ipc" / "client"
    for name in ("sessions.py", "calls.py", "results.py"):
        nodes = list(runtime_nodes(ast.parse((pkg / name).read_text())))
        mods = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module}
        bad = {m for m in mods if m.split(".")[0] == "zmq"
               or m in ("ipc.sockets", "ipc.client.connections", "ipc.client.io_thread")}
        assert bad == set(), f"{name} imports {bad}"


# ---------------------------------------------------------------- caller-chosen stamps (writer.py)
def _fixed(host: RecordingHost, sid: int, seq: int, n: int = 2) -> Call:
    call = Call(BATCH, [b"x"] * n, deadline=100.0)
    call.sid, call.seq, call.fixed = sid, seq, True
    host.live.add(call)
    host.dispatch(call, NOW)
    return call


def test_fixed_stamp_is_resent_under_itself_and_never_restamped() -> None:
    host = RecordingHost()
    own = host.submit()  # the client's own session, opened and in use
    host.finish(host.opens[0], SID1)
    call = _fixed(host, SID2, 7)
    assert host.sent[-1] is call and (call.sid, call.seq) == (SID2, 7)
    for code in (RC.SESSION_SEQ_GAP, RC.WAIT_QUORUM_ACK_TIMEOUT):
        assert host.sessions.on_failure(call, code, "r", NOW)
        assert host.retried[-1] is call and (call.sid, call.seq) == (SID2, 7)
    assert call.unsure  # an indeterminate answer came: it may be stored
    assert host.sessions.sid == SID1 and own.sid == SID1  # the client's own session is untouched


def test_fixed_stamp_of_a_forgotten_session_fails_indeterminate() -> None:
    for code in (RC.SESSION_EXPIRED, RC.SESSION_SEQ_TOO_OLD, RC.SESSION_SEQ_INVALID):
        host = RecordingHost()
        call = _fixed(host, SID2, 1)
        assert host.sessions.on_failure(call, code, "gone", NOW)
        exc = call.future.exception()
        assert isinstance(exc, DLedgerIndeterminateError) and exc.code == code
        assert call.sid == SID2 and host.sent == [call]  # failed, not moved to a new session
        assert host.sessions.sid == 0 and not host.opens
