"""Client sessions: which appends the leader already holds, so a retried append is answered
with its original index instead of being written twice (docs/client.md "Sessions", Raft dissertation
§6.3, Kafka's idempotent producer).

Every append of a client session carries ``(session, seq)``: the session id the leader gave
the client, and a per-session sequence number, 1 for the session's first entry, +1 per entry
(a batch of n takes n consecutive numbers). Both are 32-bit and stored in the entry header's
two reserved fields (``channel`` = session, ``chainCrc`` = seq; docs/store.md), so the table
is a function of the log: a new leader rebuilds it from its log's tail.

Sequence numbers wrap at 2**32 and are compared in serial-number arithmetic (RFC 1982): `b`
is after `a` when ``0 < (b - a) mod 2**32 < 2**31``. A client never has 2**31 appends in
flight, so that order is exact (ipc/seq.py, shared with the client).

The decision for a request ``(session, first seq, count)``, given the session's last seq L:

* ``APPEND``: first = L + 1 (or the session is new and first = 1): write it;
* ``DUPLICATE``: every seq of the request is at or before L and the window still holds
  where they went: answer with that index (the first entry's; a batch was written as one
  contiguous run, so its indices are first .. first + count - 1);
* ``TOO_OLD``: at or before L, but older than the window: written, index no longer known;
* ``GAP``: first > L + 1: entries before it are missing (lost with an uncommitted tail):
  the client must resend from L + 1;
* ``OVERLAP``: the request straddles L (part written, part not): not a retry of one request;
* ``EXPIRED``: the session is unknown and not one this table opened and has seen no entry of:
  its history may be older than the table (evicted, or beyond the rebuild scan, or an earlier
  handler's). The client's unanswered appends of that session are indeterminate; it opens a
  new session.

**The start invariant.** An unknown session's seq 1 is written only if this very table handed
out the session id (`open`) and has recorded no entry of it since. That is the one fact that
proves no entry of the session is in the log: the table is a cache — it evicts, it is rebuilt
from a bounded scan of the log's tail, and a restarted handler rebuilds it in the same term —
so "the session is unknown" proves nothing, and "the session belongs to my term" does not
either (an earlier incarnation of this leader's handler may have opened it and written its
seq 1 out of the scan's reach). Every other unknown session is EXPIRED: the client then knows
its unanswered appends of that session may have been stored, and never resends them as new.
The set of opened-but-unwritten ids is bounded by `max_sessions`; one dropped from it is
EXPIRED at its first append, which costs its client one more OPEN_SESSION, nothing else.

Bounds (documented in docs/client.md): at most `max_sessions` sessions, the least recently
appending evicted first (by log index, so every replica would evict the same ones), and per
session the last `window` seqs' indices.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

# The seq arithmetic is the client's too (ipc/seq.py); re-exported here for the node's modules.
from ipc.seq import SEQ_HALF, SEQ_MASK, seq_add, seq_after  # noqa: F401

NO_SESSION = 0
MAX_SESSION_COUNTER = 0xFFFF


def entry_seqs(session: int, first_seq: int | list[int], n: int) -> Iterable[int]:
    """The seq stamped on each of `n` entries written in one go: 0 without a session, else
    `first_seq` + k mod 2**32, or the given list (single appends of one MULTI). A C-level
    iterable, so a store's batch loop stays one zip."""
    if not session:
        return itertools.repeat(0, n)
    if isinstance(first_seq, list):
        return first_seq
    if first_seq + n - 1 <= SEQ_MASK:
        return range(first_seq, first_seq + n)
    return [seq_add(first_seq, k) for k in range(n)]


def session_id(term: int, counter: int) -> int:
    """The id a leader gives the `counter`-th session it opens in `term`: (term mod 2**16) in
    the high half, the counter (1..65535) in the low half. Only one leader opens sessions in a
    term, so ids of different leaders never collide while fewer than 65,536 terms pass within
    a session's life; the leader also skips ids its table still holds."""
    if not 1 <= counter <= MAX_SESSION_COUNTER:
        raise ValueError(f"session counter {counter} outside 1..{MAX_SESSION_COUNTER}")
    return ((term & 0xFFFF) << 16) | counter


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    TOO_OLD = "too-old"
    GAP = "gap"
    OVERLAP = "overlap"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    index: int = -1  # DUPLICATE: the index of the request's first entry
    last_seq: int = 0  # the session's last seq (GAP, OVERLAP, TOO_OLD, DUPLICATE)


_APPEND = Decision(Verdict.APPEND)
_EXPIRED = Decision(Verdict.EXPIRED)


@dataclass(slots=True)
class _Run:
    """Seqs first_seq .. first_seq + count - 1 at indices first_index .. + count - 1."""

    first_seq: int
    first_index: int
    count: int


@dataclass(slots=True)
class _Session:
    last_seq: int = 0
    last_index: int = -1
    runs: deque[_Run] = field(default_factory=deque)
    covered: int = 0  # seqs the runs hold


_NOTHING_WRITTEN = _Session()  # read-only: a session opened here with no entry yet


class SessionTable:
    """The leader's view of its sessions (pure data; the handler owns one while it leads)."""

    def __init__(self, max_sessions: int = 10_000, window: int = 4096) -> None:
        if max_sessions < 1 or window < 1:
            raise ValueError("max_sessions and window must be at least 1")
        self.max_sessions = max_sessions
        self.window = window
        self._sessions: OrderedDict[int, _Session] = OrderedDict()  # least recently appended first
        self._opened: OrderedDict[int, None] = OrderedDict()  # handed out here, no entry recorded yet

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: int) -> bool:
        return session in self._sessions

    def last_seq(self, session: int) -> int | None:
        s = self._sessions.get(session)
        return None if s is None else s.last_seq

    def open(self, session: int) -> None:
        """`session` was just handed out by this table's owner: its seq 1 may start it (the
        start invariant, module docstring)."""
        self._opened[session] = None
        if len(self._opened) > self.max_sessions:
            self._opened.popitem(last=False)

    def holds(self, session: int) -> bool:
        """Whether the id is in use here: it has entries in the table or was opened here."""
        return session in self._sessions or session in self._opened

    def decide(self, session: int, first_seq: int, count: int = 1) -> Decision:
        """What to do with an append of `count` entries from `session` starting at `first_seq`.
        An unknown session may start only at seq 1 and only if `open` handed it out and no entry
        of it was recorded since: anything else might store an entry twice."""
        if session == NO_SESSION:
            return _APPEND
        s = self._sessions.get(session)
        if s is None:
            if session not in self._opened:
                return _EXPIRED
            s = _NOTHING_WRITTEN  # opened here, nothing written: its last seq is 0
        ahead = seq_after(s.last_seq, first_seq)
        if ahead == 1:
            return _APPEND
        if ahead > 1:
            return Decision(Verdict.GAP, last_seq=s.last_seq)
        if s is _NOTHING_WRITTEN:  # seq 0 (or "before" it): no request of this session can be
            return Decision(Verdict.OVERLAP, last_seq=0)
        if seq_after(s.last_seq, seq_add(first_seq, count - 1)) > 0:
            return Decision(Verdict.OVERLAP, last_seq=s.last_seq)
        for r in reversed(s.runs):
            into = seq_after(r.first_seq, first_seq)
            if into < 0:
                continue
            if into + count <= r.count:
                return Decision(Verdict.DUPLICATE, index=r.first_index + into, last_seq=s.last_seq)
            break  # starts in this run but ends past it: not one request's run
        return Decision(Verdict.TOO_OLD, last_seq=s.last_seq)

    def record(self, session: int, first_seq: int, first_index: int, count: int = 1) -> None:
        """Entries `first_index` .. + count - 1 of `session`, seqs from `first_seq`, are in the
        log (called in log order: by the leader after writing, by `rebuild` while scanning)."""
        if session == NO_SESSION or count <= 0:
            return
        self._opened.pop(session, None)
        s = self._sessions.get(session)
        if s is None:
            s = self._sessions[session] = _Session()
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session)
        last = s.runs[-1] if s.runs else None
        if (last is not None and seq_add(last.first_seq, last.count) == first_seq
                and last.first_index + last.count == first_index):
            last.count += count
        else:
            s.runs.append(_Run(first_seq, first_index, count))
        s.covered += count
        s.last_seq = seq_add(first_seq, count - 1)
        s.last_index = first_index + count - 1
        while s.covered - s.runs[0].count >= self.window:  # keep at least `window` seqs
            s.covered -= s.runs.popleft().count

    def rebuild(self, stamps: Iterable[tuple[int, int, int]]) -> None:
        """Forget everything, then `record` every (index, session, seq) of a log tail, in
        index order (entries without a session are skipped). Ids opened before are forgotten
        too: a rebuild starts a new owner's view (a new term, or a restarted handler), which
        did not hand them out."""
        self._sessions.clear()
        self._opened.clear()
        run: list[int] | None = None  # [session, first_seq, first_index, count]
        for index, session, seq in stamps:
            if session == NO_SESSION:
                continue
            if (run is not None and run[0] == session and seq_add(run[1], run[3]) == seq
                    and run[2] + run[3] == index):
                run[3] += 1
                continue
            if run is not None:
                self.record(*run)
            run = [session, seq, index, 1]
        if run is not None:
            self.record(*run)
