"""The leader's pending-reply table (DLedger's pendingAppendResponsesByTerm), as data.

An append is answered only once its last entry is committed. The handler registers the reply
under (term, last index) when it has written the entries, and this table says which replies are
due: SUCCESS once the committed index covers them (`complete`), WAIT_QUORUM_ACK_TIMEOUT when
`max_wait_ack_ms` passed (`expire`), TERM_CHANGED when leadership is lost (`fail_all`). The
last two are *indeterminate* for the client: the entry may still commit.

Entries are registered in index order (the handler is the only writer of its log), so the table
is a FIFO and every decision looks at its head only. It counts entries, not requests, because
the admission bound (`max_pending_requests`, LEADER_PENDING_FULL) is in entries.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class Pending:
    """One client reply waiting for its entries to commit."""

    ident: bytes
    request_id: int
    first_index: int
    positions: list[int] | None  # None for a single APPEND
    pos: int
    deadline_ms: int
    # The term the entries were written in, when it is not the term the reply is registered
    # under: a retry recognised by a later leader is answered with where its entries are
    # (-1: no longer known, retention deleted them). None: the registered term.
    entry_term: int | None = None
    # The client wants no state-machine result (FLAG_NO_RESULT, a KV put): answered at commit,
    # not once the applier applied the entry.
    no_result: bool = False

    @property
    def count(self) -> int:
        return len(self.positions) if self.positions is not None else 1


Due = tuple[int, int, Pending]
"""(term, last index, reply) of a reply to send now."""


class PendingTable:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._table: OrderedDict[tuple[int, int], Pending] = OrderedDict()
        self.entries = 0

    def __len__(self) -> int:
        return len(self._table)

    def full(self, n: int) -> bool:
        """Would `n` more entries exceed the bound? (LEADER_PENDING_FULL)"""
        return self.entries + n > self.max_entries

    def register(self, term: int, last: int, p: Pending) -> None:
        """The entries `p` waits for were written in `term`, ending at `last`. A second reply
        for the same entries (a client session's retry, node/core/sessions.py) replaces the
        first in place: the retrying client gave up on the first attempt. One registered for
        entries below the tail (a retry of an entry an earlier leader wrote) is answered when
        the head reaches it, all entries before it being committed by then."""
        old = self._table.get((term, last))
        if old is not None:
            self.entries -= old.count
        self._table[(term, last)] = p
        self.entries += p.count

    def _pop_head(self) -> Due:
        (term, last), p = self._table.popitem(last=False)
        self.entries -= p.count
        return term, last, p

    def complete(self, committed: int) -> list[Due]:
        """Replies whose last entry is at or below `committed`: answer SUCCESS."""
        out = []
        while self._table:
            (_term, last), _p = next(iter(self._table.items()))
            if last > committed:
                break
            out.append(self._pop_head())
        return out

    def expire(self, now_ms: int) -> list[Due]:
        """Replies whose deadline passed: answer WAIT_QUORUM_ACK_TIMEOUT."""
        out = []
        while self._table:
            p = next(iter(self._table.values()))
            if p.deadline_ms > now_ms:
                break
            out.append(self._pop_head())
        return out

    def fail_all(self) -> list[Due]:
        """Every reply (leadership lost or the process stops): answer TERM_CHANGED."""
        out = []
        while self._table:
            out.append(self._pop_head())
        return out

    def next_deadline(self) -> int | None:
        """The oldest reply's deadline (None when empty)."""
        return next(iter(self._table.values())).deadline_ms if self._table else None
