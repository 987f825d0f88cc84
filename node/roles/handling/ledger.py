"""What the handler publishes about its store, and the store's room.

The ledger (begin, end, term, committed index, generation) and the repair index go to the
shared block after every store write; the dispatchers are woken once per burst of appends; the
applier is hinted when the committed index moved; `store_unwritable_ms` tells the elector
whether this node can write (it steps down and does not stand while not); the disk usage is
measured at most once a second (DISK_FULL refusals, retention, `dledger status`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.observe.role_metrics import store_end_pos
from node.store.base import StoreError

if TYPE_CHECKING:
    from node.roles.handler import Handler

DISK_CHECK_MS = 1000
ROOM_PROBE_MS = 1000  # unwritable store: how often to ask it whether it has room again
FOLLOWER_APPLY_RUN = 256  # a follower wakes its applier once this many entries committed unapplied


class LedgerPublisher:
    """The store's single writer's publishing, and its disk measurements."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.unwritable = False  # mirrors store_unwritable_ms != 0 (we are its only writer)
        self.next_room_probe_ms = 0  # while unwritable: when to ask the store whether it has room
        self.disk_ratio = 0.0  # disk_usage_ratio(store dir), measured at most once a second
        self.disk_full = False
        self.next_disk_check = 0
        self._appended = False  # entries written since the dispatchers were last woken
        self._hinted_commit = -1  # the committed index the applier was last woken for
        self._published_repair = -1  # the block's repair_index as last written

    def publish(self) -> None:
        s = self.h.store
        self.h.state.write_ledger(ledger_begin_index=s.ledger_begin_index, ledger_end_index=s.ledger_end_index,
                                ledger_end_term=s.ledger_end_term, committed_index=s.committed_index,
                                store_generation=s.generation, **self.h.configs.published())
        repair = getattr(s, "repair_index", -1)
        if self.h.damage.found is not None:
            repair = max(repair, self.h.damage.found[2])
        if repair != self._published_repair:
            # After the ledger: the elector reads both under the member lock, and a repair
            # that just ended is only ever published together with the ledger that ends it.
            self.h.state.set("repair_index", repair)
            if repair < 0:
                self.h.log.warning("store repaired: committed entries up to %d are here again",
                                 self._published_repair)
            else:
                self.h.log.warning("store repairing: does not vote until entries up to %d are "
                                 "committed here again (committed %d)", repair, s.committed_index)
            self._published_repair = repair
        self.h.metrics.published(store_end_pos(s))
        if self.h.sm_link is not None and self._apply_hint_due(s.committed_index):
            self._hinted_commit = s.committed_index
            self.h.sm_link.committed_moved()

    def _apply_hint_due(self, committed: int) -> bool:
        """Whether to wake the applier for this commit move. A leader's applier: always (its
        results answer appends). A follower's applier need only keep up, not apply each entry
        as it commits: waking it on every push put four more process wake-ups into each put's
        critical path on 2 cores. So a follower hints once FOLLOWER_APPLY_RUN entries piled
        up (the applier's own IDLE_POLL_MS poll bounds the lag otherwise), and at once while
        a read waits on this node (a follower read needs its read index applied promptly)."""
        if committed == self._hinted_commit:
            return False
        return (self.h.leader_term != -1 or bool(self.h.applier.queries) or bool(self.h.applier.follower_reads)
                or committed - self._hinted_commit >= FOLLOWER_APPLY_RUN)

    def mark_unwritable(self, failed: bool) -> None:
        """Tell the elector whether this node can write (`store_unwritable_ms`): a leader that
        cannot steps down, and a node that cannot does not stand for election."""
        if failed:
            self.unwritable = True
            self.h.state.set("store_unwritable_ms", max(1, self.h.now()))
        elif self.unwritable:
            self.unwritable = False
            self.h.state.set("store_unwritable_ms", 0)

    def probe_room(self, now: int) -> None:
        """While the store is marked unwritable, ask it every ROOM_PROBE_MS whether it has room
        again. Only a leader's successful write used to clear the mark, and a node that stepped
        down for a full disk never leads again to make one: once space was back it still
        refused to stand for ever, and with a second node down the group had no leader (found
        by the simulator's disk-full fault). Follower appends that succeed clear it too."""
        if not self.unwritable or now < self.next_room_probe_ms:
            return
        self.next_room_probe_ms = now + ROOM_PROBE_MS
        if self.h.store.has_room():
            self.h.log.info("the store has room again: standing for election again")
            self.mark_unwritable(False)

    def wake_dispatchers(self) -> None:
        """Mark new entries; the loop publishes once per burst of requests (`flush_wake`).
        On 2 cores every ZeroMQ send costs a context switch to the I/O thread, so one wake-up
        per burst instead of one per append is most of what single appends cost."""
        self._appended = True

    def flush_wake(self) -> None:
        if self._appended:
            self._appended = False
            self.h.transport.appended(self.h.store.ledger_end_index)

    def check_disk(self, now: int) -> None:
        if now >= self.next_disk_check:
            self.next_disk_check = now + DISK_CHECK_MS
            try:
                self.disk_ratio = self.h.rc.disk_usage(self.h.cfg.store_dir)
            except OSError:
                self.disk_ratio = 0.0
            self.disk_full = self.disk_ratio > self.h.cfg.disk_full_ratio

    def disk_full_now(self, now: int) -> bool:
        """`LeaderCore`'s capacity probe: the disk measurement, at most once a second."""
        self.check_disk(now)
        return self.disk_full

    def run_retention(self, now: int) -> None:
        """Delete old data files if the disk asks for it (node.roles.retention); a failure is
        logged and retried next pass, never fatal to the handler."""
        self.check_disk(now)  # one measurement serves both DISK_FULL and retention
        try:
            done = self.h.retention.run_once(now, self.h.leader_term != -1, self.disk_ratio)
        except (StoreError, OSError) as e:
            self.h.log.error("retention pass failed: %s", e)
            return
        if done.files:
            self.publish()
