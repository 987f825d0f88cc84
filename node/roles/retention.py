"""The retention service: the handler's once-a-second look at old data files.

It runs inside the handler because the handler is the store's only writer, and deleting a file
moves ledgerBegin, which must be published like any other ledger change. The decision itself is
node.core.retention (pure); this module gathers its facts — the disk (as the handler measured
it), the files, the committed index, the peers' watermarks from the shared block — and carries
it out, one file per pass so an unlink never stalls appends for long. Dispatchers notice the new ledgerBegin in the block and
unmap what was deleted, which is when the kernel gives the space back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from node.block.state_protocol import StateBlock
from node.config import NodeConfig
from node.core.apply import compaction_floor
from node.core.retention import DataFile, RetentionPlan, RetentionPolicy, plan_retention
from node.core.slots import SlotTable
from node.store.segment_store import SegmentStore

CHECK_MS = 1000
BUSY_RETRY_MS = 20


class RetentionService:
    def __init__(self, cfg: NodeConfig, store: SegmentStore, state: StateBlock, log: logging.Logger,
                 wall_clock: Callable[[], float], clock_ms: Callable[[], int]) -> None:
        """`wall_clock` (seconds since the epoch) dates the files for `file_reserved_hours`;
        `clock_ms` (monotonic ms) times a deletion for the log. Both come from the role's
        context, so a simulated handler runs on the simulator's time."""
        self.cfg, self.store, self.state, self.log = cfg, store, state, log
        self.wall_clock, self.clock_ms = wall_clock, clock_ms
        self.policy = RetentionPolicy(cfg.file_reserved_hours, cfg.disk_space_ratio_to_clean,
                                      cfg.disk_full_ratio)
        self.next_check_ms = 0
        # The node's slot table (the handler sets it): a member added later holds files too.
        self.slot_table: Callable[[], SlotTable] | None = None
        self._last_held: tuple[str, ...] = ()
        self._held_by_snapshot = False

    def due(self, now_ms: int) -> bool:
        return now_ms >= self.next_check_ms

    def run_once(self, now_ms: int, leading: bool, ratio: float) -> RetentionPlan:
        """Decide and delete, given how full the disk is (`disk_usage_ratio`, which the handler
        measures once a second for DISK_FULL as well); returns what was done (`files` == 0:
        nothing). The caller publishes the ledger when files were deleted."""
        self.next_check_ms = now_ms + CHECK_MS
        if ratio < self.policy.disk_space_ratio_to_clean:
            return RetentionPlan()  # the common case: no file listing, no stat calls
        files = [DataFile(*r) for r in self.store.data_file_ranges(self.policy.max_files + 1)]
        peers = {}
        # With a state machine a lagging peer does not hold files: what they held is covered
        # by a snapshot, which the leader installs on that peer (docs/snapshots.md "Install, end to
        # end").
        if leading and not self.cfg.state_machine:
            if self.slot_table is None:
                ids = self.cfg.peer_ids
                peers = {ids[p.slot]: p.match_index + 1 for p in self.state.read_peers()}
            else:
                table = self.slot_table()
                peers = {table.id_of(p.slot): p.match_index + 1
                         for p in self.state.read_peers(slots=[i for i, _ in table.held()])}
        floor = None
        if self.cfg.state_machine:  # entries after the newest snapshot are the state machine's state
            floor = compaction_floor(self.state.read_snapshot().snapshot_index)
        plan = plan_retention(files, now_s=self.wall_clock(), disk_usage_ratio=ratio,
                              committed_index=self.store.committed_index, peer_next_index=peers,
                              policy=self.policy, compaction_floor=floor)
        if plan.held_by_snapshot and not self._held_by_snapshot:
            self.log.warning("retention: disk %.0f%% full, but the oldest file holds entries after "
                             "the state machine's newest snapshot (index %d); keeping it until the "
                             "next snapshot", ratio * 100, floor)
        self._held_by_snapshot = plan.held_by_snapshot
        if plan.held_by != self._last_held and plan.held_by:
            self.log.warning("retention: disk %.0f%% full, but %s still need(s) the oldest file; "
                             "keeping it", ratio * 100, ", ".join(plan.held_by))
        self._last_held = plan.held_by
        if plan.files == 0:
            return plan
        begin = self.store.ledger_begin_index
        t0 = self.clock_ms()
        deleted = self.store.delete_before(plan.delete_before, wait=False)
        if deleted is None:  # the flush service is syncing: try again soon, never wait for it
            self.next_check_ms = now_ms + BUSY_RETRY_MS
            return RetentionPlan()
        self.state.incr("retention_files_deleted", deleted)
        self.log.info("retention: disk %.0f%% full; deleted %d data file(s) in %.1f ms, ledger "
                      "begin %d -> %d%s", ratio * 100, deleted, float(self.clock_ms() - t0),
                      begin, self.store.ledger_begin_index,
                      " (forced: the disk is at the full ratio)" if plan.forced else "")
        if plan.strands:
            self.log.error("retention forced past what %s had stored: this group has no state "
                           "machine, hence no snapshot to install; re-seed them from a replica's "
                           "store (docs/operations.md)", ", ".join(plan.strands))
        return RetentionPlan(plan.delete_before, deleted, plan.forced, plan.strands, plan.held_by)
