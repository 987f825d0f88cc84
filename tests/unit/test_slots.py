"""Peer slot assignment (node/core/slots.py): members keep their slots, new ones take the lowest
free slot, a slot is reused only after it was released, and the bootstrap is `--peers` order."""

from __future__ import annotations

import json

import pytest

from node.core.membership import (
    MAX_MEMBERS,
    Change,
    ChangeKind,
    ConfigurationError,
    apply_change,
    bootstrap_configuration,
)
from node.core.slots import (
    DispatcherPlan,
    SlotOwner,
    SlotTable,
    add_guest,
    assign,
    bootstrap_slots,
    plan_dispatchers,
    releasable,
    release,
)

PEERS = {"n0": ("127.0.0.1", 20000), "n1": ("127.0.0.1", 20002), "n2": ("127.0.0.1", 20004)}
BOOT = bootstrap_configuration(PEERS)


def test_the_bootstrap_slots_are_the_peers_positions_and_give_the_same_masks() -> None:
    t = bootstrap_slots(PEERS)
    assert len(t.owners) == MAX_MEMBERS
    assert [t.slot_of(x) for x in PEERS] == [0, 1, 2] and t.owners[3] is None
    c = apply_change(apply_change(BOOT, Change(ChangeKind.REMOVE, "n1"), 4),
                     Change(ChangeKind.ADD_LEARNER, "n1", *PEERS["n1"]), 7)
    assert assign(t, c).masks(c) == (0b101, 0b010)
    assert assign(t, c) == t  # re-added at its address: its unreleased slot back, nothing moves


def test_a_new_member_takes_the_lowest_free_slot_with_the_index_that_assigned_it() -> None:
    t = bootstrap_slots(PEERS)
    c = apply_change(BOOT, Change(ChangeKind.ADD_LEARNER, "n9", "10.0.0.9", 30000), 12)
    t2 = assign(t, c)
    assert t2.slot_of("n9") == 3 and t2.owners[3] == SlotOwner("n9", "10.0.0.9", 30000, 12)
    assert t2.masks(c) == (0b0111, 0b1000)
    assert assign(t2, c) == t2  # idempotent: a republish moves nothing


def test_a_removed_members_slot_is_held_leaving_until_released_then_reused_with_a_new_index() -> None:
    t = bootstrap_slots(PEERS)
    c1 = apply_change(BOOT, Change(ChangeKind.REMOVE, "n1"), 5)
    t1 = assign(t, c1)
    assert t1.owners[1] == SlotOwner("n1", "127.0.0.1", 20002, -1, removed_at=5)
    assert releasable(t1, committed_index=4) == []  # the removal may still be cut
    assert releasable(t1, committed_index=5) == [1]
    with pytest.raises(ConfigurationError, match="belongs to n0"):
        release(t1, 0)
    c2 = apply_change(c1, Change(ChangeKind.ADD_LEARNER, "n7", "10.0.0.7", 30000), 9)
    assert assign(t1, c2).slot_of("n7") == 3  # slot 1 is not released yet
    t3 = assign(release(t1, 1), c2)
    assert t3.slot_of("n7") == 1 and t3.owners[1].assigned_at == 9  # told apart from n1's
    assert t3.masks(c2) == (0b101, 0b010)


def test_a_member_re_added_before_its_release_takes_its_slot_back_no_longer_leaving() -> None:
    c1 = apply_change(BOOT, Change(ChangeKind.REMOVE, "n1"), 5)
    t1 = assign(bootstrap_slots(PEERS), c1)
    c2 = apply_change(c1, Change(ChangeKind.ADD_LEARNER, "n1", *PEERS["n1"]), 8)
    t2 = assign(t1, c2)
    assert t2.owners[1] == SlotOwner("n1", "127.0.0.1", 20002, -1) and releasable(t2, 99) == []
    assert assign(t1, c1) == t1  # a republish of the removal moves nothing


def test_an_id_moved_to_another_address_gets_a_new_slot_and_the_old_one_leaves() -> None:
    c1 = apply_change(BOOT, Change(ChangeKind.REMOVE, "n2"), 3)
    t = assign(bootstrap_slots(PEERS), c1)
    c = apply_change(c1, Change(ChangeKind.ADD_LEARNER, "n2", "10.0.0.2", 30000), 6)
    t2 = assign(t, c)
    assert t2.slot_of("n2") == 3 and t2.address_of("n2") == ("10.0.0.2", 30000)
    assert t2.owners[2].leaving and t2.owners[2].port == 20004
    assert t2.masks(c) == (0b011, 0b1000)
    assert releasable(t2, 6) == [2]
    assert assign(release(t2, 2), c).slot_of("n2") == 3  # nothing moves on a republish


def test_the_table_round_trips_through_json_and_refuses_damage() -> None:
    t = assign(bootstrap_slots(PEERS), apply_change(BOOT, Change(ChangeKind.REMOVE, "n1"), 5))
    assert SlotTable.from_json(json.loads(json.dumps(t.to_json()))) == t
    for bad in ([], [None] * 3, [{"id": "x"}] + [None] * (MAX_MEMBERS - 1),
                [{"id": "", "host": "h", "port": 1, "assigned_at": -1}] + [None] * (MAX_MEMBERS - 1)):
        with pytest.raises((ValueError, KeyError, TypeError)):
            SlotTable.from_json(bad)


def test_no_free_slot_is_a_clear_refusal() -> None:
    peers = {f"n{i}": ("127.0.0.1", 20000 + 2 * i) for i in range(MAX_MEMBERS)}
    base = bootstrap_configuration(peers)
    t = assign(bootstrap_slots(peers), apply_change(base, Change(ChangeKind.REMOVE, "n0"), 1))
    c = apply_change(apply_change(base, Change(ChangeKind.REMOVE, "n0"), 1),
                     Change(ChangeKind.ADD_LEARNER, "x", "10.0.0.1", 30000), 2)
    with pytest.raises(ConfigurationError, match="no free slot"):
        assign(t, c)


# plan_dispatchers: the supervisor's pass over its table (the simulator's model calls it too)

def _serving(table: SlotTable, *slots: int) -> dict[int, tuple[str, str, int]]:
    return {s: (table.owners[s].id, table.owners[s].host, table.owners[s].port) for s in slots}


def test_a_plan_starts_a_dispatcher_for_each_member_without_one_but_never_for_this_node() -> None:
    t = assign(bootstrap_slots(PEERS), apply_change(BOOT, Change(ChangeKind.ADD_LEARNER, "n9", "10.0.0.9", 30000), 12))
    assert plan_dispatchers(t, "n0", 12, 0, _serving(t, 1, 2), {1, 2}) == DispatcherPlan((3,), (), ())
    assert plan_dispatchers(t, "n0", 12, 0, _serving(t, 1, 2, 3), {1, 2, 3}).start == ()
    # one crashed and waiting for its restart still serves its member: no second one
    assert plan_dispatchers(t, "n0", 12, 0, _serving(t, 1, 2, 3), {1, 2}).start == ()
    # a slot whose earlier dispatcher still runs (an earlier owner's, stopping): wait for it
    assert plan_dispatchers(t, "n0", 12, 0, _serving(t, 1, 2), {1, 2, 3}).start == ()
    # serving the id at another address is not serving the member
    moved = {**_serving(t, 1, 2), 3: ("n9", "10.0.0.8", 30000)}
    assert plan_dispatchers(t, "n0", 12, 0, moved, {1, 2}).start == (3,)


def test_a_plan_retires_a_removed_member_only_once_its_removal_committed() -> None:
    t = assign(bootstrap_slots(PEERS), apply_change(BOOT, Change(ChangeKind.REMOVE, "n2"), 5))
    serving, running = _serving(t, 1, 2), {1, 2}
    assert plan_dispatchers(t, "n0", 4, 0, serving, running) == DispatcherPlan((), (), ())  # may be cut
    assert plan_dispatchers(t, "n0", 5, 0, serving, running) == DispatcherPlan((), (2,), ())
    # the block still names it the leader: kept until the elector moves on
    assert plan_dispatchers(t, "n0", 5, 2, serving, running).retire == ()
    # this node's own leaving slot: no dispatcher, never reused while it runs
    assert plan_dispatchers(t, "n2", 5, 0, _serving(t, 0, 1), {0, 1}).retire == ()


def test_a_plan_frees_a_guest_leader_once_it_is_a_member_and_no_longer_named_the_leader() -> None:
    t = add_guest(bootstrap_slots(PEERS), "n9")
    assert t.owners[3].guest
    serving = _serving(t, 1, 2)
    assert plan_dispatchers(t, "n0", 3, 3, serving, {1, 2}) == DispatcherPlan((), (), ())  # not a member yet
    t2 = assign(t, apply_change(BOOT, Change(ChangeKind.ADD_LEARNER, "n9", "10.0.0.9", 30000), 7))
    assert t2.slot_of("n9") == 4  # its member slot; the guest slot is spent
    assert plan_dispatchers(t2, "n0", 7, 3, serving, {1, 2}) == DispatcherPlan((4,), (), ())
    assert plan_dispatchers(t2, "n0", 7, 4, serving, {1, 2}) == DispatcherPlan((4,), (), (3,))
