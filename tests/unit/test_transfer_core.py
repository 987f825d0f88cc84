"""Leadership transfer and preferred-leader decisions (node/core/transfer.py), row by row."""

import pytest

from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.transfer import (
    LEADER_GRACE_MS,
    PREFERRED_CHECK_MS,
    Answer,
    PeerView,
    SendTakeLeadership,
    SetTransferee,
    TransferConfig,
    TransferCore,
    TransferView,
    refuse,
)

CFG = TransferConfig("n0", ("n0", "n1", "n2"), timeout_ms=5000)
NOW = 100_000  # well past the new-leader grace period
UP = PeerView(alive=True, last_ack_ms=NOW - 10, match_term=3, match_index=50)
BEHIND = PeerView(alive=True, last_ack_ms=NOW - 10, match_term=3, match_index=40)
DEAD = PeerView(alive=False, last_ack_ms=NOW - 10_000, match_term=3, match_index=50)


def view(role=Role.LEADER, term=3, leader="n0", end=50, since=0, **peers):
    ps = {"n1": UP, "n2": UP}
    ps.update(peers)
    return TransferView(role, term, leader, end, since, ps)


@pytest.mark.parametrize("v, transferring, target, term, code", [
    (view(role=Role.FOLLOWER, leader="n1"), False, "n1", -1, RC.NOT_LEADER),
    (view(), False, "n1", 2, RC.EXPIRED_TERM),  # asked for another term
    (view(), False, "n9", -1, RC.UNKNOWN_MEMBER),
    (view(), False, "n0", -1, RC.SUCCESS),  # transfer to self: already there
    (view(), True, "n1", -1, RC.LEADER_TRANSFERRING),
    (view(n1=DEAD), False, "n1", -1, RC.TAKE_LEADERSHIP_FAILED),  # not reachable: fail fast
    (view(n1=PeerView(True, NOW - 9000, 3, 50)), False, "n1", -1, RC.TAKE_LEADERSHIP_FAILED),
    (view(n1=DEAD, since=NOW - LEADER_GRACE_MS + 1), False, "n1", -1, None),  # grace: try
    (view(), False, "n1", 3, None),
    (view(n1=BEHIND), False, "n1", -1, None),  # behind is fine: it gets time to catch up
])
def test_refuse(v, transferring, target, term, code):
    assert refuse(CFG, v, transferring, target, term, NOW) == code


def test_refused_request_is_answered_at_once_and_sets_nothing():
    tc = TransferCore(CFG)
    assert tc.request("n9", b"id", 7, -1, view(), NOW) == [Answer("n9", RC.UNKNOWN_MEMBER, b"id", 7)]
    assert tc.transfer is None


def test_caught_up_target_gets_take_leadership_then_success_when_it_leads():
    tc = TransferCore(CFG)
    assert tc.request("n1", b"id", 7, -1, view(n1=BEHIND), NOW) == [SetTransferee("n1")]
    assert tc.next_check_ms(NOW) == NOW  # drive it at once
    assert tc.tick(view(n1=BEHIND), NOW + 1) == []  # not caught up yet: wait
    assert tc.next_check_ms(NOW + 2) == NOW + 51  # and look again soon
    (send,) = tc.tick(view(), NOW + 100)
    assert send == SendTakeLeadership("n1", 3, send.request_id) and send.request_id > 0
    assert tc.tick(view(), NOW + 150) == []  # sent once only
    # deposed by the target's election (candidate, no leader yet): wait for the outcome
    assert tc.tick(view(role=Role.CANDIDATE, term=4, leader=None), NOW + 200) == []
    # following the target: success, transferee cleared before the answer
    assert tc.tick(view(role=Role.FOLLOWER, term=4, leader="n1"), NOW + 250) == [
        SetTransferee(None), Answer("n1", RC.SUCCESS, b"id", 7)]
    assert tc.transfer is None


def test_timeout_fails_the_transfer():
    tc = TransferCore(CFG)
    tc.request("n1", b"id", 7, -1, view(n1=BEHIND), NOW)
    answering = PeerView(True, NOW + 4900, 3, 40)  # alive, answering, never caught up
    assert tc.tick(view(n1=answering), NOW + 4999) == []
    ended = tc.tick(view(n1=answering), NOW + 5000)
    assert ended == [SetTransferee(None), Answer("n1", RC.TAKE_LEADERSHIP_FAILED, b"id", 7)]
    # the refusal says why, with the figures an operator acts on
    assert ended[-1].why == ("n1 did not catch up within 5000 ms (it holds up to entry 40, this "
                             "leader's log ends at 50)"), ended[-1].why


def test_deposed_waiting_past_the_deadline_fails():
    tc = TransferCore(CFG)
    tc.request("n1", b"id", 7, -1, view(), NOW)
    tc.tick(view(), NOW + 1)
    ended = tc.tick(view(role=Role.CANDIDATE, term=4, leader=None), NOW + 5000)[-1]
    assert ended.code == RC.TAKE_LEADERSHIP_FAILED
    assert ended.why == "this node lost leadership (term 4, no leader yet) before n1 took it"


def test_target_dies_during_transfer_fails():
    tc = TransferCore(CFG)
    tc.request("n1", None, 0, -1, view(n1=BEHIND), NOW)
    ended = tc.tick(view(n1=DEAD), NOW + 50)[-1]
    assert ended == Answer("n1", RC.TAKE_LEADERSHIP_FAILED, None, 0)
    assert ended.why == "n1 stopped answering"


def test_leadership_lost_to_another_member_fails():
    tc = TransferCore(CFG)
    tc.request("n1", b"id", 7, -1, view(n1=BEHIND), NOW)
    ended = tc.tick(view(role=Role.FOLLOWER, term=4, leader="n2"), NOW + 50)[-1]
    assert ended.code == RC.TAKE_LEADERSHIP_FAILED
    assert ended.why == "n2 leads term 4, not n1"


def test_target_refusing_take_leadership_fails_and_stale_answers_are_ignored():
    tc = TransferCore(CFG)
    tc.request("n1", b"id", 7, -1, view(), NOW)
    (send,) = tc.tick(view(), NOW + 1)
    assert tc.on_take_response(send.request_id + 1, int(RC.TAKE_LEADERSHIP_FAILED)) == []
    assert tc.on_take_response(send.request_id, int(RC.SUCCESS)) == []  # the election decides
    ended = tc.on_take_response(send.request_id, int(RC.TAKE_LEADERSHIP_FAILED))
    assert ended == [SetTransferee(None), Answer("n1", RC.TAKE_LEADERSHIP_FAILED, b"id", 7)]
    assert ended[-1].why.startswith("n1 could not take leadership (TAKE_LEADERSHIP_FAILED")


def test_take_leadership_that_cannot_be_sent_fails():
    tc = TransferCore(CFG)
    tc.request("n1", b"id", 7, -1, view(), NOW)
    tc.tick(view(), NOW + 1)
    assert tc.on_send_failed()[-1].code == RC.TAKE_LEADERSHIP_FAILED
    assert tc.on_send_failed() == []


def test_preferred_leader_gets_leadership_when_reachable_and_caught_up():
    cfg = TransferConfig("n0", ("n0", "n1", "n2"), preferred=("n2",))
    tc = TransferCore(cfg)
    assert tc.tick(view(n2=BEHIND), NOW) == []  # not caught up: check again in a second
    assert tc.next_check_ms(NOW) == NOW + PREFERRED_CHECK_MS
    assert tc.tick(view(), NOW + 10) == []  # rate limited
    assert tc.tick(view(), NOW + PREFERRED_CHECK_MS) == [SetTransferee("n2")]
    assert tc.transfer.ident is None


@pytest.mark.parametrize("cfg, v", [
    (TransferConfig("n0", ("n0", "n1", "n2"), preferred=("n0", "n2")), view()),  # I am preferred
    (TransferConfig("n0", ("n0", "n1", "n2"), preferred=("n2",)), view(n2=DEAD)),
    (TransferConfig("n0", ("n0", "n1", "n2"), preferred=("n2",)),
     view(role=Role.FOLLOWER, leader="n1")),
    (TransferConfig("n0", ("n0", "n1", "n2")), view()),  # nobody preferred
])
def test_no_preferred_transfer(cfg, v):
    assert TransferCore(cfg).tick(v, NOW) == []
