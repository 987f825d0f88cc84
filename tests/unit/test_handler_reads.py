"""The handler's read path, driven through the real Handler: the elector's wake-up when
leadership is confirmed (LEADERSHIP_CONFIRMED), lease reads (`read_lease`), follower reads via
a read index from the leader, and appends answered at commit when no result is wanted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.wiring import channels
from tests.unit.test_apply import FakeLink
from tests.unit.test_replication_roles import (
    Clock,
    FakeState,
    HandlerWire,
    commit_all,
    get,
    leader_handler,
    make_handler,
    member,
    store_of,
)


def query(h, rid: int, request: bytes = b"what") -> None:  # noqa: ANN001
    h.handle_frame(b"c", P.encode(P.QueryRequest("g", "n1", request, request_id=rid)))


# ------------------------------------------------------------------ A: the elector's wake-up
def test_a_parked_read_is_served_when_the_elector_says_leadership_is_confirmed(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    clock.now += 10
    get(h, 1, 0, linearizable=True)
    assert wire.controls == [channels.CONFIRM_LEADERSHIP]
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)  # the elector wrote the block...
    h.on_control_reply(channels.LEADERSHIP_CONFIRMED)  # ... then woke us: served without a tick
    assert wire.answer(1).code == RC.SUCCESS


def test_the_wake_up_is_only_a_hint_the_block_decides(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    clock.now += 10
    get(h, 1, 0, linearizable=True)
    h.on_control_reply(channels.LEADERSHIP_CONFIRMED)  # a stale or stray wake-up
    assert wire.answer(1) is None, "served although the block shows no round that began after it"
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()  # a lost wake-up: the poll serves it
    assert wire.answer(1).code == RC.SUCCESS


def test_a_wake_up_serves_parked_state_machine_reads_too(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    commit_all(h, state)
    clock.now += 10
    query(h, 2)
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.on_control_reply(channels.LEADERSHIP_CONFIRMED)
    assert [q[1] for q in h.sm_link.queries] == [h.store.committed_index]


# ------------------------------------------------------------------ B: lease reads
def test_without_read_lease_every_read_waits_for_a_confirming_round(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    clock.now += 10
    get(h, 1, 0, linearizable=True)
    assert wire.answer(1) is None and wire.controls == [channels.CONFIRM_LEADERSHIP]


def test_with_read_lease_a_read_is_served_at_once_while_the_lease_holds(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, read_lease=True)
    h.sm_link = FakeLink()
    commit_all(h, state)
    clock.now += 10
    get(h, 1, 0, linearizable=True)
    assert wire.answer(1).code == RC.SUCCESS and wire.controls == []
    query(h, 2)
    assert [q[1] for q in h.sm_link.queries] == [h.store.committed_index] and wire.controls == []


def test_a_lease_read_waits_for_the_terms_noop_to_commit(tmp_path: Path) -> None:
    """The committed index is a read index only once this term's NOOP is committed: before
    that it may miss entries an earlier leader committed."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, read_lease=True)
    get(h, 1, 0, linearizable=True)
    assert wire.answer(1) is None and wire.controls == [channels.CONFIRM_LEADERSHIP]
    commit_all(h, state)
    clock.now += 1
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert wire.answer(1).code == RC.SUCCESS


def test_a_lease_read_is_not_served_once_the_lease_lapsed_or_during_a_transfer(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, read_lease=True)
    commit_all(h, state)
    clock.now += h.lease - 1  # the last quorum round is almost a lease ago: the lease still holds
    get(h, 1, 0, linearizable=True)
    assert wire.answer(1).code == RC.SUCCESS
    state.member = dataclasses.replace(member(Role.LEADER, 3, 1, quorum_ms=clock.now), transferee_slot=2)
    get(h, 2, 0, linearizable=True)
    assert wire.answer(2) is None, "a lease read while a transfer's target may be elected"
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now - h.lease)
    get(h, 3, 0, linearizable=True)
    assert wire.answer(3).code == RC.NOT_LEADER  # no lease: not even a parked read


# ------------------------------------------------------------------ follower reads
# (docs/statemachine.md "Reads")
class PeerWire(HandlerWire):
    """The handler's wire plus its DEALERs to the other members' data ports."""

    def __init__(self) -> None:
        super().__init__()
        self.to_peers: list[tuple[str, P.Message]] = []
        self.reachable = True

    def to_peer(self, peer_id: str, frame: bytes) -> bool:
        if self.reachable:
            self.to_peers.append((peer_id, P.decode(frame)))
        return self.reachable


def follower_handler(tmp_path: Path, clock: Clock):  # noqa: ANN201
    state = FakeState()
    state.member = member(Role.FOLLOWER, 3, 0)  # n0 leads term 3
    h, _ = make_handler(tmp_path, "n1", state, clock, store=store_of([1, 2, 3]))
    h.transport = wire = PeerWire()
    h.sm_link = FakeLink()
    return h, wire, state


def any_member_query(h, rid: int, request: bytes = b"what") -> None:  # noqa: ANN001
    h.handle_frame(b"c", P.encode(P.QueryRequest("g", "n1", request, request_id=rid, any_member=True)))


def test_a_follower_read_asks_the_leader_for_a_read_index_then_its_own_applier(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, _state = follower_handler(tmp_path, clock)
    any_member_query(h, 7)
    ((peer, ask),) = wire.to_peers
    assert peer == "n0" and isinstance(ask, P.ReadIndexRequest) and ask.remote_id == "n0"
    assert not h.sm_link.queries and wire.answer(7) is None
    h.on_peer_reply(P.encode(P.ReadIndexResponse(RC.SUCCESS, "g", 3, "n0", 2, ask.request_id)))
    ((tag, read_index, request),) = h.sm_link.queries
    assert (read_index, request) == (2, b"what")  # the leader's index, not our committed one
    h.on_query_reply(channels.encode_query_reply(tag, channels.QUERY_OK, 2, b"answer"))
    got = wire.answer(7)
    assert (got.code, bytes(got.answer), got.applied_index) == (RC.SUCCESS, b"answer", 2)


def test_a_follower_read_without_the_flag_or_a_reachable_leader_is_not_leader(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = follower_handler(tmp_path, clock)
    query(h, 1)  # no FLAG_ANY_MEMBER: as before
    assert wire.answer(1).code == RC.NOT_LEADER and wire.to_peers == []
    wire.reachable = False
    any_member_query(h, 2)
    assert wire.answer(2).code == RC.NOT_LEADER
    wire.reachable = True
    state.member = member(Role.CANDIDATE, 4, -1)  # no leader known
    any_member_query(h, 3)
    assert wire.answer(3).code == RC.NOT_LEADER and wire.to_peers == []


def test_a_follower_read_passes_on_the_leaders_refusal_and_times_out(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, _state = follower_handler(tmp_path, clock)
    any_member_query(h, 1)
    any_member_query(h, 2)
    (_, a1), (_, _a2) = wire.to_peers
    h.on_peer_reply(P.encode(P.error_reply(a1, RC.NOT_LEADER, group="g", term=4)))
    assert wire.answer(1).code == RC.NOT_LEADER and not h.sm_link.queries
    clock.now += h.read_timeout_ms
    h.tick()
    assert wire.answer(2).code == RC.TIMEOUT and h.applier.follower_reads == {}


def test_the_leader_answers_a_read_index_once_a_round_confirmed_it(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    clock.now += 10
    h.handle_frame(b"f", P.encode(P.ReadIndexRequest("g", "n1", request_id=5)))
    assert wire.answer(5) is None and wire.controls == [channels.CONFIRM_LEADERSHIP]
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.on_control_reply(channels.LEADERSHIP_CONFIRMED)
    got = wire.answer(5)
    assert isinstance(got, P.ReadIndexResponse) and (got.code, got.read_index) == (RC.SUCCESS, h.store.committed_index)


def test_a_read_index_under_the_lease_is_answered_at_once_and_refused_by_a_non_leader(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, read_lease=True)
    commit_all(h, state)
    h.handle_frame(b"f", P.encode(P.ReadIndexRequest("g", "n1", request_id=5)))
    assert wire.answer(5).read_index == h.store.committed_index
    state.member = member(Role.FOLLOWER, 4, 2)
    h.handle_frame(b"f", P.encode(P.ReadIndexRequest("g", "n1", request_id=6)))
    assert wire.answer(6).code == RC.NOT_LEADER


# ------------------------------------------------------------------ C: puts answered at commit
def test_an_append_that_wants_no_result_is_answered_at_commit(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"put", request_id=1, no_result=True)))
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"cas", request_id=2)))
    h.handle_frame(b"m", P.encode_multi([P.encode_append("g", "n1", b"p2", 3, no_result=True),
                                         P.encode_append("g", "n1", b"c2", 4)]))
    put_index = h.store.ledger_end_index - 3
    commit_all(h, state)
    h.tick()  # flushes the MULTI peer's replies
    one = wire.answer(1)
    assert (one.code, one.index, one.result) == (RC.SUCCESS, put_index, None)
    assert wire.answer(2) is None and wire.answer(4) is None, "a write that wants its result waits for it"
    assert wire.answer(3).code == RC.SUCCESS
    h.on_results(channels.encode_results(put_index, [None, b"swapped", None, b"no"]))
    h.tick()
    assert bytes(wire.answer(2).result) == b"swapped" and bytes(wire.answer(4).result) == b"no"


def test_a_read_after_a_put_answered_at_commit_waits_for_that_put_to_be_applied(tmp_path: Path) -> None:
    """The put is answered before the applier has it; the read's read index is the committed
    index, which covers the put, and the applier answers only once it applied that index."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, read_lease=True)
    h.sm_link = FakeLink()
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"put", request_id=1, no_result=True)))
    commit_all(h, state)
    assert wire.answer(1).code == RC.SUCCESS
    query(h, 2)
    ((_tag, read_index, _request),) = h.sm_link.queries
    assert read_index >= wire.answer(1).index


# ------------------------------------------------------------------ D: follower appliers in runs
def test_a_followers_applier_is_woken_in_runs_and_at_once_while_a_read_waits(tmp_path: Path) -> None:
    from node.roles.handler import FOLLOWER_APPLY_RUN

    clock = Clock()
    h, wire, _state = follower_handler(tmp_path, clock)
    s = h.store
    for i in range(FOLLOWER_APPLY_RUN + 2):
        s.append_leader(b"e%d" % i, 3)
    h.sm_link.hints = 0

    def commit(index: int) -> int:
        before = h.sm_link.hints
        s.set_committed_index(index)
        h.publish_ledger()
        return h.sm_link.hints - before

    base = s.committed_index
    assert commit(base + 1) == 0, "a follower's applier woken for one entry"
    assert commit(base + FOLLOWER_APPLY_RUN - 1) == 0
    assert commit(base + FOLLOWER_APPLY_RUN + 1) == 1  # a run piled up
    any_member_query(h, 1)  # a follower read waits: every commit move counts now
    assert commit(base + FOLLOWER_APPLY_RUN + 2) == 1


def test_a_leaders_applier_is_woken_on_every_commit_move(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    commit_all(h, state)
    for rid in range(3):
        h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", b"x", request_id=rid)))
        before = h.sm_link.hints
        commit_all(h, state)
        assert h.sm_link.hints == before + 1


# ------------------------------------------------------------------ proposal 3: the applier hop overlaps the round
def test_an_early_query_fails_not_leader_on_a_term_change_even_if_its_answer_came(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    commit_all(h, state)
    clock.now += 10
    query(h, 1)
    ((tag, read_index, _),) = h.sm_link.queries
    h.on_query_reply(channels.encode_query_reply(tag, channels.QUERY_OK, read_index, b"stale?"))
    state.member = member(Role.FOLLOWER, 4, 2)
    h.tick()
    assert wire.answer(1).code == RC.NOT_LEADER


def test_an_early_query_confirmed_before_its_answer_is_answered_when_the_answer_comes(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    commit_all(h, state)
    clock.now += 10
    query(h, 1)
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.on_control_reply(channels.LEADERSHIP_CONFIRMED)
    assert wire.answer(1) is None
    ((tag, read_index, _),) = h.sm_link.queries
    h.on_query_reply(channels.encode_query_reply(tag, channels.QUERY_OK, read_index, b"now"))
    assert bytes(wire.answer(1).answer) == b"now"


def test_a_query_before_the_terms_noop_commits_is_not_sent_early(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    h.sm_link = FakeLink()
    query(h, 1)  # the NOOP is not committed: the committed index is no read index yet
    assert h.sm_link.queries == [] and wire.controls == [channels.CONFIRM_LEADERSHIP]
    commit_all(h, state)
    clock.now += 1
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert [q[1] for q in h.sm_link.queries] == [h.store.committed_index]
