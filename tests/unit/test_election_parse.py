"""The candidate's vote tally and parse (maintainAsCandidate) as a decision table.

Sources: docs/election.md "Candidate parse" (the parse order) and "Timers and defaults" (the
vote timer); DLedgerLeaderElector.maintainAsCandidate in openmessaging/dledger.
"""

import random

import pytest

from ipc.codes import ParseResult, VoteResult
from node.core.election_types import ElectionConfig
from node.core.vote import VoteTally, next_time_to_request_vote, parse_vote

CFG = ElectionConfig(heartbeat_interval_ms=200, max_heartbeat_leak=3, min_vote_interval_ms=50,
                     max_vote_interval_ms=450)
NOW, COST, TERM = 10_000, 7, 5
V, P = VoteResult, ParseResult
SELF = (V.ACCEPT, TERM)  # the candidate's own vote, counted like any answer
ACC, VOTED, LEADER = (V.ACCEPT, TERM), (V.REJECT_ALREADY_VOTED, TERM), \
    (V.REJECT_ALREADY_HAS_LEADER, TERM)
NR, BIG, SMALL = (V.REJECT_TERM_NOT_READY, TERM), (V.REJECT_SMALL_LEDGER_END_INDEX, TERM), \
    (V.REJECT_EXPIRED_LEDGER_TERM, TERM)
EXPIRED = (V.REJECT_EXPIRED_VOTE_TERM, 9)
SMALLER_THAN_LEDGER = (V.REJECT_TERM_SMALL_THAN_LEDGER, 8)
NOANSWER = (None, -1)
UNKNOWN = (V.UNKNOWN, TERM)

# Timer kinds: "base" = now + cost + [min, max); "+interval" = now + cost + heartbeat; "+max" adds
# maxVoteInterval; "now" = revote at once; None = timer untouched (PASSED).
ROWS = [
    # (id, members, answers, result, timer kind, candidate term)
    # 1. known max term > mine -> WAIT_TO_VOTE_NEXT, candidate with that term.
    ("max-term-EXPIRED_VOTE_TERM", 3, [SELF, EXPIRED, ACC], P.WAIT_TO_VOTE_NEXT, "base", 9),
    ("max-term-TERM_SMALL_THAN_LEDGER", 3, [SELF, SMALLER_THAN_LEDGER, NOANSWER],
     P.WAIT_TO_VOTE_NEXT, "base", 8),
    # ... and it is checked before everything else, even an accepted quorum.
    ("max-term-beats-leader-and-quorum", 5, [SELF, ACC, ACC, LEADER, EXPIRED],
     P.WAIT_TO_VOTE_NEXT, "base", 9),
    # 2. already has leader -> WAIT_TO_REVOTE, now + cost + one heartbeat interval (its next
    #    beat makes me a follower; if it is dead, that voter times out about as soon).
    ("already-has-leader", 3, [SELF, LEADER, NOANSWER], P.WAIT_TO_REVOTE, "+interval", None),
    ("already-has-leader-beats-quorum", 3, [SELF, ACC, LEADER], P.WAIT_TO_REVOTE, "+interval",
     None),
    # 3. valid < quorum -> WAIT_TO_REVOTE (same term next time: no term inflation).
    ("valid-below-quorum", 3, [SELF, NOANSWER, NOANSWER], P.WAIT_TO_REVOTE, "base", None),
    ("UNKNOWN-is-not-valid", 3, [SELF, UNKNOWN, NOANSWER], P.WAIT_TO_REVOTE, "base", None),
    # 4. valid - biggerLedger < quorum -> WAIT_TO_REVOTE, timer + maxVoteInterval.
    ("bigger-ledgers", 3, [SELF, BIG, SMALL], P.WAIT_TO_REVOTE, "+max", None),
    # 5. accepted is a quorum -> PASSED.
    ("PASSED", 3, [SELF, ACC, NOANSWER], P.PASSED, None, None),
    ("PASSED-with-one-bigger-ledger", 5, [SELF, ACC, ACC, BIG, NOANSWER], P.PASSED, None, None),
    ("PASSED-single-node", 1, [SELF], P.PASSED, None, None),
    # 6. accepted + notReady is a quorum -> REVOTE_IMMEDIATELY.
    ("REVOTE_IMMEDIATELY", 3, [SELF, NR, NOANSWER], P.REVOTE_IMMEDIATELY, "now", None),
    # 7. else -> WAIT_TO_VOTE_NEXT (split vote: next round in a new term).
    ("split-vote", 3, [(V.REJECT_ALREADY_VOTED, TERM), VOTED, NOANSWER], P.WAIT_TO_VOTE_NEXT,
     "base", None),
    ("split-vote-5", 5, [SELF, ACC, VOTED, VOTED, (V.REJECT_TAKING_LEADERSHIP, TERM)],
     P.WAIT_TO_VOTE_NEXT, "base", None),
]


def _tally(answers):
    t = VoteTally(TERM)
    for result, term in answers:
        t.add(result, term)
    return t


def _expected_timer(kind, rng):
    base = next_time_to_request_vote(NOW, COST, CFG, rng)
    return {"base": base, "+interval": NOW + COST + 200, "+max": base + 450}[kind]


@pytest.mark.parametrize("n,answers,result,timer,cand_term", [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_parse_vote_table(n, answers, result, timer, cand_term):
    p = parse_vote(_tally(answers), n, NOW, COST, CFG, random.Random(3))
    assert p.result == result
    assert p.candidate_term == cand_term
    if timer is None:
        assert p.next_time_ms is None
    elif timer == "now":
        assert p.next_time_ms == NOW
    else:
        assert p.next_time_ms == _expected_timer(timer, random.Random(3))


def test_every_parse_result_has_a_row():
    assert {r[3] for r in ROWS} == set(ParseResult)


def test_vote_timer_range():
    # now + lastVoteCost + random(minVoteInterval, maxVoteInterval).
    rng = random.Random(11)
    times = {next_time_to_request_vote(NOW, COST, CFG, rng) - NOW - COST for _ in range(3000)}
    assert min(times) == 50 and max(times) == 449
    # taking leadership: the short take-leadership interval, no cost added
    take = {next_time_to_request_vote(NOW, 500, CFG, rng, True) - NOW for _ in range(1000)}
    assert min(take) >= 30 and max(take) < 100


def test_tally_mapping_and_latch():
    t = VoteTally(TERM)
    assert t.known_max_term == TERM
    t.add(V.ACCEPT)
    assert (t.all_num, t.valid_num, t.accepted_num) == (1, 1, 1)
    assert not t.done(3)
    t.add(V.REJECT_TERM_NOT_READY)
    assert t.done(3)  # accepted + notReady quorum releases voteLatch
    t2 = VoteTally(TERM)
    t2.add(V.REJECT_ALREADY_HAS_LEADER)
    assert t2.done(5)  # a leader exists: stop waiting
    t3 = VoteTally(TERM)
    for r in (V.REJECT_EXPIRED_LEDGER_TERM, V.REJECT_SMALL_LEDGER_END_INDEX, V.UNKNOWN, None):
        t3.add(r)
    assert (t3.all_num, t3.valid_num, t3.bigger_ledger_num) == (4, 2, 2)
    assert not t3.done(5)
    t3.add(V.REJECT_ALREADY_VOTED)
    assert t3.done(5)  # everybody answered
    t4 = VoteTally(TERM)
    t4.add(V.REJECT_EXPIRED_VOTE_TERM, 3)  # an older term is not news
    assert t4.known_max_term == TERM
