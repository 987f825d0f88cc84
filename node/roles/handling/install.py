"""The follower handler's half of install snapshot.

A leader whose log no longer holds what this follower needs streams its newest snapshot in
INSTALL chunks. The handler checks each one like a push (this term, this leader:
`FollowerCore.on_install`), then hands it to the applier, which owns the snapshot directory
and the state machine: it writes the chunk, and once the snapshot is whole and verified it
publishes it and restores its state from it. Only then does the handler touch the log
(`FollowerCore.snapshot_installed`): keep it if it holds the snapshot's last entry, else
`reset_to` it so it begins after the snapshot. That order is what makes a crash at any point
safe: the log is never reset to a snapshot the state machine does not have, and a snapshot
installed but not yet applied to the log is found again by the leader's next probe (the
applier answers `installed` at once, and the reset happens then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.follower import ForwardInstall, InstallReply, StoreReset
from node.core.membership import Configuration
from node.statemachine.snapshot_meta import SnapshotMeta
from node.wiring import channels

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

INSTALL_TIMEOUT_MS = 120_000  # the last chunk's answer waits for verify + restore of a big state


class FollowerInstall:
    """INSTALL requests, the applier's answers to them, and the log reset."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def on_install(self, ident: bytes, req: P.InstallRequest) -> None:
        m = self.h.state.read_member()
        if self.h.sm_link is None:
            self.reply(InstallReply(ident, req, RC.UNSUPPORTED, m.current_term))
            return
        self.h.pushes.execute(self.h.follower.on_install(ident, req, m), m)

    def reply(self, e: InstallReply) -> None:
        key = self.h.follower.key
        self.h.replies.send(e.ident, P.InstallResponse(e.code, self.h.cfg.group, e.term,
                                               self.h.slot_id(key[1]) if key else "",
                                               e.received, e.installed, e.req.request_id))

    def forward(self, e: ForwardInstall, m: MemberView) -> None:
        r = e.req
        self.h.applier.to_applier(e.ident, r, 0,
                         channels.encode_install_chunk(bytes(r.meta), r.offset, r.data),
                         INSTALL_TIMEOUT_MS, m, kind=channels.QueryKind.INSTALL)

    def on_progress(self, ident: bytes, req: P.InstallRequest, status: int,
                             answer: bytes) -> None:
        """The applier's answer to a chunk: progress, a refusal (where to continue), or done."""
        m = self.h.state.read_member()
        if status in (channels.QUERY_OK, channels.QUERY_REFUSED) \
                and len(answer) == channels.INSTALL_PROGRESS.size:
            received, installed, index, term = channels.INSTALL_PROGRESS.unpack(answer)
            if status == channels.QUERY_REFUSED:
                self.reply(InstallReply(ident, req, RC.INCONSISTENT_STATE, m.current_term, received))
            elif installed:
                self.h.pushes.execute(self.h.follower.snapshot_installed(ident, req, index, term, m, self.h.store), m)
            else:
                self.reply(InstallReply(ident, req, RC.SUCCESS, m.current_term, received))
            return
        reason = answer.decode(errors="replace")[:200]
        self.h.log.error("install from %s refused by the applier: %s", req.leader_id, reason)
        self.h.replies.error(ident, req, RC.STATE_MACHINE_ERROR, reason, m=m)

    def store_reset(self, e: StoreReset, view: MemberView) -> bool:
        """Reset the log to begin after the installed snapshot (under the member lock). False:
        it failed (the caller answers an error instead of `installed`; the leader retries)."""
        try:
            with self.h.lock:
                fresh = self.h.state.read_member()
                if e.index <= self.h.store.committed_index:
                    return True  # committed meanwhile: the log already holds that prefix
                self.h.log.info("log reset to begin after the installed snapshot %d/%d (it held "
                              "%d..%d, committed %d)", e.index, e.term, self.h.store.ledger_begin_index,
                              self.h.store.ledger_end_index, self.h.store.committed_index)
                base = self.h.configs.before_reset(e.index, _snapshot_configuration(e.meta))
                self.h.store.reset_to(e.index, e.term)
                self.h.configs.after_reset(e.index, base)
                self.h.ledger.publish()
        except Exception as err:  # noqa: BLE001 - StoreError/OSError: any failure is answered
            self.h.log.error("log reset to snapshot %d/%d failed: %s", e.index, e.term, err)
            self.h.pushes.execute(self.h.follower.write_failed(view), view)
            return False
        self.h.pushes.execute(self.h.follower.reset_done(e.index, fresh), fresh)
        return True


def _snapshot_configuration(meta: bytes) -> Configuration | None:
    """The configuration an installed snapshot's meta records (the applier parsed the same
    meta before installing it, so it is well-formed); None: none recorded, the bootstrap one."""
    if not meta:
        return None
    return SnapshotMeta.from_json(meta, "the installed snapshot's meta").config()
