"""The applier's decisions, as data: where replay starts, what to apply next, when to snapshot,
and which prefix of the log a snapshot lets retention delete.

The applier role (node/roles/applier.py) feeds committed entries to the state machine in index
order. Its state machine lives in its memory only, so after any restart it is rebuilt from the
newest snapshot plus the log after it: that is what makes "each index applied exactly once"
hold across restarts (the state after a restart is the function of the same log prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_APPLY_ENTRIES = 1024
"""Entries per `apply` call at most: a bound on how long a query or a snapshot waits."""


class ReplayGap(Exception):
    """The log no longer holds entries the state machine needs (it starts after the snapshot
    the state machine was restored from): the node cannot rebuild its state by itself."""


def replay_start(snapshot_index: int, ledger_begin_index: int, ledger_end_index: int) -> int:
    """The first index to apply after restoring the snapshot at `snapshot_index` (-1: none).

    The log must hold every entry after the snapshot: a log that begins later (retention
    deleted entries no snapshot covers, or the store was replaced) is a `ReplayGap`. An empty
    log (end -1) has nothing to replay yet."""
    start = snapshot_index + 1
    if ledger_end_index >= 0 and ledger_begin_index > start:
        raise ReplayGap(f"the log begins at index {ledger_begin_index}, but the state machine "
                        f"needs the entries from {start}"
                        + (f" (after its snapshot at {snapshot_index})" if snapshot_index >= 0
                           else " (it has no snapshot)"))
    return start


def next_run(applied_index: int, committed_index: int,
             max_entries: int = MAX_APPLY_ENTRIES) -> tuple[int, int] | None:
    """The inclusive index range to apply next, or None when everything committed is applied."""
    if committed_index <= applied_index:
        return None
    return applied_index + 1, min(committed_index, applied_index + max_entries)


def snapshot_due(applied_index: int, snapshot_index: int, threshold: int) -> bool:
    """True when `threshold` entries or more were applied since the newest snapshot."""
    return applied_index - snapshot_index >= threshold


@dataclass(frozen=True, slots=True)
class ParkedQuery:
    """A read waiting until this replica has applied its read index."""

    tag: int
    read_index: int
    request: bytes
    reply_to: bytes  # the handler socket's identity (ROUTER routing id)


def due_queries(parked: list[ParkedQuery], applied_index: int) -> tuple[list[ParkedQuery], list[ParkedQuery]]:
    """(ready to answer, still waiting): a read is answered once the state reflects at least
    its read index (the leader's committed index when its leadership was confirmed)."""
    ready = [q for q in parked if q.read_index <= applied_index]
    return ready, [q for q in parked if q.read_index > applied_index]


def compaction_floor(snapshot_index: int) -> int:
    """The highest index retention may delete on a node with a state machine: nothing after
    the newest snapshot (a restart replays from there). -1: nothing may go."""
    return snapshot_index
