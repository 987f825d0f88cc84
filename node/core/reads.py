"""Reads sent to the state machine before leadership is confirmed (docs/performance.md,
proposal 3), as data.

A read-index read needs two things before it may be answered: a heartbeat round that started
after the read arrived reached a quorum (this node was still the leader after the read began),
and the state machine applied the read index (the committed index when the read arrived:
every write acknowledged before the read began is at or below it). Neither depends on the
other, so the leader's handler sends the read to its applier the moment it arrives and asks
its elector for the round at the same time; this table holds the applier's answer until the
round lands. Done one after the other, the applier's round trip (~0.3 ms on 2 cores) was added
to the heartbeat round's (~0.6 ms) on every read.

The table only decides; the handler sends. `settle` is called with what one snapshot of the
shared block says (C4: the block is the truth): the term this node leads, if any, and the start
of the last quorum round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

A = TypeVar("A")


@dataclass(slots=True)
class _Early(Generic[A]):
    arrived_ms: int
    term: int
    deadline_ms: int
    answer: A | None = None


class EarlyReads(Generic[A]):
    """Reads forwarded to the applier and not yet confirmed, by the handler's query tag."""

    def __init__(self) -> None:
        self._reads: dict[int, _Early[A]] = {}

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, tag: int, arrived_ms: int, term: int, deadline_ms: int) -> None:
        """Read `tag` arrived at `arrived_ms` while this node led `term`; not confirmed by
        `deadline_ms` it fails with TIMEOUT."""
        self._reads[tag] = _Early(arrived_ms, term, deadline_ms)

    def hold(self, tag: int, answer: A) -> bool:
        """The applier answered `tag`. True: keep it (not confirmed yet; `settle` releases it);
        False: not an unconfirmed read (confirmed already, or never early): answer now."""
        r = self._reads.get(tag)
        if r is None:
            return False
        r.answer = answer
        return True

    def settle(self, leading_term: int | None, quorum_ms: int,
               now_ms: int) -> tuple[list[A], list[tuple[int, str]]]:
        """What the block says now: (answers to send now, [(tag, "NOT_LEADER" | "TIMEOUT")]
        reads to fail). A read is confirmed once this node still leads its term and a quorum
        round started at or after it arrived; a confirmed read whose answer has not come yet
        leaves the table (its answer is sent when it comes). Leading another term, or none:
        NOT_LEADER. Past its deadline: TIMEOUT."""
        release: list[A] = []
        failed: list[tuple[int, str]] = []
        for tag, r in list(self._reads.items()):
            if leading_term != r.term:
                failed.append((tag, "NOT_LEADER"))
            elif quorum_ms >= r.arrived_ms:
                if r.answer is not None:
                    release.append(r.answer)
            elif now_ms >= r.deadline_ms:
                failed.append((tag, "TIMEOUT"))
            else:
                continue
            del self._reads[tag]
        return release, failed

    def fail_all(self) -> list[int]:
        """Every tag, removed (leadership lost, the handler closing)."""
        tags = list(self._reads)
        self._reads.clear()
        return tags


__all__ = ["EarlyReads"]
