"""The handler's read path, driven through the real Handler: the elector's wake-up when
leadership is confirmed (LEADERSHIP_CONFIRMED), lease reads (`read_lease`), follower reads via
a read index from the leader, and appends answered at commit when no result is wanted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node import channels
from tests.unit.test_apply import FakeLink
from tests.unit.test_replication_roles import (
    Clock,
    commit_all,
    get,
    leader_handler,
    member,
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
