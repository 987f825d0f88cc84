"""Taking and losing leadership: one member snapshot per turn says whether this handler still
leads; losing it fails pending replies and parked reads; taking it writes the new term's NOOP
first (it commits every earlier entry with it), then rebuilds the client sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc.codes import ResponseCode as RC
from node.roles.handling.common import DISK_CODES, store_error_code
from node.store import codec
from node.store.base import StoreError

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler


class Leadership:
    """The handler's side of a role change (the elector decides it)."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def sync(self, m: MemberView, now: int) -> None:
        """Leader side of one member snapshot: lose leadership (fail pending replies and parked
        reads), or take it by writing the term's NOOP (only while the lease holds, and not
        before the retry time after a failed NOOP)."""
        if self.h.leader.still_leads(m):
            return
        if self.h.leader_term != -1:
            self.h.log.debug("no longer leader of term %d", self.h.leader_term)
            self.h.completion.fail_all()
            self.h.reads.fail_all(RC.NOT_LEADER)
            self.h.leader.step_down()
        if self.h.leader.may_take(m, now):
            self._become_leader(m.current_term, now)

    def _become_leader(self, term: int, now: int) -> None:
        """Append the new term's NOOP before serving: it commits every earlier entry with it."""
        try:
            with self.h.lock:
                m = self.h.state.read_member()
                if m.current_term != term or not self.h.leader.holds(m, now):
                    return
                r = self.h.store.append_leader(b"", term, codec.MAGIC_NOOP)
                self.h.ledger.publish()
        except (StoreError, OSError) as e:
            code = store_error_code(e)
            backoff = self.h.leader.noop_failed(now)
            self.h.log.error("cannot append the NOOP of term %d (%s), retrying in %d ms: %s", term, code,
                           backoff, e)
            if code in DISK_CODES:
                self.h.ledger.mark_unwritable(True)
            return
        self.h.ledger.mark_unwritable(False)
        self.h.leader.noop_written(term, r.index)
        self.h.log.info("leading term %d from index %d (NOOP)", term, r.index)
        self.h.session_ids.rebuild()
        self.h.ledger.wake_dispatchers()
        if self.h.single:
            self.h.completion.commit_to(r.index)
