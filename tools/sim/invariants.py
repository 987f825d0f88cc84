"""The invariants: what every step, every answer and the end of a seed are checked against
(the committed history, one leader per term, acknowledged appends stay, sessions commit a
stamp once, convergence after the heal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.membership import (
    ConfigurationError,
    bootstrap_configuration,
    decode_configuration,
    majorities_intersect,
)
from node.store import codec
from node.store.base import StoreError
from node.store.stamps import _STAMP
from tools.sim.clients import definite_failure
from tools.sim.config import Violation

if TYPE_CHECKING:
    from tools.sim.config import Node


class InvariantsMixin:
    """`Sim`'s checks: needs `nodes`, `chist` and the other history tables `Sim` builds."""

    def fail(self, what: str) -> None:
        raise Violation(what)

    def _check_answer(self, n: Node, ident: bytes, frame: bytes) -> None:
        """A node's answer to a stamped append agrees with the log: a definite refusal ("not
        stored": DISK_FULL, INTERNAL_ERROR, ...) of a stamp whose body is already committed
        is a lie the client cannot see through (docs/client.md: a resend of an entry the log
        holds is answered with its index, or SESSION_SEQ_TOO_OLD when that is gone)."""
        msg = P.decode(frame)
        for m in ([P.decode(bytes(x)) for x in msg.frames] if isinstance(msg, P.Multi) else [msg]):
            st = self.stamped.pop((ident, m.request_id), None)
            if st is None or not definite_failure(m.code):
                continue
            for b in st[2]:
                i = self.chist_where.get(b)
                if i is not None:
                    self.fail(f"{n.id} answered {RC(m.code).name} to a resend of (session {st[0]:#x}, seq "
                              f"{st[1]}), whose entry {b[:24]!r} is committed at {i} "
                              f"({getattr(m, 'reason', '')[:80]!r})")

    def on_definite(self, bodies: list[bytes], code: int, what: str) -> None:
        """A client reported a definite failure ("not stored"): none of its bodies may commit."""
        self.stats["definite_failures"] += 1
        for b in bodies:
            i = self.chist_where.get(b)
            if i is not None:
                self.fail(f"definite failure reported for an append committed at {i}: {what}")
            self.definite[b] = what

    def slot_name(self, n: Node, slot: int) -> str:
        """The member id of `n`'s block slot `slot`: its `--peers` position, or with fault `join`
        whatever its slot table says (slots are local to a node)."""
        t = n.slot_file.table if n.slot_file is not None else None
        if t is not None and 0 <= slot < len(t.owners) and t.owners[slot] is not None:
            return t.owners[slot].id
        return f"n{slot}"

    def on_member_write(self, n: Node, old: Any, new: Any) -> None:
        if new.role != old.role or new.current_term != old.current_term or new.leader_slot != old.leader_slot:
            lead = f" leader={self.slot_name(n, new.leader_slot)}" if new.leader_slot >= 0 else ""
            self.trace_event(n.id, "member", f"{Role(new.role).name} term={new.current_term}{lead}")
        if new.current_term < n.max_term:
            self.fail(f"{n.id}: term went back from {n.max_term} to {new.current_term}")
        n.max_term = new.current_term
        if new.role == Role.LEADER:
            prev = self.leaders.get(new.current_term)
            if prev is not None and prev != n.id:
                self.fail(f"two leaders in term {new.current_term}: {prev} and {n.id}")
            self.leaders[new.current_term] = n.id
            if self.f8 is not None and (old.role != Role.LEADER or old.current_term != new.current_term):
                self._figure8_leader(n, new.current_term)
            if self.m15 is not None and (old.role != Role.LEADER or old.current_term != new.current_term):
                self.m15_leader(n, new.current_term)
            if old.role != Role.LEADER or old.current_term != new.current_term:
                # Never lead twice in one term, across restarts too: a second leadership of one
                # term may write a different entry at an (index, term) a follower already holds.
                if (n.id, new.current_term) in self.led:
                    self.fail(f"{n.id} became leader of term {new.current_term} a second time")
                self.led.add((n.id, new.current_term))

    def on_ledger_write(self, n: Node, old: Any, new: Any) -> None:
        if new.committed_index > new.ledger_end_index:
            self.fail(f"{n.id}: published committed {new.committed_index} > ledger end {new.ledger_end_index}")
        if (new.ledger_end_index, new.committed_index) != (old.ledger_end_index, old.committed_index):
            self.trace_event(n.id, "ledger", f"begin={new.ledger_begin_index} end={new.ledger_end_index} "
                             f"term={new.ledger_end_term} committed={new.committed_index}")

    def on_late_ack(self) -> None:
        """A SUCCESS answer that reached its client after the client stopped waiting: the group
        committed the append (liveness), with nothing left to check its index against."""
        self.stats["late_acks"] += 1
        self.last_ack_at = self.now

    def on_ack(self, index: int, body: bytes, term: int) -> None:
        """An acknowledgement names an entry by (index, term): both must be where the body is.
        Term -1: a resend whose entry retention deleted (answered with its index only): the
        body must be committed there already."""
        self.stats["acked"] += 1
        self.last_ack_at = self.now
        if term == -1:
            if index >= len(self.chist) or self.chist[index][2] != body:
                got = self.chist[index][2][:24] if index < len(self.chist) else "nothing committed yet"
                self.fail(f"resend of {body[:24]!r} acknowledged at deleted index {index}, which holds {got!r}")
            return
        prev = self.acked.get(index)
        if prev is not None and prev != (body, term):
            self.fail(f"index {index} acknowledged twice differently: {prev[0][:24]!r} term {prev[1]} / "
                      f"{body[:24]!r} term {term}")
        self.acked[index] = (body, term)
        self.acked_max = max(self.acked_max, index)
        if index < len(self.chist) and self.chist[index][::2] != (term, body):
            self.fail(f"acknowledged append {body[:24]!r} at {index} term {term}, but the committed entry "
                      f"there is {self.chist[index][2][:24]!r} term {self.chist[index][0]}")

    def check_served(self, what: str, index: int, got: tuple[int, int, bytes]) -> None:
        """An entry a node served as committed must be the history's entry there. One past the
        history's end is checked once the history reaches it: a leader may answer from a commit
        it learned before any store the checker can read says so (its handler killed right
        after answering, with the store's committed index not read yet: seeds 706,731 and
        710,528 of the membership sweep), and at the end of the seed it must be there."""
        h = self.chist
        if index < len(h):
            if h[index] != got:
                self.fail(f"{what} served entry {index} (term {got[0]}, {got[2][:24]!r}), which is not the "
                          f"committed entry there (term {h[index][0]}, {h[index][2][:24]!r})")
            return
        self.stats["reads_served_ahead"] += 1
        self.served_ahead.append((what, index, got))

    def _check_served_ahead(self, final: bool) -> None:
        h = self.chist
        waiting = []
        for what, index, got in self.served_ahead:
            if index < len(h):
                self.check_served(what, index, got)
            elif final:
                self.fail(f"{what} served entry {index} (term {got[0]}, {got[2][:24]!r}), which the group "
                          f"never committed (the history ends at {len(h) - 1})")
            else:
                waiting.append((what, index, got))
        self.served_ahead = waiting

    def check(self, final: bool = False) -> None:
        for n in self.nodes:
            s = n.store
            if s is None:
                continue
            c = s.committed_index
            if c > n.max_committed:
                n.max_committed = c
            if c > s.ledger_end_index:
                self.fail(f"{n.id}: committed {c} > ledger end {s.ledger_end_index}")
            if c > n.checked:
                n.checked = self._check_committed(n, s, n.checked + 1, c)
        if self.served_ahead:
            self._check_served_ahead(final)
        if self.smc is not None:
            self.smc.check()

    def record_committed(self, n: Node, s: Any, count: bool = False) -> None:
        """Read (and check) the node's committed entries into the history now, before its
        retention deletes some of them (SimSegmentStore.delete_before)."""
        if count:
            self.stats["retention_deletions"] += 1
        if s.committed_index > n.checked:
            n.checked = self._check_committed(n, s, n.checked + 1, s.committed_index)

    def _check_committed(self, n: Node, s: Any, lo: int, hi: int) -> int:
        """Check the node's committed entries lo..hi against the history (extending it); return
        the highest index checked (the history's end when the node's log begins after it)."""
        lo = max(lo, s.ledger_begin_index, 0)
        h = self.chist
        if lo > len(h):
            # Its log begins after the history's end: a leader installed a snapshot here that
            # its own store has not marked committed yet (its ack checker publishes the commit
            # first). Entries before the log's begin are not here to read: wait for the history.
            return len(h) - 1
        for i in range(lo, hi + 1):
            try:
                e = s.get(i)
            except StoreError as err:  # a damaged entry was stored and then committed (t1)
                if "rot-below" in self.faults and i <= s.unchecked_end:
                    return i - 1  # damage at rest that open left to the scrub: read once repaired
                self.fail(f"{n.id}: committed entry {i} cannot be read back: {err}")
            got = (e.term, e.magic, bytes(e.body))
            if i < len(h):
                if h[i] != got:
                    self.fail(f"{n.id}: committed entry {i} is (term {got[0]}, {got[2][:24]!r}) but the "
                              f"group committed (term {h[i][0]}, {h[i][2][:24]!r})")
                continue
            if i != len(h):
                self.fail(f"{n.id}: committed {i} while the history ends at {len(h) - 1}")
            if got[1] == codec.MAGIC_NOOP:
                if got[2]:
                    self._check_configuration(n, i, got[2])
            elif got[2] not in self.sent:
                self.fail(f"{n.id}: committed entry {i} {got[2][:24]!r} was never written by a client")
            elif got[2] in self.chist_where:
                if self.repeats[got[2]] <= 0:
                    stamp = f", stamp (session, seq) {_stamp_at(s, i)}" if self.sessions else ""
                    self.fail(f"{n.id}: body {got[2][:24]!r} committed twice ({self.chist_where[got[2]]} and {i}"
                              f"{stamp})")
                self.repeats[got[2]] -= 1
            if got[1] != codec.MAGIC_NOOP:
                self.chist_where[got[2]] = i
                why = self.definite.get(got[2])
                if why is not None:
                    self.fail(f"{n.id}: committed entry {i} {got[2][:24]!r} was reported a definite failure: {why}")
                if self.sessions:
                    self._check_stamp(n, s, i)
            if i > 0 and got[0] < h[i - 1][0]:
                self.fail(f"{n.id}: committed term goes back at {i}")
            h.append(got)
            a = self.acked.get(i)
            if a is not None and a != (got[2], got[0]):
                self.fail(f"acknowledged append {a[0][:24]!r} at {i} term {a[1]}, but {got[2][:24]!r} term "
                          f"{got[0]} was committed there")
        return hi

    def _check_configuration(self, n: Node, i: int, body: bytes) -> None:
        """A committed NOOP with a body must be a configuration (docs/membership.md), one that
        only a change from the previous committed one could lead to: every majority of the one
        meets every majority of the other (one voter added or removed at a time)."""
        try:
            c = decode_configuration(body, i)
        except ConfigurationError as e:
            self.fail(f"{n.id}: NOOP entry {i} has a body that is not a configuration: {e}")
        prev = getattr(self, "committed_config", None) or bootstrap_configuration(self.nodes[0].cfg.peers)
        if not majorities_intersect(prev, c):
            self.fail(f"{n.id}: committed configurations {prev.index} (voters {','.join(prev.voters)}) and {i} "
                      f"(voters {','.join(c.voters)}) have disjoint majorities")
        self.committed_config = c
        self.stats["configurations_committed"] += 1
        self.trace_event(n.id, "configuration", f"{i} voters={','.join(c.voters)} learners={','.join(c.learners)}")

    def _check_stamp(self, n: Node, s: Any, i: int) -> None:
        """Every (session, seq) is committed at most once."""
        session, seq = _stamp_at(s, i)
        if not session:
            return
        prev = self.stamp_where.get((session, seq))
        if prev is not None and prev != i:
            self.fail(f"{n.id}: (session {session:#x}, seq {seq}) committed twice: at {prev} and {i}")
        self.stamp_where[(session, seq)] = i

    def converged(self) -> str | None:
        """None when the group is settled: one leader everyone follows, identical logs, every
        entry committed, every acknowledged append in the history. Otherwise why not."""
        for n in self.nodes:
            if not n.up or any(not a.alive for a in n.roles.values()) or n.store is None:
                return f"{n.id} not fully up"
        ms = [n.block.member for n in self.nodes]
        leaders = [i for i, m in enumerate(ms) if m.role == Role.LEADER]
        if len(leaders) != 1:
            return f"leaders: {leaders}"
        lt = ms[leaders[0]].current_term
        for i, m in enumerate(ms):
            if m.current_term != lt or (i != leaders[0] and (
                    m.role != Role.FOLLOWER or self.slot_name(self.nodes[i], m.leader_slot) != self.nodes[leaders[0]].id)):
                return f"n{i} is {Role(m.role).name} term {m.current_term}"
        ls = self.nodes[leaders[0]].store
        end = ls.ledger_end_index
        if end < 0 or ls.term_at(end) != lt:
            return "leader has not appended its NOOP"
        for n in self.nodes:
            s = n.store
            if "rot-below" in self.faults and s.unchecked_end >= 0:  # damage below C is the scrub's
                return f"{n.id}: the scrub has not checked up to {s.unchecked_end} yet"
            if s.ledger_end_index != end or s.committed_index != end:
                lag = ""
                if s.ledger_end_index < ls.ledger_begin_index - 1:  # liveness of install snapshot
                    lag = f" (the leader's log begins at {ls.ledger_begin_index}: it needs an install)"
                return f"{n.id}: end {s.ledger_end_index} committed {s.committed_index}, leader end {end}{lag}"
        missing = [i for i in self.acked if i >= len(self.chist)]
        if missing:
            return f"acknowledged indexes {missing[:5]} not in the committed history"
        return self.smc.converged(end) if self.smc is not None else None


def _stamp_at(s: Any, i: int) -> tuple[int, int]:
    """The (session, seq) stamped on entry `i` of store `s` ((0, 0): none)."""
    blob, k = s.get_raw(i, 1, 1 << 20)
    if not k:
        return 0, 0
    _size, _idx, session, seq = _STAMP.unpack_from(blob, 0)
    return session, seq
