"""Which old data files to delete (docs/operations.md "Disk space and retention", DLedger's
CleanSpaceService): pure.

The handler asks once a second with the facts — its data files oldest first, how full the disk
is, the committed index and, on a leader, how far each peer has stored — and deletes what the
answer says (`SegmentStore.delete_before`). Keeping the decision here, free of I/O, is what
lets every rule below be tested as a table.

The rules, in DLedger's terms:
- Nothing is deleted while the disk is below `disk_space_ratio_to_clean`: a log is kept as long
  as there is room for it.
- Above it, whole files go, oldest first, when *every* entry in them is committed, the file was
  last written more than `file_reserved_hours` ago, and (on a leader) every peer has stored
  them — a lagging follower keeps the leader's files, because without a state machine there
  is no snapshot to install, and a follower that needs a deleted entry must be re-seeded by
  hand. (With a state machine the caller passes no peers: a lagging follower is sent the
  leader's snapshot instead: docs/snapshots.md "Install, end to end".)
- At or above `disk_full_ratio` the node is refusing appends (DISK_FULL). Then retention
  *forces* (DLedger's diskSpaceRatioToForceClean): committed files go whatever their age and
  whatever a lagging peer still needs, and those peers are named so the operator knows to
  re-seed them. A group that stays writable beats history nobody reserved room for.
- Never the file being written, never an uncommitted entry, and never a gap: only a prefix.
- On a node with a state machine, never an entry after its newest snapshot
  (`compaction_floor`, node.core.apply): a restarted applier restores that snapshot and
  replays the log after it, so those entries are its state. Not even forced.
- At most `max_files` per pass, so one pass never stalls the handler for long.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file: the first and last entry index it holds, and when it was last written."""

    first_index: int
    last_index: int
    modified_s: float


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    file_reserved_hours: float
    disk_space_ratio_to_clean: float
    disk_full_ratio: float
    max_files: int = 1


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """Delete every entry below `delete_before` (-1: nothing), i.e. the first `files` files."""

    delete_before: int = -1
    files: int = 0
    forced: bool = False
    strands: tuple[str, ...] = ()  # peers that will need entries this deletes (forced only)
    held_by: tuple[str, ...] = ()  # peers whose lag kept a file that was otherwise due
    held_by_snapshot: bool = False  # the state machine's newest snapshot kept a file that was due


NOTHING = RetentionPlan()


def plan_retention(files: Sequence[DataFile], *, now_s: float, disk_usage_ratio: float,
                   committed_index: int, peer_next_index: Mapping[str, int],
                   policy: RetentionPolicy, compaction_floor: int | None = None) -> RetentionPlan:
    """What to delete now. `peer_next_index` is, on a leader, each other peer's match index + 1
    (the first entry it still needs); empty on a follower, which serves no one.
    `compaction_floor`: with a state machine, the newest snapshot's index (-1: none): nothing
    after it may go."""
    if disk_usage_ratio < policy.disk_space_ratio_to_clean or len(files) < 2:
        return NOTHING
    forced = disk_usage_ratio >= policy.disk_full_ratio
    expired_before = now_s - policy.file_reserved_hours * HOUR_S
    needed_from = min(peer_next_index.values(), default=None)
    count, held, by_snapshot = 0, set(), False
    for f in files[:-1]:  # never the file being written
        if count >= policy.max_files or f.last_index > committed_index:
            break
        if compaction_floor is not None and f.last_index > compaction_floor:
            by_snapshot = True
            break
        if not forced:
            if f.modified_s > expired_before:
                break
            if needed_from is not None and f.last_index >= needed_from:
                held = {p for p, nxt in peer_next_index.items() if f.last_index >= nxt}
                break
        count += 1
    if count == 0:
        return RetentionPlan(held_by=tuple(sorted(held)), held_by_snapshot=by_snapshot)
    before = files[count - 1].last_index + 1
    strands = tuple(sorted(p for p, nxt in peer_next_index.items() if nxt < before)) if forced else ()
    return RetentionPlan(before, count, forced, strands, tuple(sorted(held)), by_snapshot)
