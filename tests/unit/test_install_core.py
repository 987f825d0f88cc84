"""Install snapshot decisions as data (node/core/install.py, the INSTALL state of
node/core/replication.DispatcherCore, and FollowerCore's install rules): probe, window,
rewinds on refusals, stale refusals ignored, timeouts resume, and what the follower does with
its log once the snapshot is installed."""

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block.shared_state import NO_SLOT, MemberView
from node.core.follower import FollowerCore, ForwardInstall, InstallReply, SetCommitted, StoreReset
from node.core.install import InstallConfig, InstallSender, SendChunk
from node.core.replication import (
    Append,
    Compare,
    DispatcherCore,
    InstallChunk,
    NeedSnapshot,
    PushState,
    Truncate,
    decide_compare,
)
from node.store.memory_store import MemoryStore

CFG = InstallConfig(chunk_bytes=10, window=2, chunk_timeout_ms=100)


def sender(size: int = 35) -> InstallSender:
    return InstallSender(50, 3, size, CFG)


def send(s: InstallSender, now: int = 0) -> SendChunk | None:
    c = s.next_action(now)
    if c is not None:
        s.sent(c, now)
    return c


# ---- InstallSender ----------------------------------------------------------------------------
def test_probe_first_then_a_window_of_chunks_from_where_the_follower_is():
    s = sender()
    assert send(s) == SendChunk(0, 0)
    assert send(s) is None  # nothing until the probe is answered
    s.on_response(0, True, 20, False, 1)  # the follower resumes a partial install at byte 20
    assert send(s) == SendChunk(20, 10)
    assert send(s) == SendChunk(30, 5)  # the last chunk is short
    assert send(s) is None  # the end: nothing more to send
    s.on_response(20, True, 30, False, 2)
    assert not s.on_response(30, True, 35, False, 3)
    assert s.on_response(30, True, 35, True, 4) and s.done and send(s) is None


def test_the_window_bounds_unanswered_chunks():
    s = sender(100)
    send(s)
    s.on_response(0, True, 0, False, 1)
    assert [send(s), send(s), send(s)] == [SendChunk(0, 10), SendChunk(10, 10), None]
    s.on_response(0, True, 10, False, 2)
    assert send(s) == SendChunk(20, 10)


def test_a_refusal_rewinds_once_and_refusals_of_chunks_sent_before_it_are_ignored():
    s = sender(100)
    send(s)
    s.on_response(0, True, 0, False, 1)
    send(s), send(s)  # 0 and 10 in flight; chunk 0 is lost on the wire
    s.on_response(10, False, 0, False, 2)  # refused: the follower expects 0
    assert s.rewinds == 1 and send(s) == SendChunk(0, 10)
    s.on_response(10, False, 0, False, 3)  # a duplicate of the old refusal: stale, ignored
    assert s.rewinds == 1 and send(s) == SendChunk(10, 10)


def test_a_timeout_resumes_with_a_probe_never_from_byte_0_by_itself():
    s = sender(100)
    send(s)
    s.on_response(0, True, 0, False, 1)
    send(s, 2), send(s, 2)
    s.on_response(0, True, 10, False, 3)
    assert send(s, 50) == SendChunk(20, 10) and send(s, 50) is None  # window full (10, 20)
    assert s.next_deadline() == 102
    assert s.next_action(102) == SendChunk(0, 0)  # the oldest (10) timed out: ask where it is
    s.sent(SendChunk(0, 0), 102)
    s.on_response(0, True, 20, False, 103)  # it had both
    assert send(s, 104) == SendChunk(20, 10)


def test_everything_received_but_not_installed_asks_again_after_a_timeout_not_in_a_spin():
    s = sender(20)
    send(s)
    s.on_response(0, True, 0, False, 1)
    send(s, 1), send(s, 1)
    s.on_response(0, True, 10, False, 2)
    s.on_response(10, True, 20, False, 2)  # all there, not installed (the follower failed)
    assert s.next_action(3) is None and s.next_deadline() == 102
    assert s.next_action(102) == SendChunk(0, 0)


@pytest.mark.parametrize("received", [-1, 36, 10**12])
def test_nonsense_progress_from_the_follower_makes_the_sender_probe_again(received):
    s = sender()
    send(s)
    s.on_response(0, True, received, False, 1)
    assert s.received == -1 and send(s, 2) == SendChunk(0, 0)


def test_an_empty_snapshot_is_installed_by_the_probe_itself():
    s = InstallSender(0, 1, 0, CFG)
    assert send(s) == SendChunk(0, 0)
    assert s.on_response(0, True, 0, True, 1)


# ---- DispatcherCore: INSTALL --------------------------------------------------------------------
def terms(begin: int, end: int, term: int = 2):
    def term_at(i: int) -> int:
        assert begin <= i <= end, i
        return term
    return term_at


def test_a_follower_behind_the_leaders_log_begin_gets_the_snapshot_then_compares_at_its_position():
    d = DispatcherCore()
    d.become_leader(2, 200)
    ta = terms(150, 200)
    assert d.next_action(0, 150, 200, 200, ta) == Compare(200, 2)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 0, end_index=-1, first_index=200)  # it is empty
    # compare from the start of the leader's log (begin 150): 149 is gone, and not the snapshot's
    a = d.next_action(0, 150, 200, 200, ta, snapshot=(160, 2))
    assert a == NeedSnapshot(149)
    d.start_install(160, 2, 25, CFG)
    assert d.state == PushState.INSTALL
    assert d.next_action(0, 150, 200, 200, ta) == InstallChunk(0, 0)
    d.sent(InstallChunk(0, 0), 0)
    d.on_install_response(0, RC.SUCCESS, 1, received=0)
    for off in (0, 10):
        assert d.next_action(1, 150, 200, 200, ta) == InstallChunk(off, 10)
        d.sent(InstallChunk(off, 10), 1)
    d.on_install_response(0, RC.SUCCESS, 2, received=10)
    d.on_install_response(10, RC.SUCCESS, 2, received=20)
    assert d.next_action(3, 150, 200, 200, ta) == InstallChunk(20, 5)
    d.sent(InstallChunk(20, 5), 3)
    d.on_install_response(20, RC.SUCCESS, 4, received=25, installed=True)
    assert d.state == PushState.COMPARE and d.installed == (160, 2)
    assert d.next_action(5, 150, 200, 200, ta) == Compare(160, 2)


def test_after_an_install_the_snapshot_position_is_known_even_when_the_leaders_log_begins_after_it():
    d = DispatcherCore()
    d.become_leader(4, 300)
    d.start_install(250, 3, 0, CFG)
    d.next_action(0, 251, 300, 300, terms(251, 300))
    d.sent(InstallChunk(0, 0), 0)
    d.on_install_response(0, RC.SUCCESS, 1, received=0, installed=True)
    # the leader's begin is 251: 250 is only known as the snapshot's last entry (term 3)
    assert d.next_action(2, 251, 300, 300, terms(251, 300)) == Compare(250, 3)
    d.on_response("COMPARE", RC.SUCCESS, 3, first_index=250)
    assert d.next_action(4, 251, 300, 300, terms(251, 300)) == Truncate(251)
    d.on_response("TRUNCATE", RC.SUCCESS, 5, first_index=251)
    assert d.next_action(6, 251, 300, 300, terms(251, 300)) == Append(251, 50)


def test_the_leaders_own_snapshot_position_answers_a_compare_below_its_log_without_an_install():
    d = DispatcherCore()
    d.become_leader(2, 200)
    d.write_index = 161  # e.g. the follower said its end is 160
    assert d.next_action(0, 161, 200, 200, terms(161, 200), snapshot=(160, 2)) == Compare(160, 2)


@pytest.mark.parametrize("code", [RC.INCONSISTENT_TERM, RC.NOT_FOLLOWER, RC.STATE_MACHINE_ERROR])
def test_an_install_answered_by_a_node_not_following_us_starts_over_after_a_backoff(code):
    d = DispatcherCore()
    d.become_leader(2, 200)
    d.start_install(160, 2, 25, CFG)
    d.sent(d.next_action(0, 150, 200, 200, terms(150, 200)), 0)
    d.on_install_response(0, code, 1)
    assert d.state == PushState.COMPARE and d.install is None and d.not_before_ms > 1


def test_stepping_down_forgets_the_install():
    d = DispatcherCore()
    d.become_leader(2, 200)
    d.start_install(160, 2, 25, CFG)
    d.step_down()
    assert d.install is None and d.state == PushState.IDLE
    d.on_install_response(0, RC.SUCCESS, 1, received=25, installed=True)
    assert d.installed is None


# ---- the follower ------------------------------------------------------------------------------
def follower_view(term: int = 3, leader_slot: int = 0) -> MemberView:
    return MemberView(Role.FOLLOWER, term, leader_slot, NO_SLOT, NO_SLOT, 0, 0, 0)


def store_of(terms_: list[int]) -> MemoryStore:
    s = MemoryStore()
    for i, t in enumerate(terms_):
        s.append_leader(b"e%d" % i, t)
    return s


def install_req(term: int = 3, leader: str = "n0") -> P.InstallRequest:
    return P.InstallRequest("g", "n1", leader, term, b"{}", 0, b"")


def core() -> FollowerCore:
    return FollowerCore(["n0", "n1", "n2"], 100, 1000)


@pytest.mark.parametrize("req,code", [
    (install_req(term=2), RC.INCONSISTENT_TERM),
    (install_req(leader="n2"), RC.INCONSISTENT_LEADER),
])
def test_an_install_from_anyone_but_this_terms_leader_is_refused(req, code):
    out = core().on_install(b"id", req, follower_view())
    assert out == [InstallReply(b"id", req, code, 3)]


def test_an_install_from_the_leader_is_forwarded_to_the_applier():
    req = install_req()
    assert core().on_install(b"id", req, follower_view()) == [ForwardInstall(b"id", req)]


def test_installed_snapshot_resets_a_log_that_does_not_hold_its_last_entry():
    c, s, req = core(), store_of([1, 1, 2]), install_req()
    out = c.snapshot_installed(b"id", req, 10, 3, follower_view(), s)
    assert out == [StoreReset(10, 3, b"{}"), InstallReply(b"id", req, RC.SUCCESS, 3, installed=True)]


def test_installed_snapshot_keeps_a_log_that_holds_its_last_entry_and_commits_it():
    c, s, req = core(), store_of([1, 1, 2, 2, 3]), install_req()
    c.sync(follower_view())
    out = c.snapshot_installed(b"id", req, 3, 2, follower_view(), s)
    assert out == [SetCommitted(3), InstallReply(b"id", req, RC.SUCCESS, 3, installed=True)]
    assert c.verified_end == 3


def test_installed_snapshot_with_a_different_term_at_its_index_resets_the_log():
    c, s, req = core(), store_of([1, 1, 2, 2, 2]), install_req()  # an old leader's tail
    out = c.snapshot_installed(b"id", req, 3, 3, follower_view(), s)
    assert out[0] == StoreReset(3, 3, b"{}")  # with the meta: it carries the configuration


def test_installed_snapshot_already_committed_here_changes_nothing():
    c, s, req = core(), store_of([1, 1, 2]), install_req()
    s.set_committed_index(2)
    out = c.snapshot_installed(b"id", req, 1, 1, follower_view(), s)
    assert out == [InstallReply(b"id", req, RC.SUCCESS, 3, installed=True)]


def test_after_a_reset_the_log_base_answers_the_leaders_compare_and_the_next_append_attaches():
    s = store_of([1, 1, 2])
    s.reset_to(10, 3)
    assert decide_compare(s, 10, 3).code == RC.SUCCESS
    assert decide_compare(s, 10, 2).code == RC.INCONSISTENT_STATE
    assert decide_compare(s, 9, 3).code == RC.INCONSISTENT_STATE  # inside the snapshot: unknown
    c = core()
    assert c.reset_done(10, follower_view()) == [] and c.verified_end == 10


def test_a_refused_compare_at_the_snapshot_position_below_the_log_begin_becomes_an_install():
    """Found by the simulator (seeds 19, 27): the leader's log begins right after its snapshot
    S; a follower whose log ends before S is compared at S (its term known from the snapshot),
    refuses, is clamped back to S... for ever. The second time it must be an install."""
    d = DispatcherCore()
    d.become_leader(3, 300)
    ta = terms(251, 300)
    d.write_index = 100  # the follower said its log ends at 99
    assert d.next_action(0, 251, 300, 300, ta, snapshot=(250, 2)) == Compare(250, 2)
    d.on_response("COMPARE", RC.INCONSISTENT_STATE, 1, end_index=99, first_index=250)
    assert d.next_action(2, 251, 300, 300, ta, snapshot=(250, 2)) == NeedSnapshot(250)
    d.start_install(250, 2, 0, CFG)
    d.sent(d.next_action(3, 251, 300, 300, ta), 3)
    d.on_install_response(0, RC.SUCCESS, 4, received=0, installed=True)
    assert d.next_action(5, 251, 300, 300, ta, snapshot=(250, 2)) == Compare(250, 2)  # now it holds it
