"""FETCH: the long-poll read a follower of the log uses (docs/client.md "Following the log").

Any member answers, whatever its role, from its own log and only up to the committed index it
knows: committed entries are the same on every member (Raft's Log Matching and Leader
Completeness), so a reader may take entry i from one member and entry i + 1 from another
without a gap or a repeat, as long as it asks for the index it needs next. A member that has
nothing from the requested index yet holds the request up to its `wait_ms` and answers as
soon as its committed index reaches it — one answer per commit advance, no polling: the wait
costs a parked record and a deadline in the handler's loop, nothing else.

**A budget: while the log is being written, readers get at most `FETCH_SHARE` of the
handler's time.** Answers then go out in rounds, and a round that took d seconds spaces the
next one by d x (1 - share) / share: one reader at the log's end is answered within a
millisecond of each commit; a hundred readers get an answer (of more entries) every few tens
of milliseconds, and when they cannot all keep up with the writes they fall behind instead
of slowing them (the append path keeps the handler's other 90 %). Without it every commit
advance (about a thousand a second under load) would be answered to every reader: a hundred
readers would cost the handler a hundred thousand answers a second, and appends would slow to
a crawl. A request that arrives between rounds waits for the next one (as Kafka's
fetch.min.bytes makes a fetch wait), or a reader would skip the rounds by asking again at
once. The Python time is measured (`time.perf_counter`), so the share holds on a fast machine and a
slow one alike; what it cannot time (the loop's wake-up per request, the bytes' trip through
ZeroMQ's I/O thread and the kernel) is charged at estimates (`REQUEST_OVERHEAD_S`,
`BYTE_COST_S`). While the log is not growing (no append or push for `BUSY_WINDOW_MS`) there is
nothing to protect and no budget: a reader catching up on history goes as fast as the log can
be read.

A member that knows no leader (a candidate, a follower that lost its leader) does not hold a
request: its committed index cannot move until a leader is elected, so it answers at once
with no entries and no leader, and the client asks another member instead of waiting on a
partitioned one.

The entries are checked as GET checks them (every header and CRC, `reads.committed_blob`): a
member never serves a damaged entry; it marks the range for repair and answers DISK_ERROR,
and the client reads the range from another member.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.roles.handling.reads import MAX_GET_BYTES, ReadFailed, committed_blob

if TYPE_CHECKING:
    from node.block.shared_state import MemberView
    from node.roles.handler import Handler

MAX_FETCH_WAIT_MS = 60_000
"""The longest a member holds one FETCH: a client asking for more is held this long."""
FETCH_SHARE = 0.1
"""The most of the handler's time that answers to readers may take (see "A budget")."""
_SPACING = (1 - FETCH_SHARE) / FETCH_SHARE
REQUEST_OVERHEAD_S = 50e-6
"""What a FETCH costs the handler beyond `on_fetch`'s own time, which the budget cannot time:
the loop's wake-up and turn, receiving and decoding the frame (~50 µs on this 2-core machine)."""
BYTE_COST_S = 2e-9
"""What an answer's bytes cost beyond the Python time the budget times: ZeroMQ's I/O thread and
the kernel copying them to the socket (~2 ns a byte here, loopback)."""
BUSY_WINDOW_MS = 100
"""The log grew this recently: the handler is writing, and readers are on the budget."""
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
        self.next_round_ms = 0.0  # no held request is answered before (the budget)
        self.timer = time.perf_counter  # measures what readers cost (a test sets its own)
        self._spent = 0.0  # seconds spent on readers since the last round was charged
        self._bytes = 0  # bytes answered since then
        # the earliest deadline and lowest index of the held requests: a loop turn with nothing
        # due looks at these two, not at every held request
        self._min_deadline = math.inf
        self._min_index = math.inf
        self._seen_end: int | None = None  # the ledger end when last looked at, and when it moved
        self._grew_ms = -BUSY_WINDOW_MS

    def _budgeted(self, now: int) -> bool:
        """The log grew within `BUSY_WINDOW_MS`: answers are on the budget. (The ledger end is
        this process's own: no other role moves it.)"""
        end = self.h.store.ledger_end_index
        if end != self._seen_end:
            if self._seen_end is not None:
                self._grew_ms = now
            self._seen_end = end
        return now - self._grew_ms < BUSY_WINDOW_MS

    def on_fetch(self, ident: bytes, req: P.FetchRequest) -> None:
        t0 = self.timer()
        self._on_fetch(ident, req)
        if self._budgeted(self.h.now()):  # only what readers cost while the log grows counts
            self._spent += self.timer() - t0 + REQUEST_OVERHEAD_S
        else:
            self._spent, self._bytes = 0.0, 0

    def _on_fetch(self, ident: bytes, req: P.FetchRequest) -> None:
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
        now = self.h.now()
        ready = self._readable_end() - req.index + 1
        budgeted = self._budgeted(now)
        if req.wait_ms == 0 or not knows_leader(m) or len(self.parked) >= MAX_PARKED_FETCHES \
                or (ready > 0 and (not budgeted or now >= self.next_round_ms)):
            self.answer(ident, req, m)
            if ready > 0 and budgeted:  # an answer between rounds: the next round waits for it
                self._charge(now)
            return
        wait = min(req.wait_ms, MAX_FETCH_WAIT_MS)
        self.parked.append(ParkedFetch(ident, req, now + wait))
        self._min_deadline = min(self._min_deadline, now + wait)
        self._min_index = min(self._min_index, req.index)

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
        self._bytes += len(blob)
        if blob:
            self.h.state.incr("fetched_entries", count)
        self.h.replies.send(ident, P.FetchResponse(
            RC.SUCCESS, self.h.cfg.group, m.current_term,
            self.h.slot_id(m.leader_slot) if knows_leader(m) else "",
            s.ledger_begin_index, s.committed_index, blob, req.request_id))

    def release(self, m: MemberView, now: int) -> None:
        """A round: answer the held requests the committed index now reaches (if the answer
        budget allows a round now), those whose wait is over, and all of them when this member
        no longer knows a leader. Readers waiting at the same index (the usual case: all caught
        up) share one read of the log."""
        budgeted = self._budgeted(now)  # every turn: the log's growth is watched all along
        if not self.parked:
            return
        end = self._readable_end()
        leaderless = not knows_leader(m)
        round_due = not budgeted or now >= self.next_round_ms
        if not leaderless and now < self._min_deadline and not (round_due and self._min_index <= end):
            return
        keep: list[ParkedFetch] = []
        cache: dict[tuple[int, int, int], bytes] = {}
        served = 0
        t0 = self.timer()
        for p in self.parked:
            ready = p.req.index <= end
            if leaderless or p.deadline_ms <= now or (ready and round_due):
                self.answer(p.ident, p.req, m, cache)
                served += ready
            else:
                keep.append(p)
        self.parked = keep
        self._min_deadline = min((p.deadline_ms for p in keep), default=math.inf)
        self._min_index = min((p.req.index for p in keep), default=math.inf)
        if budgeted:
            self._spent += self.timer() - t0
            if served:
                self._charge(now)

    def _charge(self, now: int) -> None:
        """Space the next round by what readers cost since the last one (requests received and
        held, answers given), so that they take at most `FETCH_SHARE` of the handler's time."""
        spent = self._spent + self._bytes * BYTE_COST_S
        self.next_round_ms = max(self.next_round_ms, now) + spent * 1000 * _SPACING
        self._spent, self._bytes = 0.0, 0

    def next_deadline(self) -> int | None:
        """When the loop must look again: a held request's wait ends, or the next round is due
        for requests the committed index already reaches."""
        if not self.parked:
            return None
        due = self._min_deadline
        if self._min_index <= self._readable_end():
            due = min(due, math.ceil(self.next_round_ms))
        return int(due)
