"""Client sessions on the leader: opening a session (its id from `LeaderCore.open_session`,
recorded in the store directory before it is handed out) and rebuilding the session table
from the log's newest entries when leadership starts."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.leader import (
    Refuse,
    ReserveIds,
    SessionGranted,
)
from node.core.sessions import SessionTable
from node.store.base import StoreError
from node.store.stamps import session_stamps

if TYPE_CHECKING:
    from node.roles.handler import Handler

SESSION_FILE = "sessions"
"""`<term> <counter>`: session ids handed out in that term go up to counter (store dir)."""


class SessionIds:
    """OPEN_SESSION, the session-id record, the table's rebuild."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def on_open_session(self, ident: bytes, req: P.OpenSessionRequest) -> None:
        """A new session id: (term mod 2**16, counter), unique among this leader's (only one
        leader opens sessions in a term) and skipping ids its table still holds."""
        now = self.h.now()
        m = self.h.state.read_member()
        if not self.h.leader.leading(m, now):
            self.h.replies.error(ident, req, RC.NOT_LEADER, m=m)
            return
        step = self.h.leader.open_session()
        while isinstance(step, ReserveIds):
            if not self._reserve(step.upto):
                self.h.replies.error(ident, req, RC.DISK_ERROR, f"cannot record session ids in {SESSION_FILE}", m=m)
                return
            step = self.h.leader.reserved(step.upto)
        if isinstance(step, Refuse):
            self.h.replies.error(ident, req, step.code, step.reason, m=m)
            return
        granted: SessionGranted = step
        self.h.replies.send(ident, P.OpenSessionResponse(RC.SUCCESS, self.h.cfg.group, self.h.leader_term,
                                                         self.h.cfg.id, granted.session, req.request_id))

    def _reserve(self, new: int) -> bool:
        """Record, before handing them out, that ids up to counter `new` of this term may be
        in use (`LeaderCore.open_session` says when and how far). Why: a handler that crashes
        and restarts while its node still leads the term starts counting again; ids it handed
        out whose sessions have not appended yet are in no log, so it would hand them out
        twice (the simulator found two writers sharing one session, one answered with the
        other's index). A process crash
        keeps the page cache, and a node restart starts a new term, so no fsync is needed."""
        path = os.path.join(self.h.cfg.store_dir, SESSION_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(f"{self.h.leader_term} {new}\n")
            os.replace(path + ".tmp", path)
        except OSError as e:
            self.h.log.error("cannot record session ids in %s: %s", path, e)
            return False
        return True

    def _handed_out(self) -> int:
        """The counter a handler (re)starting to lead `leader_term` continues from."""
        try:
            with open(os.path.join(self.h.cfg.store_dir, SESSION_FILE)) as f:
                term, n = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            return 0
        return n if term == self.h.leader_term else 0

    def rebuild(self) -> None:
        """A new leader's session table, from the newest `session_scan_entries` entries."""
        t0 = self.h.now()
        table: SessionTable | None = self.h.sessions
        try:
            table.rebuild(session_stamps(self.h.store, self.h.cfg.session_scan_entries))
        except (StoreError, OSError, struct.error) as e:  # retries then get SESSION_EXPIRED: indeterminate
            self.h.log.error("cannot rebuild the client sessions from the log: %s", e)
            table = None
        self.h.leader.start_sessions(table, self._handed_out())
        self.h.log.info("client sessions: %d known from the newest %d entries (%d ms)", len(self.h.sessions),
                      min(self.h.cfg.session_scan_entries, self.h.store.ledger_end_index + 1), self.h.now() - t0)
