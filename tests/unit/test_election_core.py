"""ElectorCore: the state machine that applies the decision tables, driven by hand.

Checks the effect contract (Persist first, persist-before-send/reply), the role transitions of
docs/election.md "States", DLedger's needIncreaseTermImmediately path, #325 and leadership transfer.
"""

import random

import pytest

from ipc.codes import ParseResult, ResponseCode, Role, VoteResult
from ipc.protocol import (
    AppendRequest,
    ErrorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    TakeLeadershipRequest,
    TakeLeadershipResponse,
    VoteRequest,
    VoteResponse,
)
from node.core.election import (
    ElectionConfig,
    ElectorCore,
    LedgerEnd,
    Persist,
    Reply,
    RoleChanged,
    Send,
    Step,
)

CFG = ElectionConfig(heartbeat_interval_ms=200, max_heartbeat_leak=3)  # votes 50..450, rounds 300 ms
IDS = ["n0", "n1", "n2"]
L0 = LedgerEnd()


def core(nid="n0", term=0, voted=None, now=0, ids=IDS):
    return ElectorCore(nid, ids, "g", CFG, random.Random(1), term=term, voted_for=voted,
                       now_ms=now)


def check(step: Step) -> Step:
    """The effect contract: at most one Persist, always first; RoleChanged before messages."""
    kinds = [type(e) for e in step.effects]
    assert kinds.count(Persist) <= 1
    if Persist in kinds:
        assert kinds[0] is Persist
    if RoleChanged in kinds:
        assert all(k in (Persist, RoleChanged) for k in kinds[:kinds.index(RoleChanged)])
    return step


def sends(step):
    return [e for e in step.effects if isinstance(e, Send)]


def replies(step):
    return [e.message for e in step.effects if isinstance(e, Reply)]


def elect(leader="n0", now=0):
    """Three cores, `leader` wins term 1 by direct delivery; returns (cores, now)."""
    cores = {i: core(i, now=now) for i in IDS}
    c = cores[leader]
    c.next_vote_ms = now  # its (start-up) vote timer fires first
    step = check(c.tick(now, L0))
    assert c.term == 1 and c.voted_for == leader
    for s in sends(step):
        r = check(cores[s.peer].on_vote_request(s.message, L0, now, token=leader))
        check(cores[s.peer].tick(now, L0))
        (resp,) = replies(r)
        check(c.on_response(resp, now))
    # revote immediately if the peers were NOT_READY
    if c.role != Role.LEADER:
        step = check(c.tick(now, L0))
        for s in sends(step):
            (resp,) = replies(check(cores[s.peer].on_vote_request(s.message, L0, now)))
            check(c.on_response(resp, now))
    assert c.role == Role.LEADER
    step = check(c.tick(now, L0))
    for s in sends(step):
        (resp,) = replies(check(cores[s.peer].on_heartbeat_request(s.message, now)))
        check(c.on_response(resp, now))
    return cores, now


def test_startup_waits_a_vote_interval_then_campaigns_in_a_new_term():
    """Persisted vote for itself in term 4: it may have led term 4, so it campaigns in 5."""
    c = core("n1", term=4, voted="n1")
    assert (c.role, c.term, c.voted_for, c.leader_id) == (Role.CANDIDATE, 4, "n1", None)
    # not at once: one heartbeat interval + a randomized vote interval, so a live leader's
    # heartbeat normally arrives first
    first = c.next_vote_ms
    assert CFG.heartbeat_interval_ms + CFG.min_vote_interval_ms <= first
    assert first < CFG.heartbeat_interval_ms + CFG.max_vote_interval_ms
    step = check(c.tick(0, LedgerEnd(7, 3)))
    assert sends(step) == [] and step.of(Persist) == [] and step.next_deadline_ms == first
    step = check(c.tick(first, LedgerEnd(7, 3)))
    # a NEW term, and the self vote is persisted BEFORE the requests leave (persist before send)
    assert step.effects[0] == Persist(5, "n1")
    reqs = [s.message for s in sends(step)]
    assert [s.peer for s in sends(step)] == ["n0", "n2"]
    assert all((r.term, r.leader_id, r.ledger_end_term, r.ledger_end_index) == (5, "n1", 3, 7)
               for r in reqs)
    assert len({r.request_id for r in reqs}) == 2
    assert step.next_deadline_ms == first + CFG.vote_round_timeout_ms  # the round's deadline


@pytest.mark.parametrize("seed", range(20))
def test_a_new_member_campaigns_after_the_vote_interval_only(seed):
    """Nothing on disk (never voted, empty log): no leader to hear first, so no heartbeat
    interval, and the lower half of the randomized vote interval; the first campaign is in
    term 1 as ever, and later timers use the full interval."""
    c = ElectorCore("n0", IDS, "g", CFG, random.Random(seed), now_ms=1000, new_member=True)
    first = c.next_vote_ms
    half = (CFG.min_vote_interval_ms + CFG.max_vote_interval_ms) // 2
    assert 1000 + CFG.min_vote_interval_ms <= first < 1000 + half  # the lower half, no heartbeat wait
    old = ElectorCore("n0", IDS, "g", CFG, random.Random(seed), now_ms=1000)
    assert old.next_vote_ms >= first + CFG.heartbeat_interval_ms
    step = check(c.tick(first, LedgerEnd(-1, -1)))
    assert step.effects[0] == Persist(1, "n0")
    assert {s.message.term for s in sends(step)} == {1}


def test_a_lost_vote_never_stands_in_its_term_not_even_after_following_a_leader_there():
    """Its term/vote state was lost: term 4 is recorded with a vote it cannot name, which may
    have been for itself (it may have led term 4). Standing in term 4, the voters that elected
    it grant the same candidate again: it would lead term 4 twice (the simulator's lost-disk
    fault, seed 11,709). Its first campaign is in term 5, and so is one after following term
    4's leader until that leader went silent."""
    from node.store.term_vote import LOST_VOTE

    c = core("n1", term=4, voted=LOST_VOTE)
    step = check(c.tick(c.next_vote_ms, LedgerEnd(7, 3)))
    assert step.effects[0] == Persist(5, "n1") and {s.message.term for s in sends(step)} == {5}
    c = core("n1", term=4, voted=LOST_VOTE)
    check(c.on_heartbeat_request(HeartbeatRequest("g", "n1", "n0", 4, 1), 10))
    assert (c.role, c.term, c.voted_for) == (Role.FOLLOWER, 4, LOST_VOTE)
    now = 10
    while c.role == Role.FOLLOWER or not sends(step):
        now = c.next_deadline(now) + 1
        step = check(c.tick(now, LedgerEnd(7, 3)))
    assert {s.message.term for s in sends(step)} == {5} and c.term == 5


@pytest.mark.parametrize("voted", [None, "n2"])
def test_a_restarted_follower_rejoins_its_term_instead_of_deposing_its_leader(voted):
    """A node whose vote in term 4 went to another node (or nowhere) cannot have led term 4: it
    rejoins term 4, so the leader's heartbeat makes it a follower. Campaigning in term 5 would
    bring a higher term back to the group and depose a healthy leader on every follower
    restart (seen: an extra election, and a NOOP, each time a lagging follower came back)."""
    c = core("n1", term=4, voted=voted)
    first = c.next_vote_ms
    step = check(c.tick(first, LedgerEnd(7, 3)))
    assert {s.message.term for s in sends(step)} == {4} and c.term == 4
    step = check(c.on_heartbeat_request(HeartbeatRequest("g", "n1", "n0", 4, 1), first + 1))
    assert (c.role, c.term, c.leader_id) == (Role.FOLLOWER, 4, "n0")
    assert step.of(Persist) == []


def test_restart_never_votes_twice_in_a_term():
    # Persisted: term 3, voted for n2. After restart n1 must not vote for n0 (or itself) in 3.
    c = core("n1", term=3, voted="n2")
    step = check(c.tick(0, L0))
    assert step.of(Persist) == []  # its own candidacy in term 3 is refused: no new vote
    r = check(c.on_vote_request(VoteRequest("g", "n1", "n0", 3, -1, -1, 9), L0, 1))
    (resp,) = replies(r)
    assert resp.vote_result == VoteResult.REJECT_ALREADY_VOTED and r.of(Persist) == []
    assert c.voted_for == "n2"


def test_accept_is_persisted_before_the_reply():
    c = core("n1", term=2)
    c.tick(0, L0)  # votes for itself in term 2 at startup
    step = check(c.on_vote_request(VoteRequest("g", "n1", "n0", 3, -1, -1, 5), L0, 1,
                                   token="id0"))
    # a bigger term: enter it durably, answer NOT_READY (DLedger's needIncreaseTermImmediately)
    assert step.effects[0] == Persist(3, None)
    assert RoleChanged(Role.CANDIDATE, 3, None) in step.effects
    (reply,) = [e for e in step.effects if isinstance(e, Reply)]
    assert reply.token == "id0" and reply.message.vote_result == VoteResult.REJECT_TERM_NOT_READY
    assert reply.message.term == 3 and reply.message.request_id == 5
    # the candidate's immediate revote finds n1 ready in term 3
    step = check(c.on_vote_request(VoteRequest("g", "n1", "n0", 3, -1, -1, 6), L0, 2))
    assert step.effects[0] == Persist(3, "n0")
    assert replies(step)[0].vote_result == VoteResult.ACCEPT


def test_three_node_election_and_heartbeats():
    cores, now = elect("n0")
    assert cores["n1"].role == cores["n2"].role == Role.FOLLOWER
    assert cores["n1"].leader_id == "n0" and cores["n1"].term == 1
    lead = cores["n0"]
    assert lead.next_deadline(now) == now + CFG.heartbeat_interval_ms
    step = check(lead.tick(now + 199, L0))
    assert sends(step) == []  # not yet
    step = check(lead.tick(now + 200, L0))
    assert [type(s.message) for s in sends(step)] == [HeartbeatRequest, HeartbeatRequest]


def test_follower_times_out_to_candidate_in_same_term_and_votes():
    cores, now = elect("n0")
    f = cores["n1"]
    deadline = f.next_deadline(now)
    assert deadline == now + 601  # > maxHeartBeatLeak x interval
    assert sends(check(f.tick(deadline - 1, L0))) == []
    step = check(f.tick(deadline, L0))
    assert step.effects[0] == RoleChanged(Role.CANDIDATE, 1, None)
    # votes at once in the SAME term (lastParseResult WAIT_TO_REVOTE), its vote there is taken
    assert {s.message.term for s in sends(step)} == {1}
    assert step.of(Persist) == []


def test_leader_lease_expires_without_quorum():
    cores, now = elect("n0")
    lead = cores["n0"]
    t = now
    stepped = None
    for _ in range(10):  # heartbeats nobody answers
        t = lead.next_deadline(t)
        step = check(lead.tick(t, L0))
        for s in sends(step):
            check(lead.on_peer_unreachable(s.message.request_id, t))
        if lead.role != Role.LEADER:
            stepped = t
            break
        assert lead.peers_alive == {"n1": False, "n2": False}
    assert stepped is not None and 600 < stepped - now <= 800
    assert lead.term == 1  # steps down in its term, no term inflation
    # ... and campaigns next in a NEW term, after a vote interval (never leads twice in 1)
    assert lead.next_vote_ms > stepped
    step = check(lead.tick(lead.next_vote_ms, L0))
    assert {s.message.term for s in sends(step)} == {2}


def test_leader_steps_down_on_higher_term_even_with_quorum():
    """DLedger #325: any higher term in any response deposes the leader."""
    cores, now = elect("n0")
    lead = cores["n0"]
    step = check(lead.tick(now + 200, L0))
    a, b = sends(step)
    check(lead.on_response(HeartbeatResponse(200, "g", 1, "n0", a.message.request_id), now + 201))
    assert lead.role == Role.LEADER  # quorum reached, round over
    step = check(lead.on_response(HeartbeatResponse(int(ResponseCode.EXPIRED_TERM), "g", 7, "",
                                                    b.message.request_id), now + 202))
    assert lead.role == Role.CANDIDATE and lead.known_max_term == 7
    # and it enters term 7 at once, durably (see test_deposed_leader_enters_the_higher_term...)
    assert step.effects[:2] == [Persist(7, None), RoleChanged(Role.CANDIDATE, 7, None)]


def test_resend_now_when_followers_not_ready():
    cores, now = elect("n0")
    lead = cores["n0"]
    a, b = sends(check(lead.tick(now + 200, L0)))
    step = check(lead.on_response(HeartbeatResponse(int(ResponseCode.TERM_NOT_READY), "g", 1, "",
                                                    a.message.request_id), now + 201))
    assert step.next_deadline_ms == now + 201  # beat again immediately
    assert len(sends(check(lead.tick(now + 201, L0)))) == 2


def test_unreachable_peers_end_the_vote_round_early():
    c = core("n0")
    c.next_vote_ms = 0
    step = check(c.tick(0, L0))
    assert c.term == 1
    for s in sends(step):
        step = check(c.on_peer_unreachable(s.message.request_id, 3))
    # valid (only itself) < quorum: WAIT_TO_REVOTE without waiting 300 ms, same term next time
    assert c.last_parse == ParseResult.WAIT_TO_REVOTE and c.role == Role.CANDIDATE
    assert 3 + 3 + 50 <= c.next_vote_ms < 3 + 3 + 450
    step = check(c.tick(c.next_vote_ms, L0))
    assert {s.message.term for s in sends(step)} == {1}


def test_vote_round_deadline_parses_what_arrived():
    c = core("n0")
    c.next_vote_ms = 0
    step = check(c.tick(0, L0))
    first = sends(step)[0]
    c.on_response(VoteResponse(200, "g", 1, "", VoteResult.REJECT_ALREADY_VOTED, -1, -1,
                               first.message.request_id), 5)
    step = check(c.tick(CFG.vote_round_timeout_ms, L0))
    # self ACCEPT + ALREADY_VOTED: valid quorum, no accepted quorum -> WAIT_TO_VOTE_NEXT; n0
    # ranks first (equal logs, first member), so the same tick already stands in term 2.
    r = c.last_vote_round
    assert r.result == ParseResult.WAIT_TO_VOTE_NEXT and r.cost_ms == 300 and r.next_vote_in_ms == 0
    assert c.term == 2 and step.effects[0] == Persist(2, "n0")


def test_higher_term_in_vote_answers_moves_candidate_to_that_term():
    c = core("n0")
    c.next_vote_ms = 0
    a, b = sends(check(c.tick(0, L0)))
    step = check(c.on_response(VoteResponse(200, "g", 6, "", VoteResult.REJECT_EXPIRED_VOTE_TERM,
                                            -1, -1, a.message.request_id), 1))
    # entered at once, durably, vote cleared (DLedger waited for the next round's nextTerm)
    assert c.term == 6 and c.voted_for is None and step.effects[0] == Persist(6, None)
    c.on_peer_unreachable(b.message.request_id, 1)  # a round of term 1: no longer counts
    assert c.last_parse == ParseResult.WAIT_TO_REVOTE and c.next_vote_ms > 1
    step = check(c.tick(c.next_vote_ms, L0))
    assert c.term == 6 and step.effects[0] == Persist(6, "n0")


def test_single_node_group_leads_after_its_first_vote_interval():
    c = core("n0", ids=["n0"])
    assert check(c.tick(0, L0)).effects == []
    step = check(c.tick(c.next_vote_ms, L0))
    assert c.role == Role.LEADER
    assert RoleChanged(Role.LEADER, 1, "n0") in step.effects


def test_take_leadership_success_and_failure():
    cores, now = elect("n0")
    t = cores["n2"]
    # wrong term: answered at once
    (r,) = replies(check(t.on_take_leadership(TakeLeadershipRequest("g", "n2", "n0", 9, 41),
                                              now, token="x")))
    assert r.code == ResponseCode.INCONSISTENT_TERM and r.request_id == 41
    # right term: enter term+1 at once, durably, and vote after 30..100 ms
    step = check(t.on_take_leadership(TakeLeadershipRequest("g", "n2", "n0", 1, 42), now, "tok"))
    assert step.effects[0] == Persist(2, None) and replies(step) == []
    assert t.taking_leadership and now + 30 <= t.next_vote_ms < now + 100
    step = check(t.tick(t.next_vote_ms, L0))
    now = t.next_vote_ms
    for s in sends(step):
        peer = cores[s.peer]
        (resp,) = replies(check(peer.on_vote_request(s.message, L0, now)))
        assert resp.vote_result == VoteResult.REJECT_TERM_NOT_READY  # peers enter term 2
        step = check(t.on_response(resp, now))
    step = check(t.tick(now, L0))  # REVOTE_IMMEDIATELY
    done = None
    for s in sends(step):
        (resp,) = replies(check(cores[s.peer].on_vote_request(s.message, L0, now)))
        st = check(t.on_response(resp, now))
        done = done or [e for e in st.effects if isinstance(e, Reply)]
    assert t.role == Role.LEADER and t.term == 2
    (reply,) = done
    assert reply.token == "tok" and reply.message == TakeLeadershipResponse(
        200, "g", 2, "n2", 42)
    assert not t.taking_leadership

    # A transferee that receives the new leader's heartbeat instead ends as follower: FAILED.
    c = core("n1", term=2)
    c.on_take_leadership(TakeLeadershipRequest("g", "n1", "n2", 2, 43), 0, "t2")
    assert c.term == 3
    step = check(c.on_heartbeat_request(HeartbeatRequest("g", "n1", "n0", 3, 7), 1))
    msgs = replies(step)
    assert any(isinstance(m, TakeLeadershipResponse)
               and m.code == ResponseCode.TAKE_LEADERSHIP_FAILED for m in msgs)


@pytest.mark.parametrize("seed", range(20))
def test_a_member_woken_by_a_candidate_leaves_it_the_revote_even_when_its_round_is_slow(seed):
    """A transfer on a loaded group: the target's first round (NOT_READY from both) ends only
    when the slow old leader answers, near the round's timeout. The member that answered at once
    entered term 2 as a candidate; it must not stand before the target's immediate revote, or it
    votes for itself, the target loses and the transfer fails (CI saw TAKE_LEADERSHIP_FAILED).
    The seed varies the woken member's random vote timer."""
    cores, now = elect("n0")
    fast = cores["n1"]
    fast.rng = random.Random(seed)
    t = cores["n2"]
    t.on_take_leadership(TakeLeadershipRequest("g", "n2", "n0", 1, 42), now, "tok")
    now = t.next_vote_ms
    reqs = {s.peer: s.message for s in sends(check(t.tick(now, L0)))}
    (resp,) = replies(check(fast.on_vote_request(reqs["n1"], L0, now)))
    assert resp.vote_result == VoteResult.REJECT_TERM_NOT_READY and fast.term == 2
    check(t.on_response(resp, now))
    late = now + CFG.vote_round_timeout_ms - 1  # the old leader answers just before the deadline
    for ms in range(now, late + 1, 10):  # meanwhile the woken member's timers run
        check(fast.tick(ms, L0))
    assert fast.voted_for is None, "the woken member stood before the candidate could revote"
    (resp,) = replies(check(cores["n0"].on_vote_request(reqs["n0"], L0, late)))
    check(t.on_response(resp, late))
    step = check(t.tick(late, L0))  # REVOTE_IMMEDIATELY
    for s in sends(step):
        (resp,) = replies(check(cores[s.peer].on_vote_request(s.message, L0, late)))
        check(t.on_response(resp, late))
    assert t.role == Role.LEADER and t.term == 2


def test_taking_leadership_rejects_rival_with_shorter_log():
    c = core("n1", term=2)
    c.on_take_leadership(TakeLeadershipRequest("g", "n1", "n0", 2, 1), 0, None)
    (resp,) = replies(c.on_vote_request(VoteRequest("g", "n1", "n2", 3, 1, 5, 2),
                                        LedgerEnd(5, 1), 1))
    assert resp.vote_result == VoteResult.REJECT_TAKING_LEADERSHIP


def test_handle_dispatch_and_unsupported():
    c = core("n1")
    step = c.handle(AppendRequest("g", "n1", b"x", request_id=3), 0, L0, token="t")
    (e,) = [x for x in step.effects if isinstance(x, Reply)]
    assert isinstance(e.message, ErrorResponse) and e.message.code == ResponseCode.UNSUPPORTED
    assert e.message.request_id == 3 and e.token == "t"
    step = c.handle(HeartbeatRequest("g", "n1", "n0", 0, 4), 0)
    assert replies(step)[0].code == ResponseCode.SUCCESS and c.role == Role.FOLLOWER


def test_stale_and_unknown_responses_are_ignored():
    c = core("n0")
    before = (c.role, c.term, c.voted_for)
    step = c.on_response(VoteResponse(200, "g", 0, "", VoteResult.ACCEPT, -1, -1, 999), 0)
    assert step.effects == [] and (c.role, c.term, c.voted_for) == before


def test_no_persist_or_role_change_when_nothing_happens():
    cores, now = elect("n0")
    f = cores["n1"]
    step = f.on_heartbeat_request(HeartbeatRequest("g", "n1", "n0", 1, 5), now + 100)
    assert [type(e) for e in step.effects] == [Reply]
    assert f.last_leader_heartbeat_ms == now + 100
