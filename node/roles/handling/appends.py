"""The leader's appends: APPEND, BATCH_APPEND and the single APPENDs of a MULTI frame.

`LeaderCore` decides (leadership, the session check, then capacity); this module executes: the
store write under the member lock after re-checking a fresh snapshot, the pending reply, the
answer to a recognised resend (where its entries are, once they are committed), a failed
write's DISK_FULL / DISK_ERROR (the elector steps down on `store_unwritable_ms`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.leader import (
    Admit,
    Duplicate,
    Placement,
    Refuse,
    Repeat,
)
from node.core.pending import Pending
from node.observe.role_metrics import store_end_pos
from node.roles.handling.common import DISK_CODES, store_error_code
from node.store.base import StoreError

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler


class LeaderAppends:
    """Writes admitted appends and registers their replies."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def on_append(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest) -> None:
        """A single APPEND or a BATCH: admitted by `LeaderCore.admit` (leadership, the session
        check, then capacity), written under the member lock, answered at commit."""
        batch = isinstance(req, P.BatchAppendRequest)
        n = len(req.bodies) if batch else 1
        now = self.h.now()
        m = self.h.state.read_member()
        session, seq = req.session, (req.first_seq if batch else req.seq)
        d = self.h.leader.admit(m, now, session, seq, n, self.h.ledger.disk_full_now, batch=batch)
        if not isinstance(d, Admit):
            self._answer_refusal(ident, req, d, n, m, now)
            return
        store = self.h.store
        done, refused = self._write_as_leader(
            (lambda t: store.append_batch_raw(req.bodies, t, session, seq)) if batch else
            (lambda t: store.append_leader(req.body, t, session=session, seq=seq)))
        if refused is not None:
            self.h.replies.error(ident, req, *refused, m=m)
            return
        term, r = done
        if batch:
            first, positions = r
            last, pos = first + n - 1, positions[0]
        else:
            first = last = r.index
            positions, pos = None, r.pos
        self.h.sessions.record(session, seq, first, n)
        self.h.pending.register(term, last, Pending(ident, req.request_id, first, positions, pos,
                                                  now + self.h.cfg.max_wait_ack_ms,
                                                  no_result=not batch and req.no_result))
        self._register_appended(1, n)

    def append_singles(self, ident: bytes, reqs: list[P.AppendRequest]) -> None:
        """Several single APPENDs from one MULTI: one store write per run of one session (one
        in all for a client's MULTI), one reply each. Each is decided by
        `LeaderCore.admit_in_frame` in order and answered at once when not admitted; a stamp
        the frame repeats is answered after the writes, as the resend it then is."""
        now = self.h.now()
        m = self.h.state.read_member()
        refused = self.h.leader.refuse_leadership(m, now)
        if refused is not None:
            for r in reqs:
                self.h.replies.error(ident, r, refused.code, refused.reason, m=m)
            return
        admitted: list[P.AppendRequest] = []
        repeats: list[P.AppendRequest] = []
        span: dict[int, tuple[int, int]] = {}
        for r in reqs:
            d = self.h.leader.admit_in_frame(span, r.session, r.seq, now, self.h.ledger.disk_full_now)
            if isinstance(d, Admit):
                admitted.append(r)
            elif isinstance(d, Repeat):
                repeats.append(r)
            else:
                self._answer_refusal(ident, r, d, 1, m, now)
        refused = self.h.leader.refuse_capacity(len(admitted), now, self.h.ledger.disk_full_now) if admitted else None
        if refused is not None:
            for r in admitted:
                self.h.replies.error(ident, r, refused.code, refused.reason, m=m)
            admitted = []
        start = 0
        for k in range(1, len(admitted) + 1):  # runs of consecutive requests of one session
            if k == len(admitted) or admitted[k].session != admitted[start].session:
                self._write_singles(ident, admitted[start:k], m, now)
                start = k
        for r in repeats:
            d = self.h.leader.decide_repeat(r.session, r.seq, now, self.h.ledger.disk_full_now)
            self._answer_refusal(ident, r, d, 1, m, now)

    def _write_singles(self, ident: bytes, reqs: list[P.AppendRequest], m: MemberView, now: int) -> None:
        n, session = len(reqs), reqs[0].session
        seqs = [r.seq for r in reqs] if session else 0
        done, refused = self._write_as_leader(
            lambda t: self.h.store.append_batch_raw([r.body for r in reqs], t, session, seqs))
        if refused is not None:
            for r in reqs:
                self.h.replies.error(ident, r, *refused, m=m)
            return
        term, (first, positions) = done
        self.h.sessions.record(session, reqs[0].seq, first, n)
        deadline = now + self.h.cfg.max_wait_ack_ms
        for i, r in enumerate(reqs):
            self.h.pending.register(term, first + i, Pending(ident, r.request_id, first + i, None, positions[i],
                                                           deadline, no_result=r.no_result))
        self._register_appended(n, n)

    def _answer_refusal(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest,
                        d: Refuse | Duplicate, n: int, m: MemberView, now: int) -> None:
        """Answer an append the core did not admit: a refusal, or a resend with its index."""
        if isinstance(d, Duplicate):
            self.answer_duplicate(ident, req, d.first, n, m, now)
        else:
            self.h.replies.error(ident, req, d.code, d.reason, m=m)

    def answer_duplicate(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest, first: int,
                          n: int, m: MemberView, now: int) -> None:
        """Answer a retry with where its entries already are, as the first attempt would have
        been answered: once they are committed. Entries retention already deleted were
        committed (it deletes nothing else): the retry is answered with their index, and with
        -1 for the term and positions it can no longer read."""
        batch = isinstance(req, P.BatchAppendRequest)
        last = first + n - 1
        if first < self.h.store.ledger_begin_index:
            positions, entry_term = [-1] * n, -1
        else:
            try:
                entries = [self.h.store.get(i, verify_crc=False) for i in range(first, first + n)]
            except (StoreError, OSError) as e:  # the client knows an attempt may be stored: indeterminate
                self.h.replies.error(ident, req, RC.INTERNAL_ERROR, f"duplicate of entries {first}..: {e}"[:200], m=m)
                return
            positions, entry_term = [e.pos for e in entries], entries[0].term
        p = Pending(ident, req.request_id, first, positions if batch else None, positions[0],
                    now + self.h.cfg.max_wait_ack_ms, entry_term=entry_term,
                    no_result=not batch and req.no_result)
        placed = self.h.leader.place_duplicate(last, n, self.h.store.committed_index)
        if placed is Placement.COMPLETE:
            self.h.completion.complete(self.h.leader_term, last, p, RC.SUCCESS)
        elif placed is Placement.PENDING_FULL:  # retryable: the client resends it under the same stamp
            self.h.replies.error(ident, req, RC.LEADER_PENDING_FULL, "", m=m)
        else:
            self.h.pending.register(self.h.leader_term, last, p)

    def _write_as_leader(self, write: Callable[[int], Any]) -> tuple[tuple[int, Any] | None, tuple[RC, str] | None]:
        """Run the store write under the member lock, after re-checking (fresh snapshot) that this
        node still leads its term with a lease, so "I lead term T → append with T → publish the
        ledger end" cannot interleave with the elector raising the term or granting a vote.
        Returns ((term, result), None) or (None, (code, reason))."""
        term = self.h.leader_term
        try:
            with self.h.lock:
                m = self.h.state.read_member()
                if not self.h.leader.leading(m, self.h.now()):
                    return None, (RC.NOT_LEADER, "")
                end0, pos0 = self.h.store.ledger_end_index, store_end_pos(self.h.store)
                result = write(term)
                self.h.ledger.publish()
                self.h.metrics.wrote(self.h.store.ledger_end_index - end0, store_end_pos(self.h.store) - pos0)
        except (StoreError, OSError) as e:
            code = store_error_code(e)
            self.h.state.incr("append_errors")
            self.h.log.error("append in term %d failed: %s", term, e)
            if code in DISK_CODES:
                self.h.ledger.mark_unwritable(True)
            return None, (RC[code], str(e)[:200])
        self.h.ledger.mark_unwritable(False)
        return (term, result), None

    def _register_appended(self, requests: int, entries: int) -> None:
        """Book-keeping once an append's pending replies are registered."""
        self.h.state.incr("appends", requests)
        self.h.state.incr("entries_appended", entries)
        self.h.ledger.wake_dispatchers()
        if self.h.single:
            self.h.completion.commit_to(self.h.store.ledger_end_index)
