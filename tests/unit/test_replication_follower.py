"""The follower's side of replication (DLedger's EntryHandler: seed 000 §6.4, seed 002 §4.4;
SPEC §5 "Handler as follower"; Raft paper §5.3).

Two layers:
* the pure decisions, as tables: `decide_compare` (handleDoCompare) and `follower_commit`;
* the handler process's push handling (`Handler.on_push` and what it calls), driven for real
  with a MemoryStore, a fake shared block and a fake clock instead of sockets, so every
  queueing rule (REPEATED_PUSH, PUSH_REQUEST_IS_FULL, the abnormal-push check) is pinned.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, OrderedDict
from types import SimpleNamespace

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.replication import CompareAnswer, decide_compare, follower_commit
from node.roles import handler as H
from node.shared_state import NO_SLOT, MemberView
from node.store.memory_store import MemoryStore


def store_of(terms: list[int], tag: bytes = b"") -> MemoryStore:
    s = MemoryStore()
    for i, t in enumerate(terms):
        s.append_leader(b"e%d-t%d%s" % (i, t, tag), t)
    return s


class BegunStore:
    """A log whose first entries were deleted by retention (begin > 0): MemoryStore cannot
    express that, and decide_compare only reads these four things."""

    def __init__(self, begin: int, terms: list[int]) -> None:
        self.ledger_begin_index = begin
        self.ledger_end_index = begin + len(terms) - 1
        self._terms = terms

    def term_at(self, i: int) -> int:
        assert self.ledger_begin_index <= i <= self.ledger_end_index, i
        return self._terms[i - self.ledger_begin_index]

    def first_index_of_term(self, term: int, i: int) -> int:
        while i > self.ledger_begin_index and self.term_at(i - 1) == term:
            i -= 1
        return i


# ------------------------------------------------------------------------------------------
# decide_compare (handleDoCompare, seed 000 §6.4.4)
# ------------------------------------------------------------------------------------------
S = RC.SUCCESS
X = RC.INCONSISTENT_STATE
COMPARE_ROWS = [
    # (my log terms, leader's (pre_index, pre_term), answer)
    pytest.param([], (-1, -1), CompareAnswer(S), id="empty-leader-empty-me"),
    pytest.param([1, 1, 2], (-1, -1), CompareAnswer(S), id="empty-leader-(-1,-1)-always-success"),
    pytest.param([], (0, 1), CompareAnswer(X), id="i-am-empty"),
    pytest.param([1, 1], (2, 1), CompareAnswer(X), id="pre-just-beyond-my-end"),
    pytest.param([1, 1], (9, 3), CompareAnswer(X), id="pre-far-beyond-my-end"),
    pytest.param([1, 1], (-1, 2), CompareAnswer(X), id="negative-index-with-a-term"),
    pytest.param([1, 1, 2], (2, 2), CompareAnswer(S), id="same-term-at-my-end"),
    pytest.param([1, 1, 2, 2], (1, 1), CompareAnswer(S), id="same-term-inside-my-log"),
    pytest.param([1, 1, 2], (0, 1), CompareAnswer(S), id="same-term-at-index-0"),
    pytest.param([1, 1, 2, 2, 2], (4, 3), CompareAnswer(X, 2, 2), id="different-term-x-index-is-first-of-my-term"),
    pytest.param([1, 1, 2, 2, 2], (3, 3), CompareAnswer(X, 2, 2), id="different-term-inside-the-run"),
    pytest.param([1, 1, 1, 1], (3, 2), CompareAnswer(X, 1, 0), id="my-term-run-starts-at-0"),
    pytest.param([1, 4, 4], (2, 3), CompareAnswer(X, 4, 1), id="my-term-is-newer-than-the-leaders-there"),
    pytest.param([1, 2, 3], (2, -1), CompareAnswer(X, 3, 2), id="leader-sent-term-minus-one"),
]


@pytest.mark.parametrize(("terms", "pre", "answer"), COMPARE_ROWS)
def test_decide_compare_table(terms: list[int], pre: tuple[int, int], answer: CompareAnswer) -> None:
    assert decide_compare(store_of(terms), *pre) == answer


@pytest.mark.parametrize(("pre", "answer"), [
    pytest.param((3, 2), CompareAnswer(X), id="pre-below-my-begin-needs-snapshot"),
    pytest.param((4, 2), CompareAnswer(X), id="pre-just-below-my-begin"),
    pytest.param((5, 2), CompareAnswer(S), id="pre-at-my-begin"),
    pytest.param((7, 4), CompareAnswer(X, 3, 7), id="different-term-at-my-end"),
    pytest.param((6, 3), CompareAnswer(X, 2, 5), id="x-run-cut-at-my-begin"),
])
def test_decide_compare_with_a_ledger_begin(pre: tuple[int, int], answer: CompareAnswer) -> None:
    # entries 0..4 deleted here; 5, 6 of term 2, 7 of term 3
    assert decide_compare(BegunStore(5, [2, 2, 3]), *pre) == answer


# ------------------------------------------------------------------------------------------
# follower_commit: max(committed, min(leader_commit, verified_end))
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("leader_commit", "verified", "committed", "expected"), [
    pytest.param(5, 9, 2, 5, id="leader-commit-below-verified"),
    pytest.param(9, 5, 2, 5, id="capped-by-what-i-verified"),
    pytest.param(9, -1, -1, -1, id="nothing-verified-yet-new-leader"),
    pytest.param(9, -1, 3, 3, id="nothing-verified-keeps-old-committed"),
    pytest.param(1, 5, 3, 3, id="never-backwards-leader-commit-lower"),
    pytest.param(-1, 5, 3, 3, id="leader-knows-nothing"),
    pytest.param(5, 5, 5, 5, id="all-equal"),
])
def test_follower_commit_table(leader_commit: int, verified: int, committed: int, expected: int) -> None:
    # seed 000 §6.4.6: committedIndex = min(ledgerEndIndex, request.commitIndex); we cap by the
    # end *verified against this leader* (an unverified old-term tail is never committed).
    assert follower_commit(leader_commit, verified, committed) == expected


# ------------------------------------------------------------------------------------------
# The handler process's push handling, for real
# ------------------------------------------------------------------------------------------
PEERS = ["n0", "n1", "n2"]
TERM = 2


class FakeState:
    """The parts of the shared block the handler reads and writes during pushes."""

    def __init__(self) -> None:
        self.set_member(Role.FOLLOWER, TERM, 0)
        self.ledger: dict = {}
        self.counters: Counter = Counter()

    def set_member(self, role: Role, term: int, leader_slot: int) -> None:
        self.member = MemberView(role, term, leader_slot, NO_SLOT, NO_SLOT, 0, 0, 0)

    def read_member(self) -> MemberView:
        return self.member

    def write_ledger(self, **kw) -> None:  # noqa: ANN003
        self.ledger.update(kw)

    def incr(self, name: str, delta: int = 1) -> None:
        self.counters[name] += delta


class Follower:
    """handler.Handler (node n1) with a MemoryStore; replies are collected instead of sent."""

    def __init__(self, store: MemoryStore, monkeypatch: pytest.MonkeyPatch, max_pending: int = 4) -> None:
        self.now = 1_000
        monkeypatch.setattr(H, "monotonic_ms", lambda: self.now)
        h = H.Handler.__new__(H.Handler)
        h.cfg = SimpleNamespace(id="n1", group="g", peer_ids=PEERS, max_pending_pushes=max_pending,
                                max_push_timeout_ms=1_000)
        h.log = logging.getLogger("test.follower")
        h.state = FakeState()
        h.peer_ids = PEERS
        h.lock = contextlib.nullcontext()
        h.store = store
        h.leader_term, h.pending, h.pending_entries = -1, OrderedDict(), 0
        h.follow_key, h.verified_end, h.queue, h.next_abnormal_check = None, -1, {}, 0
        self.replies: list[P.PushResponse] = []
        h._reply = lambda _ident, msg: self.replies.append(msg)
        self.h = h
        self.rid = 0

    @property
    def store(self) -> MemoryStore:
        return self.h.store

    def push(self, kind: P.PushKind, *, term: int = TERM, leader: str = "n0", commit: int = -1,
             first: int = -1, blob: bytes = b"", count: int = 0, pre: tuple[int, int] = (-1, -1)) -> int:
        self.rid += 1
        req = P.PushRequest(group="g", remote_id="n1", leader_id=leader, term=term, kind=kind,
                            commit_index=commit, first_index=first, count=count, entries=blob,
                            pre_log_index=pre[0], pre_log_term=pre[1], request_id=self.rid)
        self.h.on_push(b"L", req, b"")
        return self.rid

    def append(self, leader_log: MemoryStore, first: int, last: int, commit: int = -1) -> int:
        blob, n = leader_log.get_raw(first, last - first + 1, 1 << 20)
        pre = first - 1
        pre_term = leader_log.term_at(pre) if pre >= 0 else -1
        return self.push(P.PushKind.APPEND, first=first, blob=blob, count=n, pre=(pre, pre_term),
                         commit=commit)

    def answer(self, rid: int) -> P.PushResponse | None:
        got = [r for r in self.replies if r.request_id == rid]
        assert len(got) <= 1, f"request {rid} answered {len(got)} times"
        return got[0] if got else None

    def terms(self) -> list[int]:
        s = self.store
        return [s.term_at(i) for i in range(max(s.ledger_begin_index, 0), s.ledger_end_index + 1)]


@pytest.fixture
def leader_log() -> MemoryStore:
    return store_of([1, 1, 2, 2, 2, 2, 2, 2])


@pytest.mark.parametrize(("member", "push_term", "push_leader", "code"), [
    pytest.param((Role.FOLLOWER, TERM, 0), TERM - 1, "n0", RC.INCONSISTENT_TERM, id="older-term"),
    pytest.param((Role.FOLLOWER, TERM, 0), TERM + 1, "n0", RC.INCONSISTENT_TERM, id="newer-term"),
    pytest.param((Role.CANDIDATE, TERM, NO_SLOT), TERM, "n0", RC.NOT_FOLLOWER, id="not-follower"),
    pytest.param((Role.FOLLOWER, TERM, 2), TERM, "n0", RC.INCONSISTENT_LEADER, id="other-leader"),
])
def test_push_refused_unless_from_my_leader_in_my_term(monkeypatch: pytest.MonkeyPatch, member: tuple,
                                                      push_term: int, push_leader: str, code: RC) -> None:
    f = Follower(store_of([1, 1]), monkeypatch)
    f.h.state.set_member(*member)
    for kind in P.PushKind:
        rid = f.push(kind, term=push_term, leader=push_leader, first=2, pre=(1, 1))
        r = f.answer(rid)
        assert r.code == code
        assert r.term == member[1]  # my term: the leader learns it is behind
    assert f.terms() == [1, 1]


def test_append_at_end_plus_one_is_stored_and_commit_follows(monkeypatch, leader_log) -> None:
    f = Follower(store_of([1, 1, 2]), monkeypatch)
    assert f.answer(f.push(P.PushKind.COMPARE, pre=(2, 2))).code == RC.SUCCESS
    rid = f.append(leader_log, 3, 5, commit=4)
    r = f.answer(rid)
    assert (r.code, r.index, r.end_index) == (RC.SUCCESS, 5, 5)  # index = my new ledger end
    assert f.terms() == [1, 1, 2, 2, 2, 2]
    assert f.store.committed_index == 4  # min(leader commit 4, verified end 5)
    assert f.h.state.ledger["ledger_end_index"] == 5  # published for the elector's vote checks


def test_append_whose_previous_entry_differs_is_refused(monkeypatch, leader_log) -> None:
    # Raft §5.3 consistency check (the dispatcher sends preLogIndex/preLogTerm with APPEND).
    f = Follower(store_of([1, 1, 1]), monkeypatch)  # index 2 is term 1 here, term 2 there
    rid = f.append(leader_log, 3, 4)
    assert f.answer(rid).code == RC.INCONSISTENT_STATE
    assert f.terms() == [1, 1, 1]


def test_push_ahead_of_a_gap_waits_then_both_apply_in_order(monkeypatch, leader_log) -> None:
    # seed 000 §6.1.3: appends are applied at ledgerEnd + 1; one further ahead waits.
    f = Follower(store_of([1, 1]), monkeypatch)
    later = f.append(leader_log, 4, 5, commit=3)
    assert f.answer(later) is None and list(f.h.queue) == [4]
    first = f.append(leader_log, 2, 3, commit=3)
    assert f.answer(first).code == RC.SUCCESS
    assert f.answer(later).code == RC.SUCCESS
    assert [r.request_id for r in f.replies] == [first, later]
    assert f.terms() == [1, 1, 2, 2, 2, 2]
    assert not f.h.queue


def test_duplicate_queued_push_is_repeated_push(monkeypatch, leader_log) -> None:
    # seed 002 §4.4 handlePush: writeRequestMap.putIfAbsent → REPEATED_PUSH for a duplicate.
    f = Follower(store_of([1, 1]), monkeypatch)
    a = f.append(leader_log, 4, 5)
    b = f.append(leader_log, 4, 6)
    assert f.answer(a) is None
    assert f.answer(b).code == RC.REPEATED_PUSH


def test_full_push_queue_is_push_request_is_full(monkeypatch, leader_log) -> None:
    f = Follower(store_of([1, 1]), monkeypatch, max_pending=2)
    f.append(leader_log, 4, 4)
    f.append(leader_log, 5, 5)
    rid = f.append(leader_log, 6, 6)
    assert f.answer(rid).code == RC.PUSH_REQUEST_IS_FULL
    assert len(f.h.queue) == 2


def test_resend_overlapping_what_i_have_appends_only_the_new_part(monkeypatch, leader_log) -> None:
    f = Follower(store_of([1, 1, 2, 2]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(3, 2))
    rid = f.append(leader_log, 2, 6)
    assert f.answer(rid).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2, 2, 2, 2]
    assert f.store.get(2).body == leader_log.get(2).body


def test_resend_of_entries_already_stored_is_success_not_repeated_push(monkeypatch, leader_log) -> None:
    # SPEC §8 / DLedger #331: the ack of a push was lost and the leader resends it; the
    # follower must acknowledge it (never loop on REPEATED_PUSH).
    f = Follower(store_of([1, 1, 2, 2, 2]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(4, 2))
    rid = f.append(leader_log, 2, 4, commit=3)
    r = f.answer(rid)
    assert (r.code, r.index) == (RC.SUCCESS, 4)
    assert f.store.committed_index == 3
    assert f.h.verified_end == 4


def test_overlap_that_conflicts_is_inconsistent(monkeypatch, leader_log) -> None:
    f = Follower(store_of([1, 1, 1, 1]), monkeypatch)  # term 1 at 2, 3: not the leader's
    rid = f.append(leader_log, 2, 5)
    assert f.answer(rid).code == RC.INCONSISTENT_STATE
    assert f.terms() == [1, 1, 1, 1]


def test_compare_answers_and_clears_the_append_queue(monkeypatch, leader_log) -> None:
    # seed 002 §4.4: COMPARE/TRUNCATE clear writeRequestMap; we answer the dropped pushes
    # INCONSISTENT_STATE instead of letting them time out.
    f = Follower(store_of([1, 1, 2, 2, 3]), monkeypatch)
    queued = f.append(leader_log, 7, 7)
    rid = f.push(P.PushKind.COMPARE, pre=(4, 2))
    assert f.answer(queued).code == RC.INCONSISTENT_STATE
    r = f.answer(rid)
    assert (r.code, r.x_term, r.x_index, r.end_index) == (RC.INCONSISTENT_STATE, 3, 4, 4)
    assert not f.h.queue
    rid = f.push(P.PushKind.COMPARE, pre=(3, 2))
    assert f.answer(rid).code == RC.SUCCESS
    assert f.h.verified_end == 3


def test_compare_beyond_my_end_returns_my_end(monkeypatch) -> None:
    f = Follower(store_of([1, 1]), monkeypatch)
    r = f.answer(f.push(P.PushKind.COMPARE, pre=(6, 2)))
    assert (r.code, r.x_term, r.end_index) == (RC.INCONSISTENT_STATE, -1, 1)


def test_truncate_drops_the_tail_and_verifies_up_to_the_cut(monkeypatch, leader_log) -> None:
    # seed 000 §6.4.5 handleDoTruncate.
    f = Follower(store_of([1, 1, 1, 1, 1]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    r = f.answer(f.push(P.PushKind.TRUNCATE, first=2, commit=1))
    assert (r.code, r.end_index) == (RC.SUCCESS, 1)
    assert f.terms() == [1, 1]
    assert f.h.verified_end == 1
    assert f.answer(f.append(leader_log, 2, 3)).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2]


def test_truncate_beyond_my_end_is_a_no_op_success(monkeypatch) -> None:
    f = Follower(store_of([1, 1]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2)).code == RC.SUCCESS
    assert f.terms() == [1, 1]


def test_truncate_of_committed_entries_is_refused(monkeypatch) -> None:
    # The store never drops committed entries (docs/store.md "Truncate"); the leader hears
    # INCONSISTENT_STATE and compares again.
    s = store_of([1, 1, 1, 1])
    s.set_committed_index(2)
    f = Follower(s, monkeypatch)
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=1)).code == RC.INCONSISTENT_STATE
    assert f.terms() == [1, 1, 1, 1]


def test_commit_push_advances_committed_only_over_verified_entries(monkeypatch) -> None:
    # An old-term tail not yet compared with this leader must not become committed just
    # because the leader's commit index is high (Raft §5.3/§5.4: the follower's entries past
    # the agreed point may still be overwritten). Here 2, 3 are term-1 entries the new leader
    # of term 2 does not have.
    f = Follower(store_of([1, 1, 1, 1]), monkeypatch)
    assert f.answer(f.push(P.PushKind.COMMIT, commit=3)).code == RC.SUCCESS
    assert f.store.committed_index == -1
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    f.push(P.PushKind.COMMIT, commit=3)
    assert f.store.committed_index == 1


def test_new_leader_resets_verified_end_and_drops_the_queue(monkeypatch, leader_log) -> None:
    f = Follower(store_of([1, 1, 2, 2]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(3, 2))
    queued = f.append(leader_log, 6, 6)
    assert f.h.verified_end == 3
    f.h.state.set_member(Role.FOLLOWER, TERM + 1, 2)  # the elector follows n2 in a new term
    rid = f.push(P.PushKind.COMMIT, term=TERM + 1, leader="n2", commit=3)
    assert f.answer(queued).code == RC.INCONSISTENT_STATE
    assert f.answer(rid).code == RC.SUCCESS
    assert f.h.verified_end == -1
    assert f.store.committed_index == -1  # nothing verified against n2 yet


def test_abnormal_check_answers_a_gap_that_never_fills(monkeypatch, leader_log) -> None:
    # seed 000 §6.4.7 checkAbnormalFuture: once a second; a push waiting beyond
    # ledgerEnd + 1 for longer than the push timeout → INCONSISTENT_STATE (leader compares).
    f = Follower(store_of([1, 1]), monkeypatch)
    rid = f.append(leader_log, 4, 5)
    f.h._check_abnormal_pushes(f.now)  # arms the once-a-second check; too young to fail
    assert f.answer(rid) is None
    f.now += 999
    f.h._check_abnormal_pushes(f.now)
    assert f.answer(rid) is None  # not checked again within the second
    f.now += 1
    f.h._check_abnormal_pushes(f.now)
    assert f.answer(rid).code == RC.INCONSISTENT_STATE
    assert not f.h.queue


def test_abnormal_check_acknowledges_a_queued_push_the_log_caught_up_with(monkeypatch, leader_log) -> None:
    # seed 000 §6.4.7 "PushFallBehind": a queued push now at or below ledgerEnd is answered
    # SUCCESS if it matches (the leader's earlier ack was lost).
    f = Follower(store_of([1, 1]), monkeypatch)
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    queued = f.append(leader_log, 4, 5)
    big = f.append(leader_log, 2, 6)  # a resend from the watermark covers the queued one
    assert f.answer(big).code == RC.SUCCESS
    assert f.answer(queued) is None  # still queued (its key was not end + 1 when drained)
    f.h._check_abnormal_pushes(f.now)
    r = f.answer(queued)
    assert (r.code, r.index) == (RC.SUCCESS, 6)


# ------------------------------------------------------------------------------------------
# BUG (doubtful under TCP; real under Raft's network model): TRUNCATE is not idempotent
# ------------------------------------------------------------------------------------------
def test_bug_duplicate_truncate_must_not_drop_entries_already_acknowledged(monkeypatch, leader_log) -> None:
    """BUG: `_on_truncate` truncates unconditionally. A TRUNCATE(m + 1) delivered again
    (duplicated, or delayed past the APPENDs that followed it — possible across a dispatcher
    restart, whose new connection is fair-queued with the old one at the follower's ROUTER)
    drops entries this follower already acknowledged in this term; the leader has counted
    them in its quorum and may have committed them, so a committed entry can end up on fewer
    than a majority. Raft §5.3 only ever deletes *conflicting* entries, which makes stale
    requests harmless.
    Fix: in `_on_truncate`, cut from max(first_index, verified_end + 1) (entries up to
    verified_end are known to match this leader), and in COMPARE SUCCESS keep
    verified_end = max(verified_end, pre_log_index)."""
    f = Follower(store_of([1, 1, 1]), monkeypatch)  # index 2: an old term-1 entry, must go
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2)).code == RC.SUCCESS
    r = f.answer(f.append(leader_log, 2, 5, commit=-1))
    assert (r.code, r.index) == (RC.SUCCESS, 5)  # the leader now counts 5 for this follower
    f.push(P.PushKind.TRUNCATE, first=2)  # the same TRUNCATE, again
    assert f.terms() == [1, 1, 2, 2, 2, 2], "acknowledged entries were truncated"
