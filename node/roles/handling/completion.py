"""Commit and pending completion: the committed index moves (the ack checker's quorum index, or
at once in a one-member group), pending appends are answered — SUCCESS with the state
machine's results when there is one, WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED
(indeterminate for the client) otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.core.pending import Pending
from node.core.results import AwaitingResults, ResultCache
from node.wiring import channels

if TYPE_CHECKING:
    from node.roles.handler import Handler


class Completion:
    """Answers pending appends."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        # state machine (cfg.state_machine): results of applied entries, replies waiting for them
        self.results = ResultCache()
        self.awaiting = AwaitingResults()

    def commit_to(self, index: int) -> None:
        if index <= self.h.store.committed_index:
            return
        self.h.store.set_committed_index(index)
        self.h.ledger.publish()
        self.h.state.incr("commits_published")
        due = self.h.pending.complete(self.h.store.committed_index)
        self.h.metrics.completed(self.h.now(), due)
        for term, last, p in due:
            self.complete(term, last, p, RC.SUCCESS)

    def apply_quorum(self) -> None:
        if self.h.leader_term < 0:
            return
        q = self.h.state.read_quorum()
        if q.quorum_term == self.h.leader_term:
            self.commit_to(min(q.quorum_index, self.h.store.ledger_end_index))

    def complete(self, term: int, last: int, p: Pending, code: RC) -> None:
        """Answer a pending append. With a state machine, SUCCESS waits for the results of its
        entries (parked in `awaiting` until the applier sends them) — unless the client said it
        wants none (FLAG_NO_RESULT, a KV put whose revision is its index): then at commit, one
        applier round trip sooner. A linearizable read after it still sees it: reads wait for
        their read index (>= this entry) to be applied."""
        results = None
        if code == RC.SUCCESS and self.h.sm_link is not None and not p.no_result:
            got = self.results.lookup(p.first_index, last)
            if got is None:  # committed, not applied yet: answered with its results later
                self.awaiting.park(term, last, p)
                return
            if isinstance(got, list):
                results = got
            else:
                self.h.log.debug("results of %d..%d no longer known: answered without them", p.first_index, last)
        self.send(term, last, p, code, results)

    def send(self, term: int, last: int, p: Pending, code: RC,
                         results: list[bytes | None] | None) -> None:
        leader = self.h.cfg.id if code == RC.SUCCESS else ""
        if code == RC.SUCCESS and p.entry_term is not None:
            term = p.entry_term  # a recognised retry: the term its entries were written in
        if code != RC.SUCCESS:
            msg = P.ErrorResponse(code, self.h.cfg.group, term, leader, "", int(
                P.MsgType.BATCH_APPEND if p.positions is not None else P.MsgType.APPEND), p.request_id)
        elif p.positions is not None:
            msg = P.BatchAppendResponse(code, self.h.cfg.group, term, leader, p.first_index, p.positions,
                                        p.request_id, results)
        else:
            msg = P.AppendResponse(code, self.h.cfg.group, term, leader, last, p.pos, p.request_id,
                                   results[0] if results else None)
        self.h.replies.send(p.ident, msg)

    def on_results(self, frame: bytes) -> None:
        """Input: the applier's results of a run of applied entries."""
        got = channels.decode_results(frame)
        if got is None:
            self.h.log.warning("malformed results frame (%d bytes) ignored", len(frame))
            return
        self.results.put(*got)
        for term, last, p, results in self.awaiting.release(self.results):
            self.send(term, last, p, RC.SUCCESS, results)

    def expire_pending(self, now: int) -> None:
        for term, last, p in self.h.pending.expire(now):
            self.h.state.incr("append_errors")
            self.complete(term, last, p, RC.WAIT_QUORUM_ACK_TIMEOUT)

    def fail_all(self) -> None:
        for term, last, p in self.h.pending.fail_all():
            self.complete(term, last, p, RC.TERM_CHANGED)

    def expire_awaiting(self, now: int) -> None:
        if len(self.awaiting):
            for term, last, p in self.awaiting.stale(now, self.h.state.get("applied_index")):
                self.send(term, last, p, RC.SUCCESS, None)
