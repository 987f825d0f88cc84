"""Damaged committed entries: found by recovery at open, by the scrub of what recovery left
unchecked (one step per loop turn) or by a read.

The store cuts and records them (`SegmentStore.mark_damaged`) and the handler publishes the
repair index (block `repair_index`), so the elector stops voting and standing until the
leader's pushes have brought the range back (docs/store.md "Repair from peers"). A leader does
not cut its log under its dispatchers: the cut waits until the block no longer says LEADER,
and `LeaderCore.damaged` keeps the handler from leading meanwhile."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ipc.codes import Role
from node.store.base import StoreCorruptError, StoreError

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

SCRUB_STEP_BYTES = 1 << 20  # data the scrub checks per step (~1-3 ms of CPU)
SCRUB_DELAY_MS = int(os.environ.get("DLEDGER_SCRUB_DELAY_MS", "5000"))
"""The scrub starts this long after the store opened (the environment variable is for tests
that must reach an unchecked entry through a read before the scrub does)."""
SCRUB_PAUSE_FACTOR = 2  # pause after a scrub step: this many times what the step took


class DamageRepair:
    """The store's one damage path, and the paced scrub."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self._found: tuple[int, str, int] | None = None
        self.unchecked_published = -1  # unchecked_end_index as last published
        self.next_scrub_ms = 0  # when the scrub's next step is due

    @property
    def found(self) -> tuple[int, str, int] | None:
        """(first damaged index, why, repair target) found by a read or the scrub, cut once
        this node no longer leads (`cut`): a leader must not cut its log under its dispatchers."""
        return self._found

    @found.setter
    def found(self, value: tuple[int, str, int] | None) -> None:
        self._found = value
        self.h.leader.damaged = value is not None  # no leading while a damaged entry waits

    def opened(self, unchecked_end: int, now: int) -> None:
        """The store opened: a dispatcher checks what it pushes at or below `unchecked_end`
        (recovery left it unchecked), published before the ledger (and so before this node
        can lead); the scrub starts `scrub_delay_ms` from now."""
        self.unchecked_published = unchecked_end
        self.h.state.set("unchecked_end_index", unchecked_end)
        self.next_scrub_ms = now + self.h.scrub_delay_ms

    def store_damaged(self, lo: int, hi: int, why: str) -> None:
        """A read found damage among entries [lo, hi): find the first entry that fails its
        checks and hand it to the store's one damage path (`SegmentStore.mark_damaged`),
        under the member lock like every follower write, then publish: the elector sees
        `repair_index` and steps down / stops voting; the leader's catch-up brings the range
        back. Any other role (or a background check) that finds damage must get it here: the
        handler is the store's one writer. A store that cannot cut there stops the node."""
        s = self.h.store
        first = -1
        for i in range(max(lo, s.ledger_begin_index), min(hi, s.ledger_end_index + 1)):
            try:
                s.get(i)
            except (StoreError, OSError):
                first = i
                break
        if first < 0:
            return  # a race with a truncation, not damage: the read is simply answered with an error
        with self.h.lock:
            if s.fix_index_records(first):  # only the derived index was wrong: nothing lost
                try:
                    s.get(first)
                    return
                except (StoreError, OSError):
                    pass
        self.damaged_at(first, why)

    def damaged_at(self, first: int, why: str) -> None:
        """Entry `first` is damaged (a read or the scrub said so): record it, publish the repair
        index, and cut once this node no longer leads (`cut`)."""
        s = self.h.store
        if self.h.single:  # nobody to fetch the range from: serving on would hide the loss
            self.h.rc.fatal(f"store {self.h.cfg.store_dir}: committed entry {first} is damaged ({why}); a "
                          "one-member group has no peer to repair it from: restore the store from a "
                          "backup or a copy")
        if self.found is None or first < self.found[0]:
            self.found = (first, why, max(s.committed_index, s.ledger_end_index))
        self.h.log.error("entry %d is damaged (%s): stepping down if leading, then repairing", first, why)
        self.h.ledger.publish()  # repair_index: the elector stops voting and a leader steps down
        self.h.completion.fail_all()
        self.cut(self.h.state.read_member())

    def cut(self, m: MemberView) -> None:
        """The second half of `store_damaged`, once the block no longer says LEADER (the
        elector stepped down on `repair_index`): cut the log at the damaged entry through the
        store's one damage path. Until then nothing is cut: the dispatchers still read this
        log, and `LeaderCore.leading` is already False so nothing new is written to it."""
        if self.found is None or m.role == Role.LEADER:
            return
        first, why, _target = self.found
        try:
            with self.h.lock:
                self.h.store.mark_damaged(first, why)
                self.found = None
                self.h.ledger.publish()
        except StoreError as e:
            self.h.rc.fatal(f"store {self.h.cfg.store_dir}: damaged entry {first} cannot be repaired "
                          f"in place: {e}")

    def scrub(self, now: int) -> None:
        """One step of the scrub of the entries recovery left unchecked (SegmentStore
        .scrub_step, SCRUB_STEP_BYTES, so a request waits at most a few ms for it); damage
        goes to the node's damage path. Publishes `unchecked_end_index` = -1 once done.

        Paced: the first step SCRUB_DELAY_MS after the store opened (the other roles start
        then, on the same cores), and then the pause after each step is SCRUB_PAUSE_FACTOR
        times what the step took (a third of a core at most). Nothing waits for the scrub: an
        unchecked entry is checked by whoever reads it first."""
        if now < self.next_scrub_ms or self.found is not None:
            return
        t0 = self.h.now()  # the role's clock, not the wall clock: a simulated run must replay
        try:
            self.h.store.scrub_step(SCRUB_STEP_BYTES)
        except StoreCorruptError as e:  # names the first bad entry (base.committed_damage)
            self.damaged_at(getattr(e, "index", self.h.store.unchecked_end), str(e))
        took_ms = self.h.now() - t0
        self.next_scrub_ms = now + max(1, int(took_ms * SCRUB_PAUSE_FACTOR))
        end = self.h.store.unchecked_end
        if end != self.unchecked_published:
            self.unchecked_published = end
            self.h.state.set("unchecked_end_index", end)
