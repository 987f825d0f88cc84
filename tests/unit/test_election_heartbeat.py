"""Heartbeats as decision tables: handleHeartBeat, the leader's tally/parse, the follower timeout.

Sources: docs/election.md "Decision tables"; DLedger's DLedgerLeaderElector (handleHeartBeat, and
the newer sendHeartbeats: the max-term check first); DLedger issue #325 (a leader steps down on
any higher term).
"""

from dataclasses import replace

import pytest

from ipc.codes import ResponseCode
from ipc.protocol import HeartbeatRequest
from node.core.election_types import ElectionConfig, ElectorView
from node.core.heartbeat import (
    HeartbeatAction,
    HeartbeatOutcome,
    HeartbeatTally,
    decide_heartbeat,
    follower_deadline,
    follower_timed_out,
    parse_heartbeats,
)

CFG = ElectionConfig(heartbeat_interval_ms=200, max_heartbeat_leak=3)
# Follower n1 of {n0, n1, n2} in term 5, following n0.
VIEW = ElectorView(self_id="n1", group="g", peers=frozenset({"n0", "n1", "n2"}), term=5,
                   voted_for="n0", leader_id="n0")
REQ = HeartbeatRequest(group="g", remote_id="n1", leader_id="n0", term=5)
NOW = 1000
C, A = ResponseCode, HeartbeatAction

HANDLE_ROWS = [
    # (id, view overrides, request overrides, code, reply term, action, action term, leader)
    # DLedgerServer PreConditions: other group / addressed to another node.
    ("UNKNOWN_GROUP", {}, {"group": "x"}, C.UNKNOWN_GROUP, 5, A.NONE, None, None),
    ("not-addressed-to-me", {}, {"remote_id": "n2"}, C.UNKNOWN_MEMBER, 5, A.NONE, None, None),
    # "unknown member / my own id -> error codes" (DLedger's first two checks).
    # A sender no configuration here names (added by an entry this log lacks) is a leader like
    # any other: followed in a term at least mine, told my term in an older one.
    ("unknown-sender-followed", {"leader_id": None}, {"leader_id": "n9"}, C.SUCCESS, 5,
     A.BECOME_FOLLOWER, 5, "n9"),
    ("unknown-sender-older-term", {}, {"leader_id": "n9", "term": 4}, C.EXPIRED_TERM, 5, A.NONE,
     None, None),
    ("UNEXPECTED_MEMBER", {}, {"leader_id": "n1"}, C.UNEXPECTED_MEMBER, 5, A.NONE, None, None),
    # "term < mine -> EXPIRED_TERM" (with my term, so the old leader steps down).
    ("EXPIRED_TERM", {}, {"term": 4}, C.EXPIRED_TERM, 5, A.NONE, None, None),
    # "same term and same leader -> refresh lastLeaderHeartBeatTime, SUCCESS".
    ("SUCCESS-refresh", {}, {}, C.SUCCESS, 5, A.REFRESH, None, None),
    # "same term, no leader known -> become follower of the sender, SUCCESS".
    ("SUCCESS-become-follower", {"leader_id": None}, {"leader_id": "n2"}, C.SUCCESS, 5,
     A.BECOME_FOLLOWER, 5, "n2"),
    # "same term, different leader -> INCONSISTENT_LEADER".
    ("INCONSISTENT_LEADER", {}, {"leader_id": "n2"}, C.INCONSISTENT_LEADER, 5, A.NONE, None,
     None),
    # "term > mine -> candidate with that term, needIncreaseTermImmediately,
    # TERM_NOT_READY" (not follower at once: "to make it simple", DLedger's handleHeartBeat).
    ("TERM_NOT_READY", {}, {"term": 7, "leader_id": "n2"}, C.TERM_NOT_READY, 7,
     A.BECOME_CANDIDATE, 7, None),
]


@pytest.mark.parametrize("view_kw,req_kw,code,reply_term,action,term,leader",
                         [r[1:] for r in HANDLE_ROWS], ids=[r[0] for r in HANDLE_ROWS])
def test_handle_heartbeat_table(view_kw, req_kw, code, reply_term, action, term, leader):
    d = decide_heartbeat(replace(VIEW, **view_kw), replace(REQ, **req_kw), NOW)
    assert (d.code, d.reply_term, d.action, d.term, d.leader_id) == \
        (code, reply_term, action, term, leader)
    assert (d.heartbeat_ms == NOW) == (action in (A.REFRESH, A.BECOME_FOLLOWER))


def test_every_heartbeat_code_has_a_row():
    assert {r[3] for r in HANDLE_ROWS} == {
        C.UNKNOWN_GROUP, C.UNKNOWN_MEMBER, C.UNEXPECTED_MEMBER, C.EXPIRED_TERM, C.SUCCESS,
        C.INCONSISTENT_LEADER, C.TERM_NOT_READY}


def test_leader_gets_inconsistent_leader_from_a_peer_claiming_my_term():
    # I am the leader of term 5 (leader_id = me): another "leader" of term 5 is inconsistent.
    me = replace(VIEW, leader_id="n1", voted_for="n1")
    assert decide_heartbeat(me, replace(REQ, leader_id="n2"), NOW).code == C.INCONSISTENT_LEADER



# ----------------------------------------------------------------------------- leader tally

def _tally(codes, term=5):
    t = HeartbeatTally(term)
    for code, resp_term in codes:
        t.add(code, resp_term)
    return t


HO = HeartbeatOutcome
OK, NR, EXP, INC = (C.SUCCESS, 5), (C.TERM_NOT_READY, 5), (C.EXPIRED_TERM, 8), \
    (C.INCONSISTENT_LEADER, 5)
NONE = (None, -1)  # no answer / network error: the peer is marked not alive

PARSE_ROWS = [
    # (id, member count, answers (leader counts itself), last succ ms, outcome, step-down term)
    # DLedger #325: a higher term anywhere -> candidate with it, even with a SUCCESS quorum.
    ("higher-term-beats-quorum", 3, [OK, EXP], NOW, HO.STEP_DOWN_HIGHER_TERM, 8),
    ("higher-term", 5, [EXP, NONE, NONE, NONE], NOW, HO.STEP_DOWN_HIGHER_TERM, 8),
    # "a quorum of SUCCESS -> record lastSuccHeartBeatTime".
    ("QUORUM", 3, [OK, NONE], NOW - 5000, HO.QUORUM, None),
    ("QUORUM-5", 5, [OK, OK, INC, NONE], NOW - 5000, HO.QUORUM, None),
    # "SUCCESS+NOT_READY is a quorum -> send the next heartbeat immediately".
    ("RESEND_NOW", 3, [NR, NONE], NOW, HO.RESEND_NOW, None),
    ("RESEND_NOW-over-inconsistent", 5, [OK, NR, INC, NONE], NOW, HO.RESEND_NOW, None),
    # "INCONSISTENT_LEADER -> candidate" (same term).
    ("INCONSISTENT_LEADER", 3, [INC, NONE], NOW, HO.STEP_DOWN_INCONSISTENT_LEADER, 5),
    # "no quorum of SUCCESS for maxHeartBeatLeak x interval -> step down".
    ("lease-expired", 3, [NONE, NONE], NOW - 601, HO.STEP_DOWN_LEASE_EXPIRED, 5),
    ("lease-not-yet-expired", 3, [NONE, NONE], NOW - 600, HO.NO_QUORUM_YET, None),
    # A stale EXPIRED_TERM (not above my term) is not a reason to step down.
    ("expired-term-not-higher", 3, [(C.EXPIRED_TERM, 5), NONE], NOW, HO.NO_QUORUM_YET, None),
]


@pytest.mark.parametrize("n,answers,last_succ,outcome,term", [r[1:] for r in PARSE_ROWS],
                         ids=[r[0] for r in PARSE_ROWS])
def test_parse_heartbeats_table(n, answers, last_succ, outcome, term):
    p = parse_heartbeats(_tally(answers), n, NOW, last_succ, CFG)
    assert (p.outcome, p.term) == (outcome, term)


def test_every_outcome_has_a_row():
    assert {r[4] for r in PARSE_ROWS} == set(HeartbeatOutcome)


def test_tally_counts_and_done():
    t = HeartbeatTally(5)
    assert (t.all_num, t.succ_num) == (1, 1)  # the leader counts itself
    assert not t.done(3)
    t.add(C.TERM_NOT_READY, 5)
    assert t.done(3)  # succ + notReady = 2 is a quorum of 3 (beatLatch released)
    t5 = _tally([NONE, NONE], term=5)
    assert not t5.done(5) and t5.all_num == 3
    t5.add(None)
    t5.add(C.NETWORK_ERROR, 5)
    assert t5.done(5) and t5.succ_num == 1  # everybody "answered"
    t.add(C.EXPIRED_TERM, 9)
    t.add(C.EXPIRED_TERM, 7)
    assert t.max_term == 9  # max, not last (DLedger's maxTerm.set is racy)


def test_follower_timeout_boundary():
    # Follower: > maxHeartBeatLeak x interval without a heartbeat -> candidate.
    assert not follower_timed_out(1600, 1000, CFG)
    assert follower_timed_out(1601, 1000, CFG)
    assert follower_deadline(1000, CFG) == 1601
