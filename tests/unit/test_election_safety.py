"""ElectorCore safety rules added on top of DLedger (docs/contracts.md C3, C5, C18): enter a higher
term at once, never lead twice in one term, the lease counts from a round's start, leadership
confirmation on request, and a leader that cannot write steps down."""

import random

from ipc.codes import ResponseCode, Role, VoteResult
from ipc.protocol import HeartbeatRequest, HeartbeatResponse, VoteRequest, VoteResponse
from node.core.election import (
    ElectionConfig,
    ElectorCore,
    LeadershipConfirmed,
    LedgerEnd,
    Persist,
    Reply,
    RoleChanged,
    Send,
    Step,
)

CFG = ElectionConfig()
IDS = ["L", "F", "X"]
LED = LedgerEnd(10, 1)


def core(nid, term=0, voted=None, now=0, ids=IDS, seed=1):
    rng = random.Random(seed) if seed is not None else None
    return ElectorCore(nid, ids, "g", CFG, rng, term=term, voted_for=voted,
                       now_ms=now)


def sends(step: Step, kind=None):
    return [e for e in step.effects if isinstance(e, Send)
            and (kind is None or isinstance(e.message, kind))]


def replies(step: Step):
    return [e.message for e in step.effects if isinstance(e, Reply)]


def deliver_votes(cand, step, voters, now, ledger=LED):
    """Deliver `step`'s vote requests to `voters` and feed the answers back; returns answers."""
    got = []
    for s in sends(step, VoteRequest):
        if s.peer in voters:
            (r,) = replies(voters[s.peer].on_vote_request(s.message, ledger, now))
            got.append(r)
            cand.on_response(r, now)
    return got


def make_leader(c, voters, now, ledger=LED):
    """Run `c`'s vote rounds against `voters` until it leads (or 5 rounds); returns now."""
    for _ in range(5):
        now = max(now, c.next_deadline(now))
        step = c.tick(now, ledger)
        deliver_votes(c, step, voters, now, ledger)
        if c.role == Role.LEADER:
            return now
    raise AssertionError(f"{c.self_id} did not become leader: {c.role} {c.term}")


# ------------------------------------------------------------------ higher term (C18)


def test_deposed_leader_enters_the_higher_term_durably_and_never_campaigns_in_its_old_term():
    """A leader deposed by EXPIRED_TERM(5) used to become candidate in its OLD term 1, where F
    (which had voted for it) accepted it again: leader of term 1 again and again."""
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    X = core("X", term=5, voted="X", seed=3)
    now = make_leader(L, {"F": F}, 0)
    assert L.role == Role.LEADER and L.term < 5
    # X (term 5) answers a heartbeat with EXPIRED_TERM
    now += CFG.heartbeat_interval_ms
    step = L.tick(now, LED)
    (to_x,) = [s for s in sends(step, HeartbeatRequest) if s.peer == "X"]
    (ans,) = replies(X.on_heartbeat_request(to_x.message, now))
    assert ans.code == ResponseCode.EXPIRED_TERM and ans.term == 5
    step = L.on_response(ans, now)
    # term 5 entered at once, durably, vote cleared: Persist is the first effect
    assert step.effects[0] == Persist(5, None)
    assert RoleChanged(Role.CANDIDATE, 5, None) in step.effects
    assert (L.role, L.term, L.voted_for) == (Role.CANDIDATE, 5, None)
    # every later vote round is in term >= 5, and it never leads a term below 5 again
    terms = set()
    for _ in range(4):
        now = L.next_deadline(now)
        st = L.tick(now, LED)
        terms |= {s.message.term for s in sends(st, VoteRequest)}
        deliver_votes(L, st, {"F": F, "X": X}, now)
        assert L.role != Role.LEADER or L.term >= 5
    assert terms and min(terms) >= 5


def test_a_higher_term_in_any_answer_is_entered_at_once_by_a_follower_too():
    c = core("F", term=3)
    c.on_heartbeat_request(HeartbeatRequest("g", "F", "L", 3, 1), 0)
    assert c.role == Role.FOLLOWER
    # a late answer (e.g. to a vote it sent before following) carries term 8
    step = c.on_response(VoteResponse(200, "g", 8, "", VoteResult.REJECT_EXPIRED_VOTE_TERM,
                                      -1, -1, 12345), 5)
    assert step.effects[0] == Persist(8, None)
    assert (c.role, c.term, c.voted_for, c.leader_id) == (Role.CANDIDATE, 8, None, None)


def test_an_envelope_error_never_moves_the_term():
    """UNKNOWN_GROUP / UNKNOWN_MEMBER answers carry the term of whatever answered (a node of
    another group on a misconfigured port): not a term of this group."""
    c = core("L", term=2)
    for resp in (VoteResponse(int(ResponseCode.UNKNOWN_GROUP), "g", 50, "", VoteResult.UNKNOWN,
                              -1, -1, 1),
                 HeartbeatResponse(int(ResponseCode.UNKNOWN_MEMBER), "g", 50, "", 2),
                 HeartbeatResponse(int(ResponseCode.SUCCESS), "other", 50, "", 3)):
        step = c.on_response(resp, 1)
        assert step.of(Persist) == [] and c.term == 2


# ------------------------------------------------------------------ restart rule


def test_restarted_leader_never_leads_twice_in_one_term():
    """Term T=4 with the vote for itself on disk (it led term 4 before a crash). F and X also
    voted for it in 4, so in term 4 they would ACCEPT it again; it must campaign in 5."""
    L = core("L", term=4, voted="L")
    F, X = core("F", term=4, voted="L", seed=2), core("X", term=4, voted="L", seed=3)
    assert L.tick(0, LED).effects == []  # not at once
    first = L.next_vote_ms
    assert first >= CFG.heartbeat_interval_ms + CFG.min_vote_interval_ms
    step = L.tick(first, LED)
    assert step.effects[0] == Persist(5, "L")
    assert {s.message.term for s in sends(step, VoteRequest)} == {5}
    make_leader(L, {"F": F, "X": X}, first)
    assert (L.role, L.term) == (Role.LEADER, 5)


def test_restarted_follower_hears_the_leader_before_its_first_vote():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    X = core("X", term=1, voted="L", seed=3)
    now = make_leader(L, {"F": F, "X": X}, 0)  # term 2
    for s in sends(L.tick(now, LED), HeartbeatRequest):
        L.on_response(replies({"F": F, "X": X}[s.peer].on_heartbeat_request(s.message, now))[0],
                      now)
    F2 = core("F", term=F.term, voted=F.voted_for, now=now, seed=9)  # F restarts
    # the leader beats every interval; F's first vote timer is later than that
    hb_at = L.next_deadline(now)
    assert hb_at - now <= CFG.heartbeat_interval_ms < F2.next_vote_ms - now
    step = L.tick(hb_at, LED)
    (to_f,) = [s for s in sends(step, HeartbeatRequest) if s.peer == "F"]
    F2.on_heartbeat_request(to_f.message, hb_at)
    assert (F2.role, F2.term, F2.leader_id) == (Role.FOLLOWER, L.term, "L")


def test_leader_that_lost_an_inconsistent_leader_check_campaigns_in_a_new_term():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    term = L.term
    now += CFG.heartbeat_interval_ms
    step = L.tick(now, LED)
    for s in sends(step, HeartbeatRequest):
        L.on_response(HeartbeatResponse(int(ResponseCode.INCONSISTENT_LEADER), "g", term, "Z",
                                        s.message.request_id), now)
    assert L.role == Role.CANDIDATE and L.term == term
    step = L.tick(L.next_deadline(now), LED)
    assert {s.message.term for s in sends(step, VoteRequest)} == {term + 1}


# ------------------------------------------------------------------ lease = round start


def test_quorum_heartbeat_time_is_the_round_start_not_its_end():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    start = now + CFG.heartbeat_interval_ms
    step = L.tick(start, LED)
    for s in sends(step, HeartbeatRequest):
        if s.peer == "F":
            (r,) = replies(F.on_heartbeat_request(s.message, start + 40))
            L.on_response(r, start + 90)  # the answer arrives 90 ms after the round began
    assert L.last_succ_heartbeat_ms == start


def test_new_leader_lease_counts_from_the_start_of_the_vote_round_it_won():
    L, F = core("L", term=1, voted="L"), core("F", term=2, seed=2)  # F already in 2: ACCEPT
    t0 = L.next_vote_ms
    step = L.tick(t0, LED)
    (to_f,) = [s for s in sends(step, VoteRequest) if s.peer == "F"]
    (r,) = replies(F.on_vote_request(to_f.message, LED, t0 + 30))
    assert r.vote_result == VoteResult.ACCEPT
    L.on_response(r, t0 + 70)
    assert L.role == Role.LEADER and L.last_succ_heartbeat_ms == t0


# ------------------------------------------------------------------ request_heartbeat (C4)


def test_request_heartbeat_starts_a_round_at_once_when_leader():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    for s in sends(L.tick(now, LED), HeartbeatRequest):  # the first round after winning
        if s.peer == "F":
            L.on_response(replies(F.on_heartbeat_request(s.message, now))[0], now)
    t = now + 50  # mid-interval: no periodic beat due
    assert sends(L.tick(t, LED)) == []
    step = L.request_heartbeat(t)
    hb = sends(step, HeartbeatRequest)
    assert sorted(s.peer for s in hb) == ["F", "X"]
    (to_f,) = [s for s in hb if s.peer == "F"]
    L.on_response(replies(F.on_heartbeat_request(to_f.message, t + 3))[0], t + 5)
    assert L.last_succ_heartbeat_ms == t  # >= the time the confirmation was asked for


def test_request_heartbeat_during_a_round_starts_the_next_one_when_it_ends():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    first = sends(L.tick(now, LED), HeartbeatRequest)  # round 1 in flight
    t = now + 10
    assert sends(L.request_heartbeat(t)) == []  # not cut short: its answers still count
    (to_f,) = [s for s in first if s.peer == "F"]
    step = L.on_response(replies(F.on_heartbeat_request(to_f.message, t + 1))[0], t + 2)
    assert L.last_succ_heartbeat_ms == now  # round 1 reached a quorum, started before t
    assert step.next_deadline_ms == t + 2  # ... and the next round is due at once
    step = L.tick(t + 2, LED)
    second = sends(step, HeartbeatRequest)
    assert len(second) == 2
    (to_f,) = [s for s in second if s.peer == "F"]
    L.on_response(replies(F.on_heartbeat_request(to_f.message, t + 3))[0], t + 4)
    assert L.last_succ_heartbeat_ms == t + 2 >= t


def test_request_heartbeat_when_not_leader_does_nothing():
    c = core("F", term=1)
    assert c.request_heartbeat(5).effects == []
    solo = core("L", ids=["L"])
    solo.tick(solo.next_vote_ms, LED)
    assert solo.role == Role.LEADER
    solo.request_heartbeat(solo.next_vote_ms + 7)
    assert solo.last_succ_heartbeat_ms == solo.next_vote_ms + 7  # a one-node quorum at once


def confirms(step: Step):
    return [e for e in step.effects if isinstance(e, LeadershipConfirmed)]


def beat_answered(L, F, step, at):
    """Deliver `step`'s heartbeat to F and F's answer back to L at `at`; returns L's step."""
    (to_f,) = [s for s in sends(step, HeartbeatRequest) if s.peer == "F"]
    return L.on_response(replies(F.on_heartbeat_request(to_f.message, at))[0], at)


def quiet_leader():
    """L leads with F's vote, its first round answered; returns (L, F, now)."""
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    beat_answered(L, F, L.tick(now, LED), now)
    return L, F, now


def test_a_confirmation_with_a_token_is_answered_when_its_round_reaches_a_quorum():
    L, F, now = quiet_leader()
    t = now + 50
    step = L.request_heartbeat(t, b"h")
    assert confirms(step) == []  # asked, not yet confirmed
    assert confirms(beat_answered(L, F, step, t + 3)) == [LeadershipConfirmed(b"h", t)]
    assert L.last_succ_heartbeat_ms == t


def test_a_round_in_flight_when_the_confirmation_arrived_does_not_confirm_it():
    L, F, now = quiet_leader()
    t = now + CFG.heartbeat_interval_ms
    first = L.tick(t, LED)  # round 1 starts at t
    asked = t + 5
    assert sends(L.request_heartbeat(asked, b"h")) == []  # round 1 is not cut short
    step = beat_answered(L, F, first, asked + 1)
    assert confirms(step) == []  # round 1 started before the request: it proves nothing about it
    second = L.tick(asked + 1, LED)  # the next round at once
    assert confirms(beat_answered(L, F, second, asked + 2)) == [LeadershipConfirmed(b"h", asked + 1)]


def test_many_confirmations_of_one_token_are_answered_once_per_round():
    L, F, now = quiet_leader()
    t = now + 50
    step = L.request_heartbeat(t, b"h")
    for k in range(1, 20):  # more reads while the round is out: they wait for the next one
        L.request_heartbeat(t + k, b"h")
    assert len(L._confirm_waiters) == 2
    assert confirms(beat_answered(L, F, step, t + 20)) == [LeadershipConfirmed(b"h", t)]
    second = L.tick(t + 21, LED)
    assert confirms(beat_answered(L, F, second, t + 22)) == [LeadershipConfirmed(b"h", t + 21)]
    assert L._confirm_waiters == []


def test_a_round_without_a_quorum_confirms_nothing_and_losing_leadership_forgets_the_waiters():
    L, F, now = quiet_leader()
    t = now + 50
    L.request_heartbeat(t, b"h")
    step = L.tick(t + CFG.heartbeat_interval_ms, LED)  # round over unanswered: no quorum
    assert confirms(step) == [] and L._confirm_waiters != []
    (s,) = [s for s in sends(step, HeartbeatRequest) if s.peer == "F"]  # the next round
    step = L.on_response(HeartbeatResponse(int(ResponseCode.EXPIRED_TERM), "g", 9, "", s.message.request_id),
                         t + CFG.heartbeat_interval_ms + 1)
    assert L.role != Role.LEADER and confirms(step) == [] and L._confirm_waiters == []


def test_a_confirmation_to_a_one_node_leader_is_answered_at_once():
    solo = core("L", ids=["L"])
    solo.tick(solo.next_vote_ms, LED)
    t = solo.next_vote_ms + 7
    assert confirms(solo.request_heartbeat(t, b"h")) == [LeadershipConfirmed(b"h", t)]


# ------------------------------------------------------------------ unwritable store (C5)


def test_leader_whose_store_is_not_writable_steps_down():
    L, F = core("L", term=1, voted="L"), core("F", term=1, voted="L", seed=2)
    now = make_leader(L, {"F": F}, 0)
    term = L.term
    step = L.tick(now + 1, LedgerEnd(10, 1, writable=False))
    assert L.role == Role.CANDIDATE and RoleChanged(Role.CANDIDATE, term, None) in step.effects
    assert sends(step) == []


def test_unwritable_node_does_not_campaign_but_still_votes():
    c = core("F", term=3)
    bad = LedgerEnd(10, 1, writable=False)
    t = 0
    for _ in range(20):
        t = c.next_deadline(t)
        step = c.tick(t, bad)
        assert sends(step) == [] and c.role == Role.CANDIDATE
        assert c.next_deadline(t) > t  # the timer is re-armed: the caller does not spin
    (r,) = replies(c.on_vote_request(VoteRequest("g", "F", "X", 3, 1, 10, 1), bad, t))
    assert r.vote_result == VoteResult.ACCEPT
    # writable again: it would campaign, in a new term (its vote in 3 is its own)
    c2 = core("F", term=3, voted="F")
    t = c2.next_deadline(0)
    c2.tick(t, bad)
    step = c2.tick(c2.next_deadline(t), LED)
    assert {s.message.term for s in sends(step, VoteRequest)} == {4}


def test_first_vote_timer_comes_from_an_rng_injected_after_construction():
    """The simulator replaces `core.rng` right after `Elector.start()`; its seed alone must
    decide every timer, the first one included, or a seed would not replay."""
    firsts = set()
    for _ in range(3):
        c = core("F", seed=None)
        c.rng = random.Random(42)
        firsts.add(c.next_vote_ms)
    assert len(firsts) == 1


def test_unwritable_transferee_refuses_take_leadership_at_once():
    from ipc.protocol import TakeLeadershipRequest

    c = core("F", term=3)
    step = c.handle(TakeLeadershipRequest("g", "F", "L", 3, 9), 0,
                    LedgerEnd(10, 1, writable=False), token="t")
    (r,) = replies(step)
    assert r.code == ResponseCode.TAKE_LEADERSHIP_FAILED and c.term == 3
    assert step.of(Persist) == []
