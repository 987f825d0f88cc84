"""Following the log: FETCH long polls from any member, in index order, with no gap and no repeat
(docs/client.md "Following the log").

Why any member: committed entries are the same on every member (Raft's Log Matching and Leader
Completeness), and a member answers FETCH only up to the committed index it knows. So a reader
may take entry i from one member and entry i + 1 from another; asking each time for the index
it needs next, and accepting only entries contiguous from it, is all it takes to never skip or
repeat one. Readers on followers also keep the leader's handler — the append path — free.

Where a reader asks (`MemberRotation`): the member named by `read_from`, else the member that
answered last, else members in a random order with followers first. It moves on when a member
does not answer (dead, stopped: the client's connection monitor ends the attempt at once, a
silent one after the wait plus `attempt_timeout`), answers an error, or answers nothing while
knowing no leader (its committed index cannot move, e.g. it is partitioned away). After a
full round without entries it backs off, so a group that is electing a leader costs readers a
few requests, not a spin.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.client.calls import FETCH, Call, backoff
from ipc.client.results import DLedgerError, Entry, decode_entries
from ipc.codes import ResponseCode as RC

if TYPE_CHECKING:
    from ipc.client.api import DLedgerClient

DEFAULT_WAIT_MS = 1000
"""How long a member holds a follow's request when it has nothing new (Kafka's fetch.max.wait.ms
is 500 ms): an idle reader asks about once a second."""
DEFAULT_MAX_ENTRIES = 1000
DEFAULT_MAX_BYTES = 1 << 20
MAX_WAIT_MS = 60_000


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One FETCH answer: committed entries, consecutive from the index asked (possibly none),
    and where the log stands on the member that answered."""

    entries: list[Entry]
    committed_index: int
    begin_index: int
    node: str


class MemberRotation:
    """Which member a reader asks next (see the module docstring)."""

    def __init__(self, members: list[str], leader_hint: Callable[[], str | None],
                 pinned: str | None = None) -> None:
        self.pinned = pinned
        self._members = members
        self._leader_hint = leader_hint
        self._order: list[str] = []
        self._pos = 0
        self._reorder()

    def _reorder(self) -> None:
        leader = self._leader_hint()
        order = list(self._members)
        random.shuffle(order)
        order.sort(key=lambda m: m == leader)  # followers first, the leader last
        self._order, self._pos = order, 0

    @property
    def current(self) -> str:
        return self.pinned or self._order[self._pos]

    def advance(self) -> bool:
        """Move to the next member. True when that starts a new round (every member tried)."""
        if self.pinned is not None:
            return True
        self._pos += 1
        if self._pos >= len(self._order):
            self._reorder()
            return True
        return False

    @property
    def size(self) -> int:
        return 1 if self.pinned is not None else len(self._order)


def check_args(index: int, max_entries: int, max_bytes: int, wait_ms: int) -> None:
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise DLedgerError(RC.UNEXPECTED_ARGUMENT, f"index must be an int >= 0, not {index!r}")
    if max_entries <= 0 or max_bytes <= 0:
        raise DLedgerError(RC.UNEXPECTED_ARGUMENT, "max_entries and max_bytes must be > 0")
    if not 0 <= wait_ms <= MAX_WAIT_MS:
        raise DLedgerError(RC.UNEXPECTED_ARGUMENT, f"wait_ms must be in 0..{MAX_WAIT_MS}")


def ask(client: DLedgerClient, node: str, index: int, max_entries: int, max_bytes: int,
        wait_ms: int, deadline: float) -> P.Message | None:
    """One FETCH to `node`: its raw answer, or None when it did not answer by `deadline` or
    its connection dropped."""
    call = Call(FETCH, (index, max_entries, max_bytes, wait_ms), deadline, pinned=node)
    try:
        return client._wait(client._submit(call), max(0.0, deadline - time.monotonic()))
    except DLedgerError:
        return None  # not sent (no connection) or no answer in time: the same to a reader


def fetch(client: DLedgerClient, index: int, max_entries: int, max_bytes: int, wait_ms: int,
          rotation: MemberRotation, deadline: float | None) -> FetchResult:
    """`fetch_raw`, its entries decoded (CRC-checked, contiguous from `index`)."""
    msg, node, entries = fetch_raw(client, index, max_entries, max_bytes, wait_ms, rotation, deadline)
    return FetchResult(entries, msg.committed_index, msg.begin_index, node)


def fetch_raw(client: DLedgerClient, index: int, max_entries: int, max_bytes: int, wait_ms: int,
              rotation: MemberRotation, deadline: float | None,
              decode: bool = True) -> tuple[P.FetchResponse, str, list[Entry]]:
    """The FETCH answer (its raw store-format entries, checked) with the member that gave it
    and the entries decoded (`decode` False: not decoded, [] — a caller that checks the raw
    entries itself): committed entries from `index`, from the rotation's members, trying the
    next one on failure, until one answers with entries or an honest empty answer — after its
    wait from a member that knows a leader, or with no wait from the leader itself (a follower's
    committed index may lag the group's); `deadline` None: for ever.

    Raises INDEX_LESS_THAN_LOCAL_BEGIN when every member of a round said `index` is below its
    log's begin (retention or a snapshot moved it: the entry is gone from the group), TIMEOUT
    at the deadline."""
    rounds = 0
    below: set[str] = set()
    last: tuple[int, str] = (RC.TIMEOUT, "no member answered")
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise DLedgerError(last[0], f"{last[1]} (FETCH from {index} within the timeout)")
        node = rotation.current
        wait = wait_ms
        if deadline is not None:
            wait = max(0, min(wait, int((deadline - now - client.attempt_timeout) * 1000)))
        attempt_deadline = now + wait / 1000 + client.attempt_timeout
        if deadline is not None:
            attempt_deadline = min(attempt_deadline, deadline)
        msg = ask(client, node, index, max_entries, max_bytes, wait, attempt_deadline)
        code = getattr(msg, "code", None)
        if isinstance(msg, P.FetchResponse) and code == RC.SUCCESS:
            entries = decode_entries(msg.entries, index, max_entries) if decode else []
            honest = msg.leader_id == node if wait == 0 else bool(msg.leader_id)
            if len(msg.entries) or honest or rotation.pinned is not None:
                return msg, node, entries
            last = (RC.NOT_LEADER, f"{node} knows no leader")
        elif code == RC.INDEX_LESS_THAN_LOCAL_BEGIN:
            below.add(node)
            last = (RC.INDEX_LESS_THAN_LOCAL_BEGIN, getattr(msg, "reason", ""))
            if len(below) >= rotation.size:
                raise DLedgerError(RC.INDEX_LESS_THAN_LOCAL_BEGIN,
                                   f"index {index} is below the log's begin on every member "
                                   f"(retention or a snapshot removed it): {last[1]}")
        elif code == RC.UNEXPECTED_ARGUMENT and rotation.pinned is None:
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT, getattr(msg, "reason", "") or "refused")
        elif msg is not None:
            last = (code if code is not None else RC.UNKNOWN, getattr(msg, "reason", "") or f"from {node}")
        else:
            last = (RC.TIMEOUT, f"no answer from {node}")
        if rotation.advance():
            below.clear()
            rounds += 1
            pause = backoff(rounds)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)


def follow(client: DLedgerClient, start: int, max_entries: int, max_bytes: int, wait_ms: int,
           read_from: str | None, include_noop: bool) -> Iterator[Entry]:
    """Committed entries from `start`, in index order, for ever (see `DLedgerClient.follow`)."""
    check_args(start, max_entries, max_bytes, wait_ms)
    rotation = MemberRotation(list(client.peers), lambda: client._io.discovery.leader, read_from)
    nxt = start
    while True:
        got = fetch(client, nxt, max_entries, max_bytes, wait_ms, rotation, None)
        for e in got.entries:
            nxt = e.index + 1
            if include_noop or e.type != "NOOP":
                yield e
