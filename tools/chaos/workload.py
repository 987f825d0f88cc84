"""The load a chaos run puts on its group while faults happen: writers, readers and a monitor
of who claims leadership. Each records into one `History`; none judges anything (history.py
does, after the run)."""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import random
import re
import threading
import time
from pathlib import Path

from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import Role
from tools.chaos.history import Append, History, ReadEntry
from tools.local_group import LocalGroup

BODY_PREFIX = b"chaos:"
_BECAME_LEADER = re.compile(r" (\S+) became LEADER term=(\d+)")


def body_of(writer: str, seq: int, size: int) -> bytes:
    """A unique, recognisable body: 'chaos:<writer>:<seq>:' padded with '.' to `size` bytes."""
    head = b"%s%s:%09d:" % (BODY_PREFIX, writer.encode(), seq)
    return head + b"." * max(0, size - len(head))


class Clock:
    """Seconds since the run started (monotonic), shared by every recorder."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


class AckedLoad(threading.Thread):
    """A load thread that keeps the completion times of its acknowledged writes, in order: the
    run measures each fault's write outage from them (`acks_between`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.ack_times: list[float] = []
        self.lock = threading.Lock()
        self._stop_evt = threading.Event()

    def acks_between(self, t0: float, t1: float) -> list[float]:
        with self.lock:
            lo = bisect.bisect_left(self.ack_times, t0)
            hi = bisect.bisect_right(self.ack_times, t1)
            return self.ack_times[lo:hi]

    def stop(self) -> None:
        self._stop_evt.set()


class Writer(AckedLoad):
    """Appends unique bodies through its own client (sessions on), `depth` in flight at once
    (1: one at a time). Every append is recorded when invoked and when it completes."""

    def __init__(self, name: str, peers: str, group: str, history: History, clock: Clock, *,
                 depth: int, size: int, timeout: float) -> None:
        super().__init__(f"chaos-{name}")
        self.writer, self.depth, self.size, self.timeout = name, depth, size, timeout
        self.history, self.clock = history, clock
        self.client = DLedgerClient(peers, group, timeout=timeout)
        # The load bound by counts (--appends-per-fault): None = unlimited; else the appends this
        # writer may still invoke. `granted` and `completed` (acknowledged or failed) let the run
        # wait for a share of a grant to be done, whatever the machine's speed.
        self._allowance: int | None = None
        self._allowance_cv = threading.Condition()
        self.granted = 0
        self.completed = 0

    def grant(self, n: int) -> None:
        """Allow `n` more appends (the first grant turns the count bound on)."""
        with self._allowance_cv:
            self._allowance = (self._allowance or 0) + n
            self.granted += n
            self._allowance_cv.notify_all()

    def _take(self) -> bool:
        with self._allowance_cv:
            if self._allowance is None:
                return True
            if self._allowance > 0:
                self._allowance -= 1
                return True
            return False

    def _wait_for_allowance(self) -> None:
        with self._allowance_cv:
            self._allowance_cv.wait_for(lambda: self._stop_evt.is_set() or self._allowance is None
                                        or self._allowance > 0, timeout=0.5)

    def stop(self) -> None:
        super().stop()
        with self._allowance_cv:
            self._allowance_cv.notify_all()

    def run(self) -> None:
        inflight: collections.deque[tuple[Append, concurrent.futures.Future]] = collections.deque()
        seq = 0
        while not self._stop_evt.is_set() or inflight:
            while not self._stop_evt.is_set() and len(inflight) < self.depth and self._take():
                op = self.history.invoked(Append(self.writer, seq, body_of(self.writer, seq, self.size),
                                                 self.clock.now()))
                seq += 1
                inflight.append((op, self.client.append_async(op.body)))
            if not inflight:
                self._wait_for_allowance()  # its allowance is used: idle until the run grants more
                continue
            op, fut = inflight.popleft()
            try:
                r = fut.result(timeout=self.timeout + 30)
                op.index, op.term = r.index, r.term
            except DLedgerError as e:
                op.error, op.indeterminate = e.name, e.indeterminate
            except concurrent.futures.TimeoutError:
                # The client promised an answer within its timeout; record the broken promise.
                op.error, op.indeterminate = "NO_ANSWER", True
            except Exception as e:  # noqa: BLE001 - e.g. the client closed under it: unknown fate
                op.error, op.indeterminate = type(e).__name__, True
            op.t_done = self.clock.now()
            with self.lock:
                self.completed += 1
                if op.index is not None:
                    self.ack_times.append(op.t_done)

    def close(self) -> None:
        self._stop_evt.set()
        self.join(timeout=self.timeout + 60)
        self.client.close()


class Reader(threading.Thread):
    """Reads the committed log from the start as it grows (and now and then an older entry
    again), recording every entry it gets: each must equal the final committed log."""

    def __init__(self, name: str, peers: str, group: str, history: History, clock: Clock, *,
                 seed: int, timeout: float) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.history, self.clock = history, clock
        self.client = DLedgerClient(peers, group, timeout=timeout)
        self.rng = random.Random(seed)
        self._stop_evt = threading.Event()
        self.errors = 0

    def run(self) -> None:
        cursor = 0
        while not self._stop_evt.is_set():
            start = cursor if cursor == 0 or self.rng.random() < 0.9 else self.rng.randrange(cursor)
            try:
                got = self.client.get_range(start, 256, linearizable=self.rng.random() < 0.5)
            except DLedgerError:
                self.errors += 1
                self._stop_evt.wait(0.05)
                continue
            t = self.clock.now()
            self.history.read(ReadEntry(t, e.index, e.term, e.type, bytes(e.body)) for e in got)
            if got and start == cursor:
                cursor = got[-1].index + 1
            self._stop_evt.wait(0.02 if got else 0.05)

    def close(self) -> None:
        self._stop_evt.set()
        self.join(timeout=60)
        self.client.close()


class LeaderMonitor(threading.Thread):
    """Polls every node's METADATA every `interval` s: records each (term, LEADER) claim in the
    history and a timeline of (time, leader, term) changes for the report and the plot."""

    def __init__(self, group: LocalGroup, history: History, clock: Clock, interval: float = 0.05) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.g, self.history, self.clock, self.interval = group, history, clock, interval
        self.timeline: list[tuple[float, str | None, int]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        last: tuple[str | None, int] | None = None
        while not self._stop_evt.is_set():
            best: tuple[str | None, int] = (None, -1)
            for nid in self.g.ids:
                m = self.g.meta(nid, timeout_ms=100)
                if m is None:
                    continue
                if m.role == Role.LEADER:
                    self.history.claim(m.term, m.self_id)
                    if m.term > best[1]:
                        best = (m.self_id, m.term)
            if best[0] is not None and best != last:
                self.timeline.append((self.clock.now(), *best))
                last = best
            self._stop_evt.wait(self.interval)

    def close(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)


def leader_claims_from_logs(root: Path, nodes: list[str]) -> dict[int, set[str]]:
    """Every 'became LEADER term=N' line the nodes' electors logged: the complete record of
    leadership (the monitor's polls can miss a leader that lasted less than a poll)."""
    out: dict[int, set[str]] = collections.defaultdict(set)
    for n in nodes:
        try:
            text = (root / f"{n}.log").read_text(errors="replace")
        except OSError:
            continue
        for m in _BECAME_LEADER.finditer(text):
            out[int(m.group(2))].add(m.group(1))
    return out
