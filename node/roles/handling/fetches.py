"""FETCH: the long-poll read a follower of the log uses (docs/client.md "Following the log").

Any member answers, whatever its role, from its own log and only up to the committed index it
knows: committed entries are the same on every member (Raft's Log Matching and Leader
Completeness), so a reader may take entry i from one member and entry i + 1 from another
without a gap or a repeat, as long as it asks for the index it needs next. A member that has
nothing from the requested index yet holds the request up to its `wait_ms` and answers as
soon as its committed index reaches it — one answer per commit advance, no polling: the wait
costs a parked record and a deadline in the handler's loop, nothing else.

A member that knows no leader (a candidate, a follower that lost its leader) does not hold a
request: its committed index cannot move until a leader is elected, so it answers at once
with no entries and no leader, and the client asks another member instead of waiting on a
partitioned one.

The entries are checked as GET checks them (every header and CRC, `reads.committed_blob`): a
member never serves a damaged entry; it marks the range for repair and answers DISK_ERROR,
and the client reads the range from another member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.roles.handling.reads import MAX_GET_BYTES, ReadFailed, committed_blob

if TYPE_CHECKING:
    from node.roles.handler import Handler
    from node.shared_state import MemberView

MAX_FETCH_WAIT_MS = 60_000
"""The longest a member holds one FETCH: a client asking for more is held this long."""
MAX_PARKED_FETCHES = 10_000
"""Held FETCH requests per member; past it a new one is answered at once (empty), so a reader
flood costs the handler a bounded list and a reader only an earlier empty answer."""


@dataclass(slots=True)
class ParkedFetch:
    ident: bytes
    req: P.FetchRequest
    deadline_ms: int


def knows_leader(m: MemberView) -> bool:
    """This member's committed index can move: it leads, or follows a leader it knows."""
    return m.role == Role.LEADER or (m.role == Role.FOLLOWER and m.leader_slot >= 0)


class Fetches:
    """FETCH requests: answered from the log, or held until the committed index reaches them."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.parked: list[ParkedFetch] = []

    def on_fetch(self, ident: bytes, req: P.FetchRequest) -> None:
        m = self.h.state.read_member()
        if req.index < 0 or req.max_entries <= 0 or req.max_bytes <= 0:
            self.h.replies.error(ident, req, RC.UNEXPECTED_ARGUMENT,
                                 "index must be >= 0, max_entries and max_bytes > 0", m=m)
            return
        s = self.h.store
        if s.ledger_begin_index >= 0 and req.index < s.ledger_begin_index:
            self.h.replies.error(ident, req, RC.INDEX_LESS_THAN_LOCAL_BEGIN,
                                 f"the log begins at {s.ledger_begin_index} on {self.h.cfg.id}", m=m)
            return
        if req.index <= self._readable_end() or req.wait_ms == 0 or not knows_leader(m) \
                or len(self.parked) >= MAX_PARKED_FETCHES:
            self.answer(ident, req, m)
            return
        wait = min(req.wait_ms, MAX_FETCH_WAIT_MS)
        self.parked.append(ParkedFetch(ident, req, self.h.now() + wait))

    def _readable_end(self) -> int:
        """The last index this member may serve: committed, and still in its log (a range cut
        for repair lies past the ledger end until it is fetched again)."""
        s = self.h.store
        return min(s.committed_index, s.ledger_end_index)

    def answer(self, ident: bytes, req: P.FetchRequest, m: MemberView,
               cache: dict[tuple[int, int, int], bytes] | None = None) -> None:
        """Answer with the committed entries from `req.index` (none when there are none yet)."""
        s = self.h.store
        blob = b""
        end = self._readable_end()
        if req.index <= end:
            count = min(req.max_entries, end - req.index + 1)
            nbytes = min(req.max_bytes, MAX_GET_BYTES)
            key = (req.index, count, nbytes)
            got = cache.get(key) if cache is not None else None
            if got is None:
                try:
                    got = committed_blob(self.h, req.index, count, nbytes)
                except ReadFailed as e:
                    self.h.replies.error(ident, req, e.code, e.reason, m=m)
                    return
                if cache is not None:
                    cache[key] = got
            blob = got
        self.h.state.incr("fetches")
        if blob:
            self.h.state.incr("fetched_entries", count)
        self.h.replies.send(ident, P.FetchResponse(
            RC.SUCCESS, self.h.cfg.group, m.current_term,
            self.h.slot_id(m.leader_slot) if knows_leader(m) else "",
            s.ledger_begin_index, s.committed_index, blob, req.request_id))

    def release(self, m: MemberView, now: int) -> None:
        """Answer the held requests the committed index now reaches, those whose wait is over,
        and all of them when this member no longer knows a leader. Readers waiting at the same
        index (the usual case: all caught up) share one read of the log."""
        if not self.parked:
            return
        end = self._readable_end()
        leaderless = not knows_leader(m)
        keep: list[ParkedFetch] = []
        cache: dict[tuple[int, int, int], bytes] = {}
        for p in self.parked:
            if p.req.index <= end or p.deadline_ms <= now or leaderless:
                self.answer(p.ident, p.req, m, cache)
            else:
                keep.append(p)
        self.parked = keep

    def next_deadline(self) -> int | None:
        return min((p.deadline_ms for p in self.parked), default=None)

    def fail_all(self, code: RC) -> None:
        held, self.parked = self.parked, []
        for p in held:
            self.h.replies.error(p.ident, p.req, code)
