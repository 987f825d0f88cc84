"""The scheduler: virtual time, the event queue, and which actor runs next.

Virtual time only moves when no actor can run. At each instant the scheduler picks a random
ready actor (one with inbox items or a due timer) and runs one step of it. Any read of the
shared block is a preemption point (tools/sim/state.py): the scheduler may run other ready
actors' steps nested there, respecting the member lock.
"""

from __future__ import annotations

import contextlib
import heapq
import traceback
from collections.abc import Iterator
from typing import Any

from tools.sim import actors as A
from tools.sim.config import Violation


class SchedulerMixin:
    """`Sim`'s scheduling: needs `rng`, `now`, `heap`, `stack`, `actors`, `slots`, `faulting`,
    `next_fault`, `p_preempt`, `p_midcrash`, and the fault and invariant steps it calls."""

    def next_inc(self) -> int:
        self._inc += 1
        return self._inc

    def _add_actor(self, a: A.Actor) -> None:
        self.actor_events += 1  # Sim.follow_slots: the set of live actors moved
        pos = self.slots.get(a.key)
        if pos is None:
            self.slots[a.key] = len(self.actors)
            self.actors.append(a)
        else:
            self.actors[pos] = a
        if a.node is not None:
            a.node.roles[a.role if a.role != "dispatcher" else a.key] = a

    def actor(self, key: str) -> A.Actor | None:
        pos = self.slots.get(key)
        return None if pos is None else self.actors[pos]

    def current(self) -> A.Actor | None:
        return self.stack[-1] if self.stack else None

    @contextlib.contextmanager
    def acting(self, actor: A.Actor) -> Iterator[None]:
        """Run construction code as `actor` (its clock, no preemption)."""
        self.stack.append(actor)
        actor.busy = True
        saved, self.p_preempt = self.p_preempt, 0.0
        try:
            yield
        finally:
            self.p_preempt = saved
            actor.busy = False
            self.stack.pop()

    def clock_now(self) -> int:
        a = self.current()
        if a is not None and a.node is not None:
            return self.now + a.node.clock_offset
        return self.now

    def schedule(self, at: int, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, self._seq, kind, data))

    def _deliver_due(self) -> None:
        h = self.heap
        while h and h[0][0] <= self.now:
            _at, _s, kind, data = heapq.heappop(h)
            if kind == "msg":
                key, inc, mkind, payload = data
                a = self.actor(key)
                if a is not None and a.alive and a.inc == inc:
                    a.inbox.append((mkind, payload))
            elif kind == "call":
                data()

    def _run_step(self, a: A.Actor) -> None:
        if self.stack:
            self.trace_event(a.key, "nested", f"runs inside {self.stack[-1].key}'s block read")
        a.busy = True
        self.stack.append(a)
        try:
            a.step()
        except A.SimCrash:
            self.kill_actor(a, "mid-step")
        except A.SimFatal as e:
            raise Violation(f"{a.key} stopped the node (fatal): {e}") from None
        except Violation:
            raise
        except Exception as e:  # noqa: BLE001 - a role that raises is a finding
            tb = traceback.format_exc(limit=8)
            raise Violation(f"{a.key} crashed: {e!r}\n{tb}") from None
        finally:
            self.stack.pop()
            a.busy = False

    def preempt(self, reader: A.Actor) -> None:
        """A block read: maybe crash the reader here, maybe run other actors first."""
        r = self.rng
        if self.p_midcrash and self.faulting and r.random() < self.p_midcrash and reader in self.stack:
            if reader is self.stack[-1] and reader.node is not None:
                raise A.SimCrash()
        if len(self.stack) > self.cfg.max_depth or r.random() >= self.p_preempt:
            return
        now = self.now
        cands = [a for a in self.actors
                 if a.alive and not a.busy and (a.wake_at <= now or (a.inbox and a.listening)) and not (a.takes_lock and a.node is not None and a.node.lock.holder is not None)]
        if not cands:
            return
        self.stats["nested"] += 1
        self._run_step(r.choice(cands))

    def at_write(self, writer: A.Actor) -> None:
        if self.p_midcrash and self.faulting and self.rng.random() < self.p_midcrash:
            if self.stack and writer is self.stack[-1] and writer.node is not None:
                raise A.SimCrash()

    def step_once(self) -> bool:
        """Run one top-level step (advancing virtual time if nobody is ready)."""
        if self.heap and self.heap[0][0] <= self.now:
            self._deliver_due()
        now = self.now
        ready = [a for a in self.actors
                 if a.alive and (a.wake_at <= now or (a.inbox and a.listening))]
        if not ready:
            nxt = min([a.wake_at for a in self.actors if a.alive] or [now + 1000])
            if self.heap and self.heap[0][0] < nxt:
                nxt = self.heap[0][0]
            if self.faulting and self.next_fault < nxt:
                nxt = self.next_fault
            self.now = max(now + 1, nxt)
            if self.faulting and self.now >= self.next_fault:
                self._inject_fault()
            return False
        self._run_step(ready[0] if len(ready) == 1 else self.rng.choice(ready))
        self.steps += 1
        if self.joins:
            self.follow_slots()
        self.check()
        return True
