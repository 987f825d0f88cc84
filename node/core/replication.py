"""Pure replication decisions (docs/replication.md; DLedger's DLedgerEntryPusher, EntryDispatcher,
EntryHandler and QuorumAckChecker): no sockets, files or clocks — time is passed in, the store
is any object with the LogStore read methods (a MemoryStore in tests).

* `quorum_index` / `commit_index` / `quorum_advance`: the ack checker's rule. The quorum index is the median of the
  current term's watermarks sorted descending (element n//2). It may only become the committed
  index if the entry there is of the current term (Raft §5.4.2, "Figure 8"): counting replicas
  never commits an older term's entry by itself; the new leader's NOOP makes it happen.
* `DispatcherCore`: one follower's push stream, COMPARE → TRUNCATE → APPEND (⇄ COMMIT), back to
  COMPARE on INCONSISTENT_STATE or a new term. It says what to send next (`next_action`) and
  digests responses (`on_response`); the dispatcher process does the I/O.
* `decide_compare` / `decide_truncate` / `follower_commit`: the follower's answers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import IntEnum

from ipc.codes import ResponseCode as RC
from node.core.install import InstallConfig, InstallSender, SendChunk
from node.core.membership import Configuration
from node.store.base import StoreError


# --------------------------------------------------------------------------------------------
# Quorum and commit (QuorumAckChecker)
# --------------------------------------------------------------------------------------------
def quorum_index(watermarks: list[int]) -> int:
    """The highest index stored on a majority: element n//2 of the watermarks sorted
    descending (the leader's own ledger end is one of them). -1 if none."""
    if not watermarks:
        return -1
    return sorted(watermarks, reverse=True)[len(watermarks) // 2]


def commit_index(quorum: int, term_at_quorum: int, current_term: int, committed: int) -> int:
    """The committed index after a quorum index is known: it only moves forward, and only to
    an entry of the current term (older-term entries commit with it, never by counting)."""
    if quorum > committed and term_at_quorum == current_term:
        return quorum
    return committed


def current_term_watermarks(term: int, self_slot: int, ledger_end: int,
                            peers: Sequence[tuple[int, int]],
                            voter_slots: Collection[int] | None = None) -> list[int]:
    """Every voter's watermark as the ack checker counts it: this node's own ledger end for
    `self_slot`, and each follower's (match_index, match_term) if it was earned in `term`;
    watermarks of older terms count as -1 (that is how they are "cleaned").

    `voter_slots` are the slots of the configuration's voters (`voter_slots`); learners' and
    free slots are left out, so `quorum_index` takes a majority of the voters only (a leader
    that is not a voter does not count its own log: docs/membership.md "Counting"). None:
    every slot votes (a static group)."""
    return [ledger_end if slot == self_slot else (mi if mt == term else -1)
            for slot, (mi, mt) in enumerate(peers) if voter_slots is None or slot in voter_slots]


def voter_slots(config: Configuration) -> frozenset[int]:
    """The slots of `config`'s voters while a member's slot is its position in the
    configuration (the bootstrap rule: position in `--peers`, docs/shared_state.md)."""
    return frozenset(i for i, m in enumerate(config.members) if m.voter)


def quorum_advance(term: int, marks: list[int], published_index: int, published_term: int,
                   term_at: Callable[[int], int]) -> int | None:
    """The ack checker's decision: the new quorum index to publish for `term`, or None.

    `published_*` is the quorum pair already in the block (an index counted in another term
    counts as nothing); `term_at` reads the leader's log (it may raise the reader's StaleRead,
    which the caller treats as "not now"). Only an entry of the current term is ever published
    (Raft §5.4.2): older ones commit with it."""
    committed = published_index if published_term == term else -1
    q = quorum_index(marks)
    if q <= committed or q < 0:
        return None
    new = commit_index(q, term_at(q), term, committed)
    return None if new == committed else new


# --------------------------------------------------------------------------------------------
# Dispatcher state machine (EntryDispatcher)
# --------------------------------------------------------------------------------------------
class PushState(IntEnum):
    IDLE = 0  # not leader
    COMPARE = 1
    TRUNCATE = 2
    APPEND = 3
    INSTALL = 4  # streaming the leader's snapshot (node.core.install)


@dataclass(frozen=True, slots=True)
class Compare:
    pre_index: int
    pre_term: int


@dataclass(frozen=True, slots=True)
class Truncate:
    index: int


@dataclass(frozen=True, slots=True)
class Append:
    first_index: int
    max_count: int  # the process reads up to this many entries (and its byte bound) from the store


@dataclass(frozen=True, slots=True)
class Commit:
    commit_index: int


@dataclass(frozen=True, slots=True)
class NeedSnapshot:
    """The follower needs entries the leader no longer has (deleted by retention)."""

    index: int


@dataclass(frozen=True, slots=True)
class InstallChunk:
    """Send bytes [offset, offset + length) of the snapshot being installed (0: the probe)."""

    offset: int
    length: int


Action = Compare | Truncate | Append | Commit | NeedSnapshot | InstallChunk


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    max_pending: int = 1000  # pushes in flight (DLedger maxPendingSize)
    max_push_timeout_ms: int = 1000
    commit_interval_ms: int = 1000  # an idle follower still learns the commit index this often
    commit_eager_ms: int = 20  # after a commit advance, tell an idle follower this soon
    request_timeout_ms: int = 1000  # COMPARE / TRUNCATE unanswered → ask again
    retry_backoff_ms: int = 50  # after a refusal (not follower yet, term mismatch)


class DispatcherCore:
    """One follower's push stream, as data. `match_index` is the peer's watermark in `term`."""

    def __init__(self, cfg: DispatcherConfig | None = None) -> None:
        self.cfg = cfg or DispatcherConfig()
        self.state = PushState.IDLE
        self.term = -1
        self.write_index = 0
        self.match_index = -1
        self.pending: OrderedDict[int, tuple[int, int]] = OrderedDict()  # first → (sent_ms, last)
        self.inflight_request: tuple[int, int] | None = None  # (request kind, sent_ms) for COMPARE/TRUNCATE
        self.last_commit_sent = -1
        self.last_commit_ms = -(10**12)
        self.not_before_ms = 0
        self.backup: tuple[int, int, int] | None = None  # (x_term, x_index, compared index)
        self.install: InstallSender | None = None  # the snapshot being sent (state INSTALL)
        self.installed: tuple[int, int] | None = None  # (index, term) the follower installed
        # A compare below the leader's log begin, at a known snapshot position, that the
        # follower refused: it lacks that position, and nothing below it can be sent, so the
        # next compare there must be an install instead (else compare → refuse → clamp → compare
        # again at the same position, for ever: found by the simulator, seeds 19 and 27).
        self.known_compare_refused = -1

    # ---- lifecycle ------------------------------------------------------------------------
    def become_leader(self, term: int, ledger_end: int) -> None:
        """changeState on a new term (or a restarted dispatcher): start over with COMPARE."""
        self.term = term
        self.state = PushState.COMPARE
        self.write_index = ledger_end + 1
        self.match_index = -1
        self.pending.clear()
        self.inflight_request = None
        self.last_commit_sent = -1
        self.not_before_ms = 0
        self.backup = None
        self.install = None
        self.installed = None
        self.known_compare_refused = -1

    def step_down(self) -> None:
        self.state = PushState.IDLE
        self.pending.clear()
        self.inflight_request = None
        self.install = None

    # ---- install snapshot ---------------------------------------------------------------------
    def start_install(self, last_index: int, last_term: int, size: int,
                      cfg: InstallConfig | None = None) -> None:
        """After `NeedSnapshot`: send the snapshot (last_index, last_term, size) instead of the
        entries it covers. The process found it (the leader's newest valid snapshot)."""
        self.state = PushState.INSTALL
        self.pending.clear()
        self.inflight_request = None
        self.install = InstallSender(last_index, last_term, size, cfg)

    def abandon_install(self, now_ms: int, retry_ms: int) -> None:
        """The snapshot being sent is gone (pruned for a newer one) or unreadable: compare
        again after `retry_ms`, which finds the follower still needs one and starts over."""
        self.install = None
        self._to_compare(now_ms)
        self.not_before_ms = now_ms + retry_ms

    def on_install_response(self, offset: int, code: int, now_ms: int, *, received: int = -1,
                            installed: bool = False) -> None:
        """An answer to an install chunk. Once installed, the follower's log begins after the
        snapshot: compare there (its term is known from the snapshot, `known_position`)."""
        ins = self.install
        if self.state != PushState.INSTALL or ins is None:
            return
        if code not in (RC.SUCCESS, RC.INCONSISTENT_STATE):
            self.abandon_install(now_ms, self.cfg.retry_backoff_ms)  # not following us: start over
            return
        if ins.on_response(offset, code == RC.SUCCESS, received, installed and code == RC.SUCCESS, now_ms):
            self.installed = (ins.last_index, ins.last_term)
            self.known_compare_refused = -1
            self.install = None
            self._to_compare(now_ms)
            self.write_index = ins.last_index + 1

    def _to_compare(self, now_ms: int, backoff: bool = False) -> None:
        self.state = PushState.COMPARE
        self.pending.clear()
        self.inflight_request = None
        if backoff:
            self.not_before_ms = now_ms + self.cfg.retry_backoff_ms

    # ---- what to send -----------------------------------------------------------------------
    def known_position(self, index: int, snapshot: tuple[int, int] | None) -> int | None:
        """The term of `index` when the leader's log no longer holds it but a snapshot position
        does: the leader's newest snapshot, or the one this follower installed. None if unknown."""
        for pos in (snapshot, self.installed):
            if pos is not None and pos[0] == index:
                return pos[1]
        return None

    def next_action(self, now_ms: int, begin: int, end: int, committed: int, term_at,  # noqa: ANN001
                    snapshot: tuple[int, int] | None = None) -> Action | None:
        """The next message to send, or None (wait for a response, an append, or a timer).
        `term_at(i)` reads the leader's store; begin/end/committed are its ledger; `snapshot`
        is the (last index, term) of the leader's newest snapshot, if it has one."""
        if self.state == PushState.IDLE or now_ms < self.not_before_ms:
            return None
        if self.state == PushState.INSTALL:
            chunk = self.install.next_action(now_ms) if self.install else None
            return InstallChunk(chunk.offset, chunk.length) if chunk else None
        if self.state in (PushState.COMPARE, PushState.TRUNCATE):
            if self.inflight_request is not None:
                if now_ms - self.inflight_request[1] < self.cfg.request_timeout_ms:
                    return None
                self._to_compare(now_ms)  # unanswered: start again
            self.inflight_request = (int(self.state), now_ms)
            if self.state == PushState.TRUNCATE:
                return Truncate(self.match_index + 1)
            if self.backup is not None:
                self.write_index = _backup_target(*self.backup, begin, end, term_at)
                self.backup = None
            # COMPARE at writeIndex - 1 (clamped into the leader's log)
            self.write_index = max(min(self.write_index, end + 1), max(begin, 0))
            pre = self.write_index - 1
            if end < 0 or pre < 0:
                return Compare(-1, -1)  # empty leader log, or compare from the very start
            if pre < begin:
                known = self.known_position(pre, snapshot)
                if known is not None and pre != self.known_compare_refused:
                    return Compare(pre, known)  # a snapshot's last entry (after an install)
                self.inflight_request = None
                return NeedSnapshot(pre)
            return Compare(pre, term_at(pre))
        # APPEND
        if self.pending:
            first, (sent, _last) = next(iter(self.pending.items()))
            if now_ms - sent >= self.cfg.max_push_timeout_ms:
                # The oldest push went unanswered: resend everything from the watermark.
                self.pending.clear()
                self.write_index = self.match_index + 1
        if self.write_index <= end and len(self.pending) < self.cfg.max_pending:
            if self.write_index < begin:
                return NeedSnapshot(self.write_index)
            return Append(self.write_index, end - self.write_index + 1)
        if not self.pending and committed > self.last_commit_sent:
            if now_ms - self.last_commit_ms >= self.cfg.commit_eager_ms:
                return Commit(committed)
        elif not self.pending and now_ms - self.last_commit_ms >= self.cfg.commit_interval_ms:
            return Commit(committed)
        return None

    def sent(self, action: Action, now_ms: int, last_index: int = -1) -> None:
        """Record that `action` went out (for Append: it carried entries up to `last_index`)."""
        if isinstance(action, Append):
            self.pending[action.first_index] = (now_ms, last_index)
            self.write_index = last_index + 1
        elif isinstance(action, Commit):
            self.last_commit_sent = action.commit_index
            self.last_commit_ms = now_ms
        elif isinstance(action, InstallChunk) and self.install is not None:
            self.install.sent(SendChunk(action.offset, action.length), now_ms)

    def next_deadline(self, now_ms: int, committed: int = -1) -> int:
        """When `next_action` may have something new to say without any input (`committed`:
        the leader's committed index, which decides whether an eager COMMIT is due)."""
        due = [now_ms + self.cfg.commit_interval_ms]
        if self.not_before_ms > now_ms:
            due.append(self.not_before_ms)
        if self.inflight_request is not None:
            due.append(self.inflight_request[1] + self.cfg.request_timeout_ms)
        if self.pending:
            due.append(next(iter(self.pending.values()))[0] + self.cfg.max_push_timeout_ms)
        if self.install is not None and (d := self.install.next_deadline()) is not None:
            due.append(d)
        if self.state == PushState.APPEND and not self.pending:  # idle COMMITs are only sent then
            due.append(self.last_commit_ms + self.cfg.commit_interval_ms)
            if committed > self.last_commit_sent:
                due.append(self.last_commit_ms + self.cfg.commit_eager_ms)
        return max(now_ms, min(due))

    # ---- responses --------------------------------------------------------------------------
    def on_response(self, kind: str, code: int, now_ms: int, *, index: int = -1, end_index: int = -1,
                    x_term: int = -1, x_index: int = -1, first_index: int = -1) -> bool:
        """Digest a push response. Returns True when the watermark (match_index) moved."""
        if self.state == PushState.IDLE:
            return False
        if kind == "COMPARE":
            if self.state != PushState.COMPARE or first_index != self.write_index - 1:
                return False  # a late answer about another compare (reordered or resent)
            self.inflight_request = None
            if code == RC.SUCCESS:
                self.match_index = self.write_index - 1
                self.state = PushState.TRUNCATE
                return True
            if code == RC.INCONSISTENT_STATE:
                self.known_compare_refused = first_index
                if x_term != -1:  # fast backup, resolved against our log in next_action
                    self.backup = (x_term, x_index, self.write_index - 1)
                else:  # the follower lacks the entry: continue from its end
                    self.write_index = end_index + 1
                return False
            self.not_before_ms = now_ms + self.cfg.retry_backoff_ms
            return False
        if kind == "TRUNCATE":
            if self.state != PushState.TRUNCATE or first_index != self.match_index + 1:
                return False
            self.inflight_request = None
            if code == RC.SUCCESS:
                self.state = PushState.APPEND
                self.write_index = self.match_index + 1
                self.pending.clear()
            else:
                self._to_compare(now_ms, backoff=True)
            return False
        if kind == "APPEND":
            if self.state != PushState.APPEND:
                return False
            if code == RC.SUCCESS:
                # Never pop by first index: a resend reuses it, and a late SUCCESS of the
                # original must not cancel the resend. Drop what the watermark covers.
                moved = index > self.match_index
                self.match_index = max(self.match_index, index)
                for k in [k for k, (_s, last) in self.pending.items() if last <= self.match_index]:
                    del self.pending[k]
                return moved
            entry = self.pending.pop(first_index, None)
            if code == RC.REPEATED_PUSH:
                if entry is not None:  # the original is still being handled; keep waiting for it
                    self.pending[first_index] = entry
                    self.pending.move_to_end(first_index, last=False)
                return False
            self._to_compare(now_ms, backoff=code != RC.INCONSISTENT_STATE)
            return False
        if (kind == "COMMIT" and code == RC.INCONSISTENT_STATE and self.state == PushState.APPEND
                and not self.pending and end_index < self.match_index):
            # The follower lacks the committed entry our watermark says it has (it lost
            # entries: a repair, a wiped disk): compare again from its end. (With appends in
            # flight the answer may predate them: their answers decide then.)
            self.write_index = min(self.write_index, max(end_index, -1) + 1)
            self._to_compare(now_ms)
        return False  # other COMMIT responses carry nothing we need


def _backup_target(x_term: int, x_index: int, compared: int, begin: int, end: int, term_at) -> int:  # noqa: ANN001
    """Where to compare next after the follower said "my entry at `compared` is of term x_term,
    which starts at x_index". If our log has entries of x_term, continue after our last one
    (everything up to it agrees); else skip the follower's whole x_term run. (DLedger jumps to
    x_index unconditionally: when x_term also holds committed entries that lands below the
    committed prefix and the follower must refuse the truncation — found by a test.)"""
    hi = min(compared - 1, end)
    lo = max(begin, 0)
    if hi < lo:
        return x_index
    # our terms never decrease: find the last index <= hi whose term is <= x_term
    if term_at(lo) > x_term:
        return x_index
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if term_at(mid) <= x_term:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1 if term_at(lo) == x_term else x_index


# --------------------------------------------------------------------------------------------
# Follower decisions (EntryHandler)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CompareAnswer:
    code: RC
    x_term: int = -1
    x_index: int = -1


def decide_compare(store, pre_index: int, pre_term: int) -> CompareAnswer:  # noqa: ANN001
    """handleDoCompare: do I hold the leader's entry (pre_index, pre_term)?"""
    if pre_index == -1 and pre_term == -1:
        return CompareAnswer(RC.SUCCESS)  # empty leader log: nothing to agree on
    begin, end = store.ledger_begin_index, store.ledger_end_index
    if pre_index < 0 or end < 0 or pre_index > end:
        return CompareAnswer(RC.INCONSISTENT_STATE)  # I lack it: the leader jumps to my end + 1
    if pre_index < begin - 1:
        return CompareAnswer(RC.INCONSISTENT_STATE)  # deleted here: needs a snapshot/reset
    if pre_index == begin - 1:
        # Known as the log base of a log that begins after an installed snapshot (term_at
        # answers it). After this follower's own retention it is deleted; if it is committed
        # here it is still the leader's entry (a committed entry is in every later leader's
        # log at the same index and term), so the compare succeeds, and the TRUNCATE that
        # follows carries its term. Refusing it left a follower whose retention cut its log
        # right after its committed index, with an old leader's tail from there, compared at
        # that index for ever (found by the simulator, seeds 50664, 60045).
        try:
            mine = store.term_at(pre_index)
        except StoreError:
            ok = 0 <= pre_index <= store.committed_index
            return CompareAnswer(RC.SUCCESS if ok else RC.INCONSISTENT_STATE)
    else:
        mine = store.term_at(pre_index)
    if mine == pre_term:
        return CompareAnswer(RC.SUCCESS)
    return CompareAnswer(RC.INCONSISTENT_STATE, mine, store.first_index_of_term(mine, pre_index))


def follower_commit(leader_commit: int, verified_end: int, committed: int) -> int:
    """committed = min(leader's commit, what this follower verified to match the leader in
    this term); never backwards."""
    return max(committed, min(leader_commit, verified_end))
