"""handleVote as a decision table: one row per VoteResult (and per ordering rule).

Sources: docs/election.md "Decision tables"; DLedgerLeaderElector.handleVote in
openmessaging/dledger.

Base state of the voter (unless a row overrides it): self n1 of {n0, n1, n2}, currTerm 5, no
vote, no leader, ledger end index 10 in term 4. Base request: candidate n0, term 5, ledger end
index 10 in term 4 (an equally long log).
"""

from dataclasses import replace

import pytest

from ipc.codes import ResponseCode, VoteResult
from ipc.protocol import VoteRequest
from node.core.election_types import ElectorView
from node.core.vote import decide_vote

BASE_VIEW = ElectorView(self_id="n1", group="g", peers=frozenset({"n0", "n1", "n2"}), term=5,
                        voted_for=None, leader_id=None, ledger_end_index=10, ledger_end_term=4)
BASE_REQ = VoteRequest(group="g", remote_id="n1", leader_id="n0", term=5, ledger_end_term=4,
                       ledger_end_index=10)

R = VoteResult
ROWS = [
    # (id, view overrides, request overrides, is_self, result, reply term, grant, candidate term)
    # DLedgerServer.handleVote PreConditions: wrong group -> UNKNOWN_GROUP, vote UNKNOWN.
    ("unknown-group", {}, {"group": "other"}, False, R.UNKNOWN, 5, None, None),
    # ... request addressed to another node id -> UNKNOWN_MEMBER.
    ("not-addressed-to-me", {}, {"remote_id": "n2"}, False, R.UNKNOWN, 5, None, None),
    # unknown member -> REJECT_UNKNOWN_LEADER (DLedger's isPeerMember).
    ("REJECT_UNKNOWN_LEADER", {}, {"leader_id": "n9"}, False,
     R.REJECT_UNKNOWN_LEADER, 5, None, None),
    # a request carrying my own id from someone else -> REJECT_UNEXPECTED_LEADER.
    ("REJECT_UNEXPECTED_LEADER", {}, {"leader_id": "n1"}, False,
     R.REJECT_UNEXPECTED_LEADER, 5, None, None),
    # ... but my own vote for myself (voteForQuorumResponses, self=true) goes through.
    ("self-vote-ACCEPT", {}, {"leader_id": "n1"}, True, R.ACCEPT, 5, "n1", None),
    # request.ledgerEndTerm < mine -> REJECT_EXPIRED_LEDGER_TERM.
    ("REJECT_EXPIRED_LEDGER_TERM", {}, {"ledger_end_term": 3, "ledger_end_index": 99}, False,
     R.REJECT_EXPIRED_LEDGER_TERM, 5, None, None),
    # Order: the ledger check comes BEFORE the term check, so a bigger term does not make me
    # adopt it when the candidate's log is behind (DLedger arbitrates by LedgerEndTerm first).
    ("ledger-before-term", {}, {"term": 9, "ledger_end_term": 3}, False,
     R.REJECT_EXPIRED_LEDGER_TERM, 5, None, None),
    # equal ledgerEndTerm and smaller index -> REJECT_SMALL_LEDGER_END_INDEX.
    ("REJECT_SMALL_LEDGER_END_INDEX", {}, {"ledger_end_index": 9}, False,
     R.REJECT_SMALL_LEDGER_END_INDEX, 5, None, None),
    # request.term < mine -> REJECT_EXPIRED_VOTE_TERM, with my term to catch up to.
    ("REJECT_EXPIRED_VOTE_TERM", {}, {"term": 4}, False, R.REJECT_EXPIRED_VOTE_TERM, 5, None, None),
    # same term, voted for someone else, no leader known -> REJECT_ALREADY_VOTED.
    ("REJECT_ALREADY_VOTED", {"voted_for": "n2"}, {}, False, R.REJECT_ALREADY_VOTED, 5, None, None),
    # ... and a leader known -> REJECT_ALREADY_HAS_LEADER.
    ("REJECT_ALREADY_HAS_LEADER", {"voted_for": "n2", "leader_id": "n2"}, {}, False,
     R.REJECT_ALREADY_HAS_LEADER, 5, None, None),
    # DLedger's handleVote, "repeat just let it go": a repeated request from my candidate is granted.
    ("repeat-vote-ACCEPT", {"voted_for": "n0"}, {}, False, R.ACCEPT, 5, "n0", None),
    # request.term > mine -> become candidate in that term (needIncreaseTerm...),
    # REJECT_TERM_NOT_READY; the reply carries the term I am entering.
    ("REJECT_TERM_NOT_READY", {"voted_for": "n2", "leader_id": "n2"}, {"term": 6}, False,
     R.REJECT_TERM_NOT_READY, 6, None, 6),
    # request.term < my ledgerEndTerm -> REJECT_TERM_SMALL_THAN_LEDGER, answered with
    # my ledger end term (a state with currTerm < ledgerEndTerm, e.g. a lagging term file).
    ("REJECT_TERM_SMALL_THAN_LEDGER", {"term": 3}, {"term": 3}, False,
     R.REJECT_TERM_SMALL_THAN_LEDGER, 4, None, None),
    # taking leadership and my log at least as long -> REJECT_TAKING_LEADERSHIP.
    ("REJECT_TAKING_LEADERSHIP", {"taking_leadership": True}, {}, False,
     R.REJECT_TAKING_LEADERSHIP, 5, None, None),
    # ... a candidate with a longer log (same end term) still gets my vote.
    ("taking-leadership-longer-log-ACCEPT", {"taking_leadership": True},
     {"ledger_end_index": 11}, False, R.ACCEPT, 5, "n0", None),
    # ... and the node taking leadership votes for itself.
    ("taking-leadership-self-ACCEPT", {"taking_leadership": True}, {"leader_id": "n1"}, True,
     R.ACCEPT, 5, "n1", None),
    # "else record votedFor (durably, before answering) and ACCEPT".
    ("ACCEPT", {}, {}, False, R.ACCEPT, 5, "n0", None),
    ("ACCEPT-longer-log-newer-term", {}, {"ledger_end_term": 5, "ledger_end_index": 0}, False,
     R.ACCEPT, 5, "n0", None),
    ("ACCEPT-empty-logs", {"ledger_end_index": -1, "ledger_end_term": -1},
     {"ledger_end_index": -1, "ledger_end_term": -1}, False, R.ACCEPT, 5, "n0", None),
]


@pytest.mark.parametrize("view_kw,req_kw,is_self,result,reply_term,grant,cand_term",
                         [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_handle_vote_table(view_kw, req_kw, is_self, result, reply_term, grant, cand_term):
    d = decide_vote(replace(BASE_VIEW, **view_kw), replace(BASE_REQ, **req_kw), is_self=is_self)
    assert d.result == result
    assert d.reply_term == reply_term
    assert d.grant_to == grant
    assert d.candidate_term == cand_term
    # Only ACCEPT records a vote; only TERM_NOT_READY changes the term.
    assert (d.grant_to is not None) == (result == R.ACCEPT)
    assert (d.candidate_term is not None) == (result == R.REJECT_TERM_NOT_READY)


def test_every_vote_result_has_a_row():
    assert {r[4] for r in ROWS} == set(VoteResult)


def test_envelope_codes():
    assert decide_vote(BASE_VIEW, replace(BASE_REQ, group="x")).code == ResponseCode.UNKNOWN_GROUP
    assert decide_vote(BASE_VIEW, replace(BASE_REQ, remote_id="n0")).code == \
        ResponseCode.UNKNOWN_MEMBER
    assert decide_vote(BASE_VIEW, BASE_REQ).code == ResponseCode.SUCCESS


def test_one_vote_per_term_exhaustively():
    """Whatever the request, a voter that already voted in term T never grants T to another."""
    for cand in ("n0", "n2"):
        for term in (4, 5, 6):
            for let, lei in ((3, 50), (4, 9), (4, 10), (4, 11), (5, 0)):
                view = replace(BASE_VIEW, voted_for="n2" if cand == "n0" else "n0")
                d = decide_vote(view, replace(BASE_REQ, leader_id=cand, term=term,
                                              ledger_end_term=let, ledger_end_index=lei))
                assert d.grant_to is None  # term 5: voted; 6: NOT_READY first; 4: expired
