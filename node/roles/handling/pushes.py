"""The follower side: the leader's pushes, decided by `node.core.follower.FollowerCore` on ONE
member snapshot per request; this module executes its effects — store writes under the member
lock after re-checking that a fresh snapshot still shows the same leadership, replies,
publishing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.follower import (
    ForwardInstall,
    InstallReply,
    Reply,
    SetCommitted,
    StoreAppend,
    StoreReset,
    StoreTruncate,
    same_leadership,
)
from node.roles.handling.common import DISK_CODES, store_error_code
from node.roles.handling.configs import check_configuration_run, find_configurations
from node.store import codec
from node.store.base import StoreError

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler


class FollowerPushes:
    """Executes FollowerCore's effects."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def on_push(self, ident: bytes, req: P.PushRequest, frame: bytes) -> None:
        """One member snapshot for the whole request (two reads could mix two leaderships): the
        core validates and decides on it; writes re-check it under the member lock."""
        self.h.state.incr("push_requests")
        m = self.h.state.read_member()
        self.execute(self.h.follower.on_push(ident, req, frame, m, self.h.now(), self.h.store), m)
        if req.kind == P.PushKind.APPEND:
            self.drain(m)

    def drain(self, m: MemberView) -> None:
        """Apply queued pushes the log has reached, one at a time (each depends on the last)."""
        for _ in range(self.h.cfg.max_pending_pushes + 1):
            effects = self.h.follower.drain(m, self.h.store)
            if not effects:
                return
            self.execute(effects, m)

    def execute(self, effects: list, view: MemberView) -> None:
        """Carry out the follower core's effects in order. A failed `StoreReset` turns the
        `installed` answer after it into an error (the leader tries again)."""
        reset_failed = False
        for e in effects:
            if isinstance(e, InstallReply):
                if reset_failed and e.installed:
                    e = InstallReply(e.ident, e.req, RC.DISK_ERROR, e.term)  # noqa: PLW2901
                self.h.install.reply(e)
            elif isinstance(e, ForwardInstall):
                self.h.install.forward(e, view)
            elif isinstance(e, StoreReset):
                reset_failed = not self.h.install.store_reset(e, view)
            elif isinstance(e, Reply):
                self.reply(e.ident, e.req, e.code, e.term, x_term=e.x_term, x_index=e.x_index)
            elif isinstance(e, SetCommitted):
                self._set_committed(e.index)
            elif isinstance(e, StoreAppend):
                self._store_append(e, view)
            elif isinstance(e, StoreTruncate):
                self._store_truncate(e, view)

    def reply(self, ident: bytes, req: P.PushRequest, code: RC, term: int, *, x_term: int = -1,
                    x_index: int = -1) -> None:
        s = self.h.store
        key = self.h.follower.key
        leader = self.h.slot_id(key[1]) if key else ""
        self.h.replies.send(ident, P.PushResponse(code, self.h.cfg.group, term, leader, s.ledger_end_index,
                                          s.ledger_begin_index, s.ledger_end_index, x_term, x_index,
                                          req.request_id))

    def _set_committed(self, index: int) -> None:
        if index > self.h.store.committed_index:
            try:
                self.h.store.set_committed_index(index)
            except (StoreError, OSError) as e:
                self.h.log.error("cannot record committed index %d: %s", index, e)
                return
            self.h.ledger.publish()

    def _write_refused(self, e: BaseException, what: str, ident: bytes, req: P.PushRequest,
                       view: MemberView) -> None:
        """A follower-side store write failed: answer with the store's code if it is a disk
        problem (DISK_FULL / DISK_ERROR), else INCONSISTENT_STATE (the leader compares again),
        and forget what was verified."""
        code = store_error_code(e)
        self.h.log.error("%s refused: %s", what, e)
        self.reply(ident, req, RC[code] if code in DISK_CODES else RC.INCONSISTENT_STATE,
                         view.current_term)
        self.execute(self.h.follower.write_failed(view), view)

    def _store_append(self, e: StoreAppend, view: MemberView) -> None:
        s = self.h.store
        try:
            with self.h.lock:
                fresh = self.h.state.read_member()
                if not same_leadership(view, fresh):
                    self.reply(e.ident, e.req, RC.INCONSISTENT_TERM, fresh.current_term)
                    return
                # configuration entries go to DIR/configuration before the log (configs.py)
                found = find_configurations(e.blob, s.ledger_end_index + 1, e.recs)
                if found:
                    check_configuration_run(e.blob, e.recs, e.run_crc)
                configs = self.h.configs.before_store(found) if found else []
                new_end = s.append_follower(e.blob, e.recs, run_crc=e.run_crc)
                self.h.configs.stored(configs)
                committed = self.h.follower.appended(new_end, e.req.commit_index, s.committed_index)
                if committed > s.committed_index:
                    s.set_committed_index(committed)
                self.h.ledger.publish()
        except (StoreError, codec.CodecError, OSError) as err:
            self._write_refused(err, f"push at {e.req.first_index}", e.ident, e.req, view)
            return
        self.h.ledger.mark_unwritable(False)  # a write succeeded: the store can be written again
        self.reply(e.ident, e.req, RC.SUCCESS, view.current_term)

    def _store_truncate(self, e: StoreTruncate, view: MemberView) -> None:
        try:
            with self.h.lock:
                fresh = self.h.state.read_member()
                if not same_leadership(view, fresh):
                    self.reply(e.ident, e.req, RC.INCONSISTENT_TERM, fresh.current_term)
                    return
                s = self.h.store
                if e.cut <= s.ledger_end_index:
                    self.h.log.info("truncating from index %d (leader %s, term %d)", e.cut,
                                  e.req.leader_id, e.req.term)
                    if (e.cut == s.ledger_begin_index and e.cut > 0 and s.log_base is None
                            and e.base_term >= 0):
                        # The whole log goes, and retention deleted the entry before it: the
                        # empty log begins after that (committed) entry, whose term the leader
                        # sent (FollowerCore TRUNCATE).
                        s.reset_to(e.cut - 1, e.base_term)
                    else:
                        s.truncate(e.cut)
                    self.h.configs.truncated(e.cut)
                    self.h.ledger.publish()
        except (StoreError, OSError) as err:
            self._write_refused(err, f"truncate({e.cut})", e.ident, e.req, view)
            return
        self.h.follower.truncated(e.req)
        self.reply(e.ident, e.req, RC.SUCCESS, view.current_term)
