"""Failover timing rules (docs/election.md "Failover timing"): the pre-vote, the best log standing
first, the short retry after REJECT_ALREADY_HAS_LEADER, the once-per-election fast path and the
default timings.

Every test calls the real functions (node/core/vote.py, node/core/election.py); the cluster
tests below drive real ElectorCore instances through a tiny in-memory bus with a fixed latency.
"""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from ipc.codes import ParseResult, Role, VoteResult
from ipc.protocol import HeartbeatRequest, VoteRequest
from node.core.election import ElectorCore, LedgerEnd, Persist, Reply, Send
from node.core.election_types import ElectionConfig
from node.core.lease import lease_ms
from node.core.vote import VoteTally, log_ahead, next_time_to_request_vote, parse_vote

IDS = ("n0", "n1", "n2")
CFG = ElectionConfig()  # the defaults are what is being tested here
V, P = VoteResult, ParseResult


# ---------------------------------------------------------------------------------- defaults


def test_default_timings_and_lease_invariant():
    assert (CFG.heartbeat_interval_ms, CFG.max_heartbeat_leak) == (100, 4)
    assert CFG.election_timeout_ms == 400
    # the lease the other roles act on stays shorter than the election timeout
    assert 0 < lease_ms(CFG) < CFG.election_timeout_ms
    assert CFG.election_timeout_ms - lease_ms(CFG) == CFG.heartbeat_interval_ms // 2


# ---------------------------------------------------------------------------------- log_ahead


@pytest.mark.parametrize("peer, peer_end, me, my_end, ahead", [
    ("n2", (3, 10), "n1", (3, 9), True),    # longer log in the same term
    ("n2", (4, 1), "n1", (3, 9), True),     # later last term beats a longer log
    ("n2", (3, 9), "n1", (3, 10), False),   # mine is longer
    ("n2", (2, 50), "n1", (3, 1), False),   # mine has the later term
    ("n0", (3, 9), "n1", (3, 9), True),     # equal: member order decides
    ("n2", (3, 9), "n1", (3, 9), False),
    ("zz", (3, 9), "n1", (3, 9), False),    # not a member: never ahead on a tie
])
def test_log_ahead(peer, peer_end, me, my_end, ahead):
    assert log_ahead(peer, peer_end, me, my_end, IDS) is ahead


# ---------------------------------------------------------------------------------- parse rule 7


def _tally(answers, ahead=()):
    t = VoteTally(5)
    for i, r in enumerate(answers):
        t.add(r, 5, i in ahead)
    return t


NOW, COST = 10_000, 7


def test_pre_vote_passed_first_ranked_stands_at_once():
    t = _tally([V.REJECT_ALREADY_VOTED, V.REJECT_ALREADY_VOTED, None])
    p = parse_vote(t, 3, NOW, COST, CFG, random.Random(1), fast_ok=True)
    assert (p.result, p.next_time_ms, p.fast) == (P.WAIT_TO_VOTE_NEXT, NOW, True)


def test_pre_vote_passed_but_someone_ranks_first_waits_timer_plus_interval():
    t = _tally([V.REJECT_ALREADY_VOTED, V.REJECT_ALREADY_VOTED, None], ahead={1})
    p = parse_vote(t, 3, NOW, COST, CFG, random.Random(1), fast_ok=True)
    want = next_time_to_request_vote(NOW, COST, CFG, random.Random(1)) + CFG.heartbeat_interval_ms
    assert (p.result, p.next_time_ms, p.fast) == (P.WAIT_TO_VOTE_NEXT, want, False)


def test_fast_path_not_allowed_falls_back_to_the_random_timer():
    t = _tally([V.REJECT_ALREADY_VOTED, V.REJECT_ALREADY_VOTED, None])
    p = parse_vote(t, 3, NOW, COST, CFG, random.Random(1), fast_ok=False)
    want = next_time_to_request_vote(NOW, COST, CFG, random.Random(1))
    assert (p.result, p.next_time_ms, p.fast) == (P.WAIT_TO_VOTE_NEXT, want, False)


def test_ahead_counts_only_valid_answers():
    t = VoteTally(5)
    t.add(None, -1, True)
    t.add(V.UNKNOWN, 5, True)
    assert t.ahead_num == 0
    t.add(V.REJECT_ALREADY_VOTED, 5, True)
    assert t.ahead_num == 1


# ---------------------------------------------------------------------------------- cluster


class Bus:
    """Real ElectorCores, messages delivered after `latency` ms, ticks at each core's deadline.
    A dead node's sends fail at once (IMMEDIATE dealers), as in the process layer."""

    def __init__(self, ledgers: dict[str, LedgerEnd], latency: int = 1, seed: int = 1) -> None:
        self.cores = {i: ElectorCore(i, IDS, "g", CFG, random.Random(seed + k))
                      for k, i in enumerate(IDS)}
        self.ledger = dict(ledgers)
        self.alive = {i: True for i in IDS}
        self.latency = latency
        self.now = 0
        self.q: list = []
        self.seq = itertools.count()
        self.deadline = {i: 0 for i in IDS}
        self.terms_entered: dict[str, list[int]] = {i: [] for i in IDS}
        self.leaders: list[tuple[int, str, int]] = []  # (at, id, term)

    def apply(self, nid: str, step) -> None:
        for e in step.effects:
            if isinstance(e, Persist):
                self.terms_entered[nid].append(e.term)
            elif isinstance(e, Send):
                if self.alive[e.peer]:
                    heapq.heappush(self.q, (self.now + self.latency, next(self.seq), e.peer,
                                            e.message, nid))
                else:
                    self.apply(nid, self.cores[nid].on_peer_unreachable(e.message.request_id,
                                                                        self.now))
            elif isinstance(e, Reply):
                heapq.heappush(self.q, (self.now + self.latency, next(self.seq), e.token,
                                        e.message, None))
        c = self.cores[nid]
        if c.role == Role.LEADER and (not self.leaders or self.leaders[-1][1:] != (nid, c.term)):
            self.leaders.append((self.now, nid, c.term))
        self.deadline[nid] = step.next_deadline_ms

    def run_until(self, t_end: int) -> None:
        while True:
            live = [i for i in IDS if self.alive[i]]
            t_tick = min(self.deadline[i] for i in live)
            t_msg = self.q[0][0] if self.q else t_end + 1
            t = min(t_tick, t_msg)
            if t > t_end:
                self.now = t_end
                return
            self.now = t
            if t_msg <= t_tick:
                _, _, dst, msg, src = heapq.heappop(self.q)
                if not self.alive[dst]:
                    continue
                c = self.cores[dst]
                if isinstance(msg, (VoteRequest, HeartbeatRequest)):
                    self.apply(dst, c.handle(msg, t, self.ledger[dst], token=src))
                else:
                    self.apply(dst, c.on_response(msg, t))
                self.apply(dst, c.tick(t, self.ledger[dst]))
            else:
                nid = min(live, key=lambda i: self.deadline[i])
                self.apply(nid, self.cores[nid].tick(t, self.ledger[nid]))

    def leader(self) -> tuple[str, int] | None:
        live = [self.cores[i] for i in IDS if self.alive[i]]
        lead = [c for c in live if c.role == Role.LEADER]
        if len(lead) == 1 and all(c.term == lead[0].term and c.leader_id == lead[0].self_id
                                  for c in live):
            return lead[0].self_id, lead[0].term
        return None


def _stable(ledgers):
    b = Bus(ledgers)
    b.run_until(3000)
    got = b.leader()
    assert got is not None
    return b, got


@pytest.mark.parametrize("kill_phase", [0, 17, 50, 99])
def test_leader_crash_best_log_wins_in_one_new_term(kill_phase):
    """The leader dies; the survivor first in member order has the shorter log. Detection
    takes the election timeout minus the heartbeat phase; the first round (current term) is a
    pre-vote, the other survivor (best log) stands in term + 1 at once and wins it: no extra
    term, no random wait, and member order does not override the log comparison."""
    b, (lead, term) = _stable({i: LedgerEnd() for i in IDS})
    old = b.cores[lead]
    short, best = [i for i in IDS if i != lead]
    b.ledger = {i: LedgerEnd(9 if i == short else 10, term) for i in IDS}
    b.run_until(b.now + 300)  # heartbeats flowing
    b.run_until(old.last_send_heartbeat_ms + kill_phase)
    t_kill = b.now
    b.alive[lead] = False
    seen = len(b.terms_entered[short])
    b.run_until(t_kill + 2000)
    assert b.leader() == (best, term + 1)  # exactly one new term
    at = next(t for t, i, tm in b.leaders if tm == term + 1)
    # detection (timeout - phase) + a few message latencies, never a random vote interval
    assert at - t_kill <= CFG.election_timeout_ms - kill_phase + 10
    # the short log persisted only term + 1 (entered when asked, then its vote for `best`)
    assert set(b.terms_entered[short][seen:]) == {term + 1}


def test_leader_crash_equal_logs_first_member_wins():
    b, (lead, term) = _stable({i: LedgerEnd() for i in IDS})
    t_kill = b.now
    b.alive[lead] = False
    b.run_until(t_kill + 2000)
    first = min(i for i in IDS if i != lead)
    assert b.leader() == (first, term + 1)
    assert next(t for t, i, tm in b.leaders if tm == term + 1) - t_kill <= CFG.election_timeout_ms + 10


def test_lone_follower_timeout_does_not_disturb_the_leader():
    """A follower that misses the leader's beats (they are lost) probes in its current term:
    the leader and the other follower answer REJECT_ALREADY_HAS_LEADER, nobody changes term,
    it retries one interval later, and the next beat that gets through makes it a follower."""
    b, (lead, term) = _stable({i: LedgerEnd() for i in IDS})
    lone = next(i for i in IDS if i != lead)
    orig_apply = b.apply
    drop_until = b.now + 900

    def lossy(nid, step):
        if nid == lead and b.now < drop_until:
            step.effects = [e for e in step.effects
                            if not (isinstance(e, Send) and e.peer == lone
                                    and isinstance(e.message, HeartbeatRequest))]
        orig_apply(nid, step)

    b.apply = lossy
    probes_before = len(b.terms_entered[lone])
    b.run_until(drop_until + 500)
    assert b.leader() == (lead, term)
    assert all(c.term == term for c in b.cores.values())
    assert len(b.terms_entered[lone]) == probes_before  # nothing persisted: no new term, no vote
    rounds = b.cores[lone].last_vote_round
    assert rounds is not None and rounds.already_has_leader and rounds.term == term


def test_fast_path_once_per_election():
    """Two split rounds in a row: the first lets the first-ranked member stand at once, the
    second falls back to the random timer (no lockstep split votes between members whose
    views of the logs disagree)."""
    c = ElectorCore("n0", IDS, "g", CFG, random.Random(5), term=3, voted_for="n2")
    c.next_vote_ms = 0

    def round_with_already_voted(now: int):
        step = c.tick(now, LedgerEnd())
        for s in [e for e in step.effects if isinstance(e, Send)]:
            c.on_response(_already_voted(s.message, c.term), now + 1)
        return c.last_vote_round

    r1 = round_with_already_voted(0)
    assert r1.term == 3 and r1.result == P.WAIT_TO_VOTE_NEXT and r1.next_vote_in_ms == 0
    r2 = round_with_already_voted(1)  # the fast round, in term 4, splits again
    assert r2.term == 4 and r2.result == P.WAIT_TO_VOTE_NEXT
    assert r2.next_vote_in_ms >= CFG.min_vote_interval_ms


def _already_voted(req: VoteRequest, term: int):
    from ipc.protocol import VoteResponse
    return VoteResponse(200, "g", term, "", V.REJECT_ALREADY_VOTED, -1, -1, req.request_id)
