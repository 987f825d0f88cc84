"""Which peer slot of the state block each member occupies (docs/membership.md "Processes").

The block's peer records are indexed by slot: a dispatcher writes its follower's watermark in
its slot, the ack checker and the elector count slots, and `config_voters` /
`config_learners` are bit masks over them. While the members are the `--peers` members a slot
is a position in `--peers`. A member added later needs a slot too, and a slot freed by a removed
member may be given to another one; two rules keep that safe:

* **A member keeps its slot while it is in the newest configuration.** A role that counted
  slot 3 as n4 a moment ago still does: watermarks are never moved between records.
* **A slot is reused only after it was released** (`release`: the removed member's dispatcher
  stopped and its record was reset), and a reused slot is told apart by `assigned_at`, the
  configuration index that gave it to its owner: a role that read slot 3 under another
  assignment knows the owner changed (an old watermark is not the new member's).

A member removed and added back at the same address before its slot was released takes its
old slot back: its dispatcher never stopped and still sends to that address.

Pure functions over an immutable table: the handler computes it when it publishes a
configuration; each node's table is its own (slots are local to a node's block, so nodes need
not agree on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from node.core.membership import MAX_MEMBERS, Configuration, ConfigurationError


@dataclass(frozen=True, slots=True)
class SlotOwner:
    """Who holds a slot: the member's id and address, and the configuration index that assigned
    it (-1: the bootstrap, a `--peers` position)."""

    id: str
    host: str
    port: int
    assigned_at: int


@dataclass(frozen=True, slots=True)
class SlotTable:
    """`owners[slot]`: the slot's owner, None when free. Always MAX_MEMBERS long (the block
    holds that many peer records)."""

    owners: tuple[SlotOwner | None, ...]

    def slot_of(self, node_id: str) -> int | None:
        for i, o in enumerate(self.owners):
            if o is not None and o.id == node_id:
                return i
        return None

    def masks(self, config: Configuration) -> tuple[int, int]:
        """(voters, learners) of `config` as bit masks over these slots; a member without a
        slot raises ConfigurationError (assign first)."""
        voters = learners = 0
        for m in config.members:
            slot = self.slot_of(m.id)
            if slot is None:
                raise ConfigurationError(f"configuration entry {config.index}: member {m.id} has no slot")
            if m.voter:
                voters |= 1 << slot
            else:
                learners |= 1 << slot
        return voters, learners


def bootstrap_slots(peer_map: Mapping[str, tuple[str, int]]) -> SlotTable:
    """Slot p: the p-th `--peers` member (what every block held before slots were assigned)."""
    if len(peer_map) > MAX_MEMBERS:
        raise ConfigurationError(f"{len(peer_map)} peers, at most {MAX_MEMBERS}")
    owners: list[SlotOwner | None] = [SlotOwner(pid, h, p, -1) for pid, (h, p) in peer_map.items()]
    return SlotTable(tuple(owners + [None] * (MAX_MEMBERS - len(owners))))


def assign(table: SlotTable, config: Configuration) -> SlotTable:
    """The table once `config` is the newest configuration: its members keep their slots (one
    re-added at the same address takes its unreleased slot back); a new member takes the lowest
    free slot, `assigned_at` = config.index; slots of members not in `config` stay held until
    `release`. Raises ConfigurationError when no slot is free (released slots are too few)."""
    owners = list(table.owners)
    for m in config.members:
        slot = table.slot_of(m.id)
        if slot is not None and (owners[slot].host, owners[slot].port) == m.address:  # type: ignore[union-attr]
            continue
        if slot is not None:
            raise ConfigurationError(f"configuration entry {config.index}: member {m.id} at "
                                     f"{m.host}:{m.port}, its slot {slot} is still held at "
                                     f"{owners[slot].host}:{owners[slot].port}")  # type: ignore[union-attr]
        free = next((i for i, o in enumerate(owners) if o is None), None)
        if free is None:
            raise ConfigurationError(f"configuration entry {config.index}: no free slot for {m.id} "
                                     f"(all {MAX_MEMBERS} held; a removed member's slot is free once "
                                     "its dispatcher stopped)")
        owners[free] = SlotOwner(m.id, m.host, m.port, config.index)
    return SlotTable(tuple(owners))


def releasable(table: SlotTable, config: Configuration) -> list[int]:
    """Slots held by members that `config` does not name (their dispatchers are to stop once
    `config` commits)."""
    return [i for i, o in enumerate(table.owners) if o is not None and config.member(o.id) is None]


def release(table: SlotTable, slot: int, config: Configuration) -> SlotTable:
    """Free `slot` (its member's dispatcher stopped, its record reset). A slot whose owner is a
    member of `config` cannot be released: it is counted."""
    o = table.owners[slot]
    if o is not None and config.member(o.id) is not None:
        raise ConfigurationError(f"slot {slot} belongs to {o.id}, a member of configuration {config.index}")
    owners = list(table.owners)
    owners[slot] = None
    return SlotTable(tuple(owners))
