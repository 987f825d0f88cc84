"""The follower's push handling as data (DLedger's EntryHandler; docs/replication.md "Follower: push
handling").

`FollowerCore` decides what to answer to a leader's push and which store writes that takes; the
handler process only executes what it is told (member lock, store writes, publishing, sending).
Shape: *input + view + store reads → effects*, like `ElectorCore`:

* every call takes ONE member snapshot (`view`: role, term, leader slot), read once by the
  handler for this request. Validation ("is this my leader, in my term?"), the reset of
  `verified_end` when the (term, leader) key changes, and every answer come from that one view.
  No decision mixes two reads of the block: that is what made a COMMIT of a new leader apply
  against the previous leader's verified end (docs/contracts.md C2) — uncommitted entries of the old
  leader became committed.
* the store is only *read* here, through `FollowerStore` (the handler's own store: nobody else
  writes it, so reads within one call are consistent);
* writes come out as effects (`StoreAppend`, `StoreTruncate`, `SetCommitted`) that the handler
  executes in order, under the member lock, after checking with a fresh snapshot taken under the
  lock that the view still holds (`same_leadership`). It reports the outcome back
  (`appended`, `truncated`, `write_failed`), so the core's `verified_end` always describes the
  store as written.

Rules (DLedger's EntryHandler, with the fixes this project found):
* an APPEND whose first index is ledgerEnd + 1 is stored at once, after Raft's check that the
  entry before it is the leader's (pre_log_index/pre_log_term); one further ahead waits in a
  bounded queue keyed by first index (duplicate key → REPEATED_PUSH; full → PUSH_REQUEST_IS_FULL);
  one starting at or below the end skips what already matches (a lost ack's resend is answered
  SUCCESS, never REPEATED_PUSH: DLedger #331) and is INCONSISTENT_STATE if anything conflicts;
* COMPARE / TRUNCATE / COMMIT are answered at once (the queue never blocks them: DLedger #282);
  COMPARE and TRUNCATE drop the queue (answered INCONSISTENT_STATE, the leader starts over);
* TRUNCATE is idempotent: it never cuts at or below `verified_end` (a late or duplicated
  TRUNCATE must not drop entries already acknowledged to this leader) nor at or below the
  committed index (committed entries are in every later leader's log);
* committed = min(leader's commit, verified_end), never backwards: an old-term tail not yet
  verified against this leader is never committed;
* `verified_end` belongs to one (term, leader) key and is reset (and the queue dropped) when the
  key changes;
* the abnormal-push check (once a second): a queued push waiting for a gap that does not fill
  for `max_push_timeout_ms` is answered INCONSISTENT_STATE (the leader compares again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.replication import decide_compare, follower_commit
from node.store import codec
from node.store.base import StoreError

ABNORMAL_CHECK_MS = 1000


class MemberSnapshot(Protocol):
    """What the core reads of one member snapshot (node.block.shared_state.MemberView has it)."""

    role: Role
    current_term: int
    leader_slot: int


class FollowerStore(Protocol):
    """The read-only part of the follower's store the decisions need."""

    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int

    def term_at(self, index: int) -> int: ...
    def first_index_of_term(self, term: int, from_index: int) -> int: ...


# ---- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reply:
    """Answer `req` (the handler fills in its ledger begin/end as they are when it sends)."""

    ident: bytes
    req: P.PushRequest
    code: RC
    term: int
    x_term: int = -1
    x_index: int = -1


@dataclass(frozen=True, slots=True)
class StoreAppend:
    """Append `blob` (index records `recs`, may be empty) under the member lock, if the view
    still holds; then call `FollowerCore.appended` and answer SUCCESS."""

    ident: bytes
    req: P.PushRequest
    blob: memoryview
    recs: bytes | memoryview

    @property
    def run_crc(self) -> int | None:
        """The leader's run CRC to check `blob` and `recs` against (store `append_follower`),
        or None: absent from the push (-1), or `blob` is not the whole pushed run (a matching
        prefix was skipped, so the CRC, taken over all of it, does not apply; the store then
        checks every body CRC)."""
        crc = self.req.run_crc
        if crc < 0 or len(self.blob) != len(self.req.entries):
            return None
        return crc


@dataclass(frozen=True, slots=True)
class StoreTruncate:
    """Truncate from `cut` (a no-op if beyond the end) under the member lock, if the view still
    holds; then call `FollowerCore.truncated` and answer SUCCESS."""

    ident: bytes
    req: P.PushRequest
    cut: int
    base_term: int = -1  # the term of entry cut - 1 when it is committed here, else -1


@dataclass(frozen=True, slots=True)
class SetCommitted:
    """Raise the committed index to `index` and publish the ledger."""

    index: int


@dataclass(frozen=True, slots=True)
class InstallReply:
    """Answer an install chunk: `received` bytes are in place; `installed`: done."""

    ident: bytes
    req: P.InstallRequest
    code: RC
    term: int
    received: int = 0
    installed: bool = False


@dataclass(frozen=True, slots=True)
class ForwardInstall:
    """Hand the chunk to the applier, which owns the snapshot directory and the state
    machine; its answer comes back to `FollowerCore.snapshot_installed`."""

    ident: bytes
    req: P.InstallRequest


@dataclass(frozen=True, slots=True)
class StoreReset:
    """Replace the whole log by an empty one that begins after the installed snapshot
    (`store.reset_to(index, term)`), under the member lock; then `FollowerCore.reset_done`."""

    index: int
    term: int
    meta: bytes = b""  # the snapshot's meta.json: it carries the configuration in force at index


Effect = Reply | StoreAppend | StoreTruncate | SetCommitted | InstallReply | ForwardInstall | StoreReset


@dataclass(slots=True)
class QueuedPush:
    ident: bytes
    req: P.PushRequest
    frame: bytes  # keeps the zero-copy blob alive
    arrived_ms: int


def follow_key(view: MemberSnapshot) -> tuple[int, int] | None:
    """The (term, leader slot) a follower's verified end belongs to; None unless following."""
    return (view.current_term, view.leader_slot) if view.role == Role.FOLLOWER else None


def same_leadership(a: MemberSnapshot, b: MemberSnapshot) -> bool:
    """True when two snapshots describe the same role, term and leader: the handler's re-check
    under the member lock before it executes a write the core decided on snapshot `a`."""
    return a.role == b.role and a.current_term == b.current_term and a.leader_slot == b.leader_slot


class FollowerCore:
    """One follower's push handling. `peer_ids` maps leader slots to ids."""

    def __init__(self, peer_ids: list[str], max_pending_pushes: int, max_push_timeout_ms: int,
                 abnormal_check_ms: int = ABNORMAL_CHECK_MS) -> None:
        self.peer_ids = list(peer_ids)
        self.max_pending_pushes = max_pending_pushes
        self.max_push_timeout_ms = max_push_timeout_ms
        self.abnormal_check_ms = abnormal_check_ms
        self.key: tuple[int, int] | None = None  # (term, leader slot) being followed
        self.verified_end = -1  # my log matches the key's leader up to here
        self.queue: dict[int, QueuedPush] = {}
        self.next_abnormal_check = 0

    def _slot_id(self, slot: int) -> str:
        return self.peer_ids[slot] if 0 <= slot < len(self.peer_ids) else ""

    # ---- view ----------------------------------------------------------------------------------
    def sync(self, view: MemberSnapshot) -> list[Effect]:
        """Adopt `view`'s (term, leader): a new key forgets what was verified and drops the queue
        (each queued push answered INCONSISTENT_STATE in the view's term)."""
        key = follow_key(view)
        if key == self.key:
            return []
        self.key = key
        self.verified_end = -1
        return self._drop_queue(view.current_term)

    def _drop_queue(self, term: int) -> list[Effect]:
        out: list[Effect] = [Reply(q.ident, q.req, RC.INCONSISTENT_STATE, term) for q in self.queue.values()]
        self.queue.clear()
        return out

    def reset(self, view: MemberSnapshot) -> list[Effect]:
        """Forget what was verified and drop the queue (after a failed store write: what the
        store holds is no longer what the core assumed, so the leader must compare again)."""
        self.verified_end = -1
        return self._drop_queue(view.current_term)

    def _refusal(self, view: MemberSnapshot, term: int, leader_id: str) -> RC | None:
        """Why a leader's request in `term` from `leader_id` is not for this follower now."""
        if term != view.current_term:
            return RC.INCONSISTENT_TERM
        if view.role != Role.FOLLOWER:
            return RC.NOT_FOLLOWER
        if self._slot_id(view.leader_slot) != leader_id:
            return RC.INCONSISTENT_LEADER
        return None

    # ---- input: install snapshot -----------------------------------------------------------------
    def on_install(self, ident: bytes, req: P.InstallRequest, view: MemberSnapshot) -> list[Effect]:
        """A chunk of the leader's snapshot: checked like a push (this term, this leader), then
        handed to the applier. The queue of pushes is dropped: a leader that installs has given
        up on appending to this log until the install is done."""
        out = self.sync(view)
        code = self._refusal(view, req.term, req.leader_id)
        if code is not None:
            return [*out, InstallReply(ident, req, code, view.current_term)]
        return [*out, *self._drop_queue(view.current_term), ForwardInstall(ident, req)]

    def snapshot_installed(self, ident: bytes, req: P.InstallRequest, index: int, term: int,
                           view: MemberSnapshot, store: FollowerStore) -> list[Effect]:
        """The applier installed (or already had) the snapshot whose last entry is (index,
        term), and its state machine now reflects it. Raft's InstallSnapshot rule for the log:
        * already committed here (index <= committed): the log holds that prefix; nothing to do;
        * the log holds (index, term): keep it and what follows (those entries match the
          leader's: log matching), and mark index committed (a snapshot covers only committed
          entries);
        * otherwise: discard the whole log; it begins after the snapshot (`StoreReset`).
        Never on a leader: a leader holds every committed entry, so the first two cases cover
        it, and its log is the ack checker's to commit, not this one's."""
        done = InstallReply(ident, req, RC.SUCCESS, view.current_term, installed=True)
        if view.role == Role.LEADER or index <= store.committed_index:
            return [done]
        try:
            holds = (store.ledger_begin_index >= 0
                     and store.ledger_begin_index - 1 <= index <= store.ledger_end_index
                     and store.term_at(index) == term)
        except StoreError:
            holds = False
        if holds:
            if follow_key(view) == self.key:
                self.verified_end = max(self.verified_end, index)
            return [SetCommitted(index), done]
        return [StoreReset(index, term, bytes(req.meta)), done]

    def reset_done(self, index: int, view: MemberSnapshot) -> list[Effect]:
        """A `StoreReset` to `index` succeeded: the log is the snapshot's prefix (all of it the
        leader's, committed), so it is verified up to there; queued pushes are void."""
        out = self.sync(view)
        self.verified_end = index if follow_key(view) == self.key else -1
        return [*out, *self._drop_queue(view.current_term)]

    # ---- input: a push -------------------------------------------------------------------------
    def on_push(self, ident: bytes, req: P.PushRequest, frame: bytes, view: MemberSnapshot, now_ms: int,
                store: FollowerStore) -> list[Effect]:
        """Everything one push leads to, decided on the single snapshot `view`."""
        out = self.sync(view)
        term = view.current_term
        code = self._refusal(view, req.term, req.leader_id)
        if code is not None:
            return [*out, Reply(ident, req, code, term)]
        kind = req.kind
        if kind == P.PushKind.APPEND:
            return out + self._on_append(ident, req, frame, term, now_ms, store)
        if kind == P.PushKind.COMMIT:
            pre = req.pre_log_index
            try:
                if (0 <= store.ledger_begin_index and store.ledger_begin_index - 1 <= pre <= store.ledger_end_index
                        and store.term_at(pre) == req.pre_log_term):  # begin - 1: the log base
                    self.verified_end = max(self.verified_end, pre)  # we hold the leader's entry
            except StoreError:
                pass
            # A leader sends COMMIT only once this follower acknowledged everything up to it
            # (nothing pending). A log that ends before the committed entry lost entries since
            # (a repaired range, a lost disk, an async-mode tail): say so, or an idle leader
            # would never resend them (its watermark says we have them).
            lost = req.pre_log_index > store.ledger_end_index
            return out + self._commit(req.commit_index, store) + [
                Reply(ident, req, RC.INCONSISTENT_STATE if lost else RC.SUCCESS, term)]
        if kind == P.PushKind.COMPARE:
            out += self._drop_queue(term)
            try:
                a = decide_compare(store, req.pre_log_index, req.pre_log_term)
            except StoreError:
                return [*out, Reply(ident, req, RC.INCONSISTENT_STATE, term)]
            if a.code == RC.SUCCESS:
                self.verified_end = max(self.verified_end, req.pre_log_index)
            return [*out, Reply(ident, req, a.code, term, a.x_term, a.x_index)]
        if kind == P.PushKind.TRUNCATE:
            out += self._drop_queue(term)
            # Idempotent: never cut what this leader's entries already verified (a repeated or
            # late TRUNCATE must not drop entries we acknowledged since), nor what is committed:
            # a committed entry is in every later leader's log at the same index and term
            # (Leader Completeness), so keeping it is what the leader asked for. Refusing a cut
            # below the committed index instead left a follower stuck for ever: a leader whose
            # APPEND answers were lost compares again at its old watermark, below what the
            # follower has since stored and committed, and its TRUNCATE there was refused on
            # every retry (found by the simulator, seeds 2579 and 99589).
            cut = max(req.first_index, self.verified_end + 1, store.committed_index + 1)
            # Cutting at the log's begin empties it, which needs the term of the entry before
            # (the new log base). After an install the store has it; after this follower's own
            # retention only the leader does: it rides on the TRUNCATE (pre_log_*), and the
            # entry is committed here, so it is the leader's (see decide_compare).
            base_term = (req.pre_log_term if req.pre_log_index == cut - 1 and req.pre_log_term >= 0
                         and cut - 1 <= store.committed_index else -1)
            return [*out, StoreTruncate(ident, req, cut, base_term)]
        return [*out, Reply(ident, req, RC.UNEXPECTED_ARGUMENT, term)]

    def _on_append(self, ident: bytes, req: P.PushRequest, frame: bytes, term: int, now_ms: int,
                   store: FollowerStore) -> list[Effect]:
        first = req.first_index
        if first > store.ledger_end_index + 1:
            if first in self.queue:
                return [Reply(ident, req, RC.REPEATED_PUSH, term)]
            if len(self.queue) >= self.max_pending_pushes:
                return [Reply(ident, req, RC.PUSH_REQUEST_IS_FULL, term)]
            self.queue[first] = QueuedPush(ident, req, frame, now_ms)
            return []
        return self._append_now(ident, req, term, store)

    def _append_now(self, ident: bytes, req: P.PushRequest, term: int, store: FollowerStore) -> list[Effect]:
        """A push that starts at or before ledgerEnd + 1: skip what is already here (if it
        matches), check the entry before the rest, and store the rest."""
        blob = memoryview(req.entries)
        recs: bytes | memoryview = req.index_records  # lets the store copy the run verbatim
        first, end = req.first_index, store.ledger_end_index
        try:
            if first <= end:  # a resend overlapping what we have: skip the matching prefix
                off, idx = 0, first
                while idx <= end and off < len(blob):
                    h = codec.decode_header(blob, off)
                    if idx < store.ledger_begin_index or store.term_at(idx) != h.term:
                        return [Reply(ident, req, RC.INCONSISTENT_STATE, term)]
                    off += h.size
                    idx += 1
                blob, first, recs = blob[off:], idx, b""
            pre = first - 1
            if pre >= 0 and first == req.first_index and req.pre_log_index == pre:
                # pre may be the log base (begin - 1 after an install): term_at knows its term
                if pre < store.ledger_begin_index - 1 or store.term_at(pre) != req.pre_log_term:
                    return [Reply(ident, req, RC.INCONSISTENT_STATE, term)]
        except (StoreError, codec.CodecError):
            return [Reply(ident, req, RC.INCONSISTENT_STATE, term)]
        if len(blob):
            return [StoreAppend(ident, req, blob, recs)]
        # Everything was here already (a lost ack's resend): it matched, so it is verified.
        self.verified_end = max(self.verified_end, min(end, req.first_index + req.count - 1))
        return self._commit(req.commit_index, store) + [Reply(ident, req, RC.SUCCESS, term)]

    def _commit(self, leader_commit: int, store: FollowerStore) -> list[Effect]:
        new = follower_commit(leader_commit, self.verified_end, store.committed_index)
        return [SetCommitted(new)] if new > store.committed_index else []

    # ---- outcomes of the handler's writes ---------------------------------------------------------
    def appended(self, new_end: int, leader_commit: int, committed: int) -> int:
        """A `StoreAppend` was written and the store now ends at `new_end` (all of it the leader's,
        checked against the entry before it): returns the committed index to set."""
        self.verified_end = new_end
        return follower_commit(leader_commit, self.verified_end, committed)

    def truncated(self, req: P.PushRequest) -> None:
        """A `StoreTruncate` succeeded: the leader compared up to first_index - 1 before sending it."""
        self.verified_end = max(self.verified_end, req.first_index - 1)

    def write_failed(self, view: MemberSnapshot) -> list[Effect]:
        """A store write failed: forget what was verified and drop the queue."""
        return self.reset(view)

    # ---- input: the queue ------------------------------------------------------------------------
    def drain(self, view: MemberSnapshot, store: FollowerStore) -> list[Effect]:
        """The next queued push the log has reached (first index <= ledgerEnd + 1, lowest first),
        as effects; [] if none. The handler calls it after each executed append until [] (one
        push per call, because the next depends on what the store holds after the write)."""
        out = self.sync(view)
        if not self.queue:
            return out
        first = min(self.queue)
        if first > store.ledger_end_index + 1:
            return out
        q = self.queue.pop(first)
        return out + self._append_now(q.ident, q.req, view.current_term, store)

    def check_abnormal(self, view: MemberSnapshot, now_ms: int, store: FollowerStore) -> list[Effect]:
        """Once every `abnormal_check_ms`: queued pushes waiting for a gap that does not fill for
        `max_push_timeout_ms` get INCONSISTENT_STATE (the leader compares again). Queued pushes
        the log has caught up with are left for `drain`, which the handler calls next."""
        out = self.sync(view)
        if now_ms < self.next_abnormal_check or not self.queue:
            return out
        self.next_abnormal_check = now_ms + self.abnormal_check_ms
        end = store.ledger_end_index
        for first in sorted(self.queue):
            q = self.queue[first]
            if first > end + 1 and now_ms - q.arrived_ms >= self.max_push_timeout_ms:
                del self.queue[first]
                out.append(Reply(q.ident, q.req, RC.INCONSISTENT_STATE, view.current_term))
        return out

    def next_deadline(self) -> int | None:
        """When `check_abnormal` next has work (None: nothing queued)."""
        return self.next_abnormal_check if self.queue else None
