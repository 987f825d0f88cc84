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

A member the newest configuration no longer names keeps its slot as **leaving**
(`removed_at`: the index of the configuration that dropped it) until the supervisor released
it: the removal must commit first (until then the member still counts and must still get the
log), then its dispatcher is stopped, then its record reset. A member removed and added back
at the same address before its slot was released takes its old slot back (no longer leaving):
its dispatcher never stopped and still sends to that address. An id added back at another
address gets a new slot; the old one stays leaving under the old address until released.

Pure functions over an immutable table: the handler computes it when it publishes a
configuration; each node's table is its own (slots are local to a node's block, so nodes need
not agree on them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from node.core.membership import MAX_MEMBERS, Configuration, ConfigurationError, Member


@dataclass(frozen=True, slots=True)
class SlotOwner:
    """Who holds a slot: the member's id and address, and the configuration index that assigned
    it (-1: the bootstrap, a `--peers` position)."""

    id: str
    host: str
    port: int
    assigned_at: int
    removed_at: int = -1  # >= 0: leaving, dropped by that configuration entry (module docstring)
    public_key: str = ""  # Z85, as the configuration names it ("" without keys)
    # A leader this node follows though no configuration in its log names it (its log lacks
    # the entry that added it): a slot to name it in the block, no address, no dispatcher.
    guest: bool = False

    @property
    def leaving(self) -> bool:
        return self.removed_at >= 0

    def to_json(self) -> dict:
        return {"id": self.id, "host": self.host, "port": self.port,
                "assigned_at": self.assigned_at, "removed_at": self.removed_at,
                "public_key": self.public_key, "guest": self.guest}

    @staticmethod
    def from_json(d: Mapping) -> SlotOwner:
        """Raises ValueError/KeyError/TypeError on a malformed record (the caller says where)."""
        o = SlotOwner(str(d["id"]), str(d["host"]), int(d["port"]), int(d["assigned_at"]),
                      int(d.get("removed_at", -1)), str(d.get("public_key", "")), bool(d.get("guest", False)))
        if not o.id or not (o.guest or 0 < o.port < 65535):
            raise ValueError(f"slot owner {d!r}")
        return o


@dataclass(frozen=True, slots=True)
class SlotTable:
    """`owners[slot]`: the slot's owner, None when free. Always MAX_MEMBERS long (the block
    holds that many peer records)."""

    owners: tuple[SlotOwner | None, ...]

    def slot_of(self, node_id: str) -> int | None:
        """The slot `node_id` holds as a member; else as a guest leader; else a leaving one."""
        guest = leaving = None
        for i, o in enumerate(self.owners):
            if o is not None and o.id == node_id:
                if o.guest:
                    guest = i if guest is None else guest
                elif not o.leaving:
                    return i
                else:
                    leaving = i if leaving is None else leaving
        return guest if guest is not None else leaving

    def id_of(self, slot: int) -> str:
        """The member id of `slot` ("" for a free slot or one out of range)."""
        o = self.owners[slot] if 0 <= slot < len(self.owners) else None
        return "" if o is None else o.id

    def address_of(self, node_id: str) -> tuple[str, int] | None:
        slot = self.slot_of(node_id)
        if slot is None:
            return None
        o = self.owners[slot]
        return o.host, o.port  # type: ignore[union-attr]

    def held(self) -> list[tuple[int, SlotOwner]]:
        """(slot, owner) of every held slot, leaving ones too (each has a dispatcher); guests
        too (no dispatcher: callers that dial skip them)."""
        return [(i, o) for i, o in enumerate(self.owners) if o is not None]

    def configuration(self, index: int, voters: int, learners: int) -> Configuration:
        """The inverse of `masks`: the configuration the block's words name, members in slot
        order (what a counting role reads). Raises ConfigurationError when a bit names a free
        slot (a table older than the words: read the table again)."""
        members = []
        for i, o in enumerate(self.owners):
            bit = 1 << i
            if (voters | learners) & bit:
                if o is None:
                    raise ConfigurationError(f"configuration entry {index}: slot {i} is free here")
                members.append(Member(o.id, o.host, o.port, bool(voters & bit), o.public_key))
        return Configuration(tuple(members), index)

    def member_keys(self) -> dict[str, str]:
        """{member id: Z85 public key} of every held slot whose configuration named a key."""
        return {o.id: o.public_key for _, o in self.held() if o.public_key}

    def to_json(self) -> list:
        return [None if o is None else o.to_json() for o in self.owners]

    @staticmethod
    def from_json(items: list) -> SlotTable:
        """Raises ValueError (KeyError, TypeError) on a malformed table."""
        if not isinstance(items, list) or len(items) != MAX_MEMBERS:
            raise ValueError(f"a slot table of {MAX_MEMBERS} entries expected")
        return SlotTable(tuple(None if x is None else SlotOwner.from_json(x) for x in items))

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
    re-added at the same address takes its unreleased slot back, no longer leaving); a new
    member, or one at a new address, takes the lowest free slot with `assigned_at` =
    config.index; a held slot whose owner `config` does not name (at that address) becomes
    leaving, `removed_at` = config.index, until `release`. Raises ConfigurationError when no
    slot is free (released slots are too few)."""
    owners = list(table.owners)
    wanted = {(m.id, m.host, m.port): m.public_key for m in config.members}
    for i, o in enumerate(owners):
        if o is None or o.guest:
            continue  # a guest leaves when the supervisor sees its id hold a member's slot
        key = wanted.get((o.id, o.host, o.port))
        if key is not None:
            if o.leaving or (key and key != o.public_key):  # back, or a key the entry names
                owners[i] = SlotOwner(o.id, o.host, o.port, o.assigned_at, -1, key or o.public_key)
        elif not o.leaving:
            owners[i] = SlotOwner(o.id, o.host, o.port, o.assigned_at, config.index, o.public_key)
    for m in config.members:
        if any(o is not None and not o.guest and (o.id, o.host, o.port) == (m.id, m.host, m.port)
               for o in owners):
            continue
        free = next((i for i, o in enumerate(owners) if o is None), None)
        if free is None:
            raise ConfigurationError(f"configuration entry {config.index}: no free slot for {m.id} "
                                     f"(all {MAX_MEMBERS} held; a removed member's slot is free once "
                                     "its removal committed and its dispatcher stopped)")
        owners[free] = SlotOwner(m.id, m.host, m.port, config.index, -1, m.public_key)
    return SlotTable(tuple(owners))


def releasable(table: SlotTable, committed_index: int) -> list[int]:
    """Leaving slots whose removal has committed: their dispatchers may stop and the slots be
    released. (A removal not yet committed may still be cut, which brings the member back.)"""
    return [i for i, o in enumerate(table.owners)
            if o is not None and o.leaving and o.removed_at <= committed_index]


def add_guest(table: SlotTable, leader_id: str) -> SlotTable:
    """`leader_id` followed as a guest (SlotOwner.guest) in the lowest free slot; the table
    unchanged if it holds that id already. ConfigurationError when no slot is free."""
    if table.slot_of(leader_id) is not None:
        return table
    owners = list(table.owners)
    free = next((i for i, o in enumerate(owners) if o is None), None)
    if free is None:
        raise ConfigurationError(f"no free slot to follow leader {leader_id}")
    owners[free] = SlotOwner(leader_id, "", 0, -1, -1, "", True)
    return SlotTable(tuple(owners))


def spent_guests(table: SlotTable) -> list[int]:
    """Guest slots whose id now holds a member's slot (its entry reached this log): free them
    (no dispatcher to stop; record reset) once nothing names the guest slot."""
    members = {o.id for o in table.owners if o is not None and not o.guest and not o.leaving}
    return [i for i, o in enumerate(table.owners) if o is not None and o.guest and o.id in members]


def release(table: SlotTable, slot: int) -> SlotTable:
    """Free `slot` (its member's dispatcher stopped, its record reset). Only a leaving slot or a
    guest can be released: a member's is counted."""
    o = table.owners[slot]
    if o is not None and not o.leaving and not o.guest:
        raise ConfigurationError(f"slot {slot} belongs to {o.id}, a member")
    owners = list(table.owners)
    owners[slot] = None
    return SlotTable(tuple(owners))


Address = tuple[str, str, int]
"""(id, host, port): whom a dispatcher sends to."""


@dataclass(frozen=True, slots=True)
class DispatcherPlan:
    """What a node's supervisor does next for its slot table (`plan_dispatchers`)."""

    start: tuple[int, ...]
    """Slots whose member needs a dispatcher started now."""
    retire: tuple[int, ...]
    """Leaving slots whose removal committed: stop their dispatchers for good, and release each
    slot once none of its dispatchers runs any more."""
    free_guests: tuple[int, ...]
    """Guest slots to release now (no dispatcher to stop)."""


def plan_dispatchers(table: SlotTable, self_id: str, committed_index: int, leader_slot: int,
                     serving: Mapping[int, Address], running: Collection[int]) -> DispatcherPlan:
    """One pass of "one dispatcher per held slot" (docs/membership.md "Processes"), the rules
    the supervisor and the simulator's model of it both follow.

    `serving`: slot -> the member a dispatcher of that slot is for and will go on being for
    (running, or waiting for its restart after a crash; not one being stopped for good).
    `running`: slots with any dispatcher process still alive, stopping ones included.

    * A member holding a slot (not this node, not leaving, not a guest) gets a dispatcher unless
      one already serves it at that address; not while an earlier one of the slot still runs
      (one writer per peer record: the caller drops the exited ones and starts the new one).
    * A guest slot whose id became a member is freed, unless the block still names it the
      leader (freed once the elector names the leader by its member slot).
    * A leaving slot whose removal committed is retired, except this node's own (never reused
      while it runs) and the block's leader slot (the block still names it the leader).
    """
    start = []
    for slot, o in table.held():
        if o.id == self_id or o.leaving or o.guest:
            continue
        if serving.get(slot) == (o.id, o.host, o.port) or slot in running:
            continue
        start.append(slot)
    guests = tuple(g for g in spent_guests(table) if g != leader_slot)
    retire = []
    for slot in releasable(table, committed_index):
        o = table.owners[slot]
        if o is None or o.id == self_id or slot == leader_slot:
            continue
        retire.append(slot)
    return DispatcherPlan(tuple(start), tuple(retire), guests)
