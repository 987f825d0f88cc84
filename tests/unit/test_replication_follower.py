"""The follower's side of replication (DLedger's EntryHandler; docs/replication.md
"Follower: push handling"; Raft paper §5.3).

Three layers, all of node/core (the handler only executes what these decide; its I/O shell is
tested in test_replication_handler.py):
* the pure decisions, as tables: `decide_compare` (handleDoCompare) and `follower_commit`;
* `FollowerCore.on_push` as a decision table: one snapshot + one push + the store → effects;
* `FollowerCore` driven through whole push sequences, its effects executed on a MemoryStore
  the way the handler executes them, so every queueing rule (REPEATED_PUSH,
  PUSH_REQUEST_IS_FULL, the abnormal-push check, idempotent TRUNCATE) is pinned.
"""

from __future__ import annotations

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block.shared_state import NO_SLOT, MemberView
from node.core.follower import (
    FollowerCore,
    Reply,
    SetCommitted,
    StoreAppend,
    StoreTruncate,
    same_leadership,
)
from node.core.replication import CompareAnswer, decide_compare, follower_commit
from node.store.base import StoreError
from node.store.memory_store import MemoryStore


def store_of(terms: list[int], tag: bytes = b"") -> MemoryStore:
    s = MemoryStore()
    for i, t in enumerate(terms):
        s.append_leader(b"e%d-t%d%s" % (i, t, tag), t)
    return s


class BegunStore:
    """A log whose first entries were deleted by retention (begin > 0): MemoryStore cannot
    express that, and decide_compare only reads these four things."""

    def __init__(self, begin: int, terms: list[int], committed: int = -1) -> None:
        self.ledger_begin_index = begin
        self.ledger_end_index = begin + len(terms) - 1
        self.committed_index = committed
        self._terms = terms

    def term_at(self, i: int) -> int:
        if not self.ledger_begin_index <= i <= self.ledger_end_index:
            raise StoreError(f"index {i} outside the log", "INDEX_OUT_OF_RANGE")  # as SegmentStore
        return self._terms[i - self.ledger_begin_index]

    def first_index_of_term(self, term: int, i: int) -> int:
        while i > self.ledger_begin_index and self.term_at(i - 1) == term:
            i -= 1
        return i


# ------------------------------------------------------------------------------------------
# decide_compare (DLedger's handleDoCompare)
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
    pytest.param((4, 2, 4), CompareAnswer(S), id="pre-just-below-my-begin-committed-here-is-the-leaders"),
    pytest.param((3, 2, 4), CompareAnswer(X), id="pre-further-below-even-if-committed"),
    pytest.param((5, 2), CompareAnswer(S), id="pre-at-my-begin"),
    pytest.param((7, 4), CompareAnswer(X, 3, 7), id="different-term-at-my-end"),
    pytest.param((6, 3), CompareAnswer(X, 2, 5), id="x-run-cut-at-my-begin"),
])
def test_decide_compare_with_a_ledger_begin(pre: tuple[int, ...], answer: CompareAnswer) -> None:
    # entries 0..4 deleted here (by retention: no log base); 5, 6 of term 2, 7 of term 3;
    # committed here: pre[2] if given, else nothing
    committed = pre[2] if len(pre) > 2 else -1
    assert decide_compare(BegunStore(5, [2, 2, 3], committed), *pre[:2]) == answer


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
    # DLedger's handleDoCommit: committedIndex = min(ledgerEndIndex, request.commitIndex); we cap by the
    # end *verified against this leader* (an unverified old-term tail is never committed).
    assert follower_commit(leader_commit, verified, committed) == expected


# ------------------------------------------------------------------------------------------
# FollowerCore.on_push as a decision table: (my log, verified end, view, push) → effects
# ------------------------------------------------------------------------------------------
PEERS = ["n0", "n1", "n2"]
TERM = 2


def view(role: Role = Role.FOLLOWER, term: int = TERM, leader: int = 0) -> MemberView:
    return MemberView(role, term, leader, NO_SLOT, NO_SLOT, 0, 0, 0)


def req(kind: P.PushKind, *, term: int = TERM, leader: str = "n0", commit: int = -1, first: int = -1,
        blob: bytes = b"", count: int = 0, pre: tuple[int, int] = (-1, -1), rid: int = 1) -> P.PushRequest:
    return P.PushRequest(group="g", remote_id="n1", leader_id=leader, term=term, kind=kind,
                         commit_index=commit, first_index=first, count=count, entries=blob,
                         pre_log_index=pre[0], pre_log_term=pre[1], request_id=rid)


def append_req(leader_log: MemoryStore, first: int, last: int, commit: int = -1, rid: int = 1) -> P.PushRequest:
    blob, n = leader_log.get_raw(first, last - first + 1, 1 << 20)
    pre = first - 1
    return req(P.PushKind.APPEND, first=first, blob=bytes(blob), count=n,
               pre=(pre, leader_log.term_at(pre) if pre >= 0 else -1), commit=commit, rid=rid)


def shape(effects: list) -> list[tuple]:
    """Effects as comparable tuples: (kind, code or index)."""
    out = []
    for e in effects:
        if isinstance(e, Reply):
            out.append(("reply", e.code))
        elif isinstance(e, SetCommitted):
            out.append(("commit", e.index))
        elif isinstance(e, StoreAppend):
            out.append(("append", e.req.first_index))
        elif isinstance(e, StoreTruncate):
            out.append(("truncate", e.cut))
    return out


LEADER_LOG = [1, 1, 2, 2, 2, 2, 2, 2]
R = "reply"
DECISIONS = [
    # (my terms, verified end, view, push, effects)
    pytest.param([1, 1], -1, view(term=TERM + 1), req(P.PushKind.COMMIT, commit=1),
                 [(R, RC.INCONSISTENT_TERM)], id="older-term-push"),
    pytest.param([1, 1], -1, view(role=Role.CANDIDATE, leader=NO_SLOT), req(P.PushKind.COMMIT),
                 [(R, RC.NOT_FOLLOWER)], id="not-following"),
    pytest.param([1, 1], -1, view(leader=2), req(P.PushKind.COMMIT), [(R, RC.INCONSISTENT_LEADER)],
                 id="another-leader"),
    pytest.param([1, 1], -1, view(), req(P.PushKind.COMMIT, commit=1), [(R, RC.SUCCESS)],
                 id="commit-without-verified-entries-commits-nothing"),
    pytest.param([1, 1], -1, view(), req(P.PushKind.COMMIT, commit=1, pre=(1, 1)), [("commit", 1), (R, RC.SUCCESS)],
                 id="commit-whose-entry-i-hold-verifies-it"),
    pytest.param([1, 1, 1], 1, view(), req(P.PushKind.COMMIT, commit=2, pre=(2, 2)), [("commit", 1), (R, RC.SUCCESS)],
                 id="commit-capped-by-verified-end"),
    pytest.param([1, 1, 2], -1, view(), req(P.PushKind.COMPARE, pre=(2, 2)), [(R, RC.SUCCESS)], id="compare-match"),
    pytest.param([1, 1, 1], -1, view(), req(P.PushKind.COMPARE, pre=(2, 2)), [(R, RC.INCONSISTENT_STATE)],
                 id="compare-mismatch"),
    pytest.param([1, 1, 1, 1], 1, view(), req(P.PushKind.TRUNCATE, first=2), [("truncate", 2)], id="truncate"),
    pytest.param([1, 1, 2, 2, 2], 4, view(), req(P.PushKind.TRUNCATE, first=2), [("truncate", 5)],
                 id="truncate-never-cuts-what-was-verified"),
    pytest.param([1, 1, 2], -1, view(), append_req(store_of(LEADER_LOG), 3, 4), [("append", 3)],
                 id="append-at-end-plus-one"),
    pytest.param([1, 1, 1], -1, view(), append_req(store_of(LEADER_LOG), 3, 4), [(R, RC.INCONSISTENT_STATE)],
                 id="append-whose-previous-entry-differs"),
    pytest.param([1, 1], -1, view(), append_req(store_of(LEADER_LOG), 4, 5), [], id="append-beyond-a-gap-waits"),
    pytest.param([1, 1, 2, 2], -1, view(), append_req(store_of(LEADER_LOG), 2, 3, commit=3),
                 [("commit", 3), (R, RC.SUCCESS)], id="resend-of-what-i-hold-is-success"),
    pytest.param([1, 1, 1, 1], -1, view(), append_req(store_of(LEADER_LOG), 2, 5), [(R, RC.INCONSISTENT_STATE)],
                 id="overlap-that-conflicts"),
    pytest.param([1, 1], -1, view(), req(P.PushKind.COMMIT, term=TERM + 1), [(R, RC.INCONSISTENT_TERM)],
                 id="newer-term-push-before-the-elector-saw-it"),
]


@pytest.mark.parametrize(("terms", "verified", "v", "r", "effects"), DECISIONS)
def test_follower_core_decision_table(terms: list[int], verified: int, v: MemberView, r: P.PushRequest,
                                      effects: list[tuple]) -> None:
    core = FollowerCore(PEERS, 4, 1_000)
    core.sync(v)
    core.verified_end = verified
    assert shape(core.on_push(b"L", r, b"", v, 1_000, store_of(terms))) == effects


def test_follower_core_takes_the_key_from_the_view_it_is_given() -> None:
    """One view per request (docs/contracts.md C2): a push is validated against the snapshot passed in,
    and the verified end belongs to that snapshot's (term, leader). A COMMIT of the new leader
    seen with the old leader's view is refused; seen with the new view, nothing the old leader
    verified counts."""
    core = FollowerCore(PEERS, 4, 1_000)
    s = store_of([1, 1, 1, 1, 1, 1])
    s.set_committed_index(2)
    old, new = view(term=1, leader=1), view(term=2, leader=2)
    core.sync(old)
    core.verified_end = 5  # the old leader's entries 3..5 matched it
    commit = req(P.PushKind.COMMIT, term=2, leader="n2", commit=4, pre=(4, 2))
    assert shape(core.on_push(b"L2", commit, b"", old, 0, s)) == [(R, RC.INCONSISTENT_TERM)]
    assert core.verified_end == 5  # still the old leader's: its key did not change
    assert shape(core.on_push(b"L2", commit, b"", new, 0, s)) == [(R, RC.SUCCESS)]
    assert (core.key, core.verified_end) == ((2, 2), -1)


def test_same_leadership_compares_role_term_and_leader_only() -> None:
    a = view()
    assert same_leadership(a, MemberView(Role.FOLLOWER, TERM, 0, 1, 2, 9, 123, 456))
    assert not same_leadership(a, view(term=TERM + 1))
    assert not same_leadership(a, view(leader=2))
    assert not same_leadership(a, view(role=Role.CANDIDATE))


# ------------------------------------------------------------------------------------------
# FollowerCore through push sequences, effects executed like the handler does
# ------------------------------------------------------------------------------------------
class Follower:
    """FollowerCore (node n1) over a MemoryStore; effects are executed the way the handler
    executes them (without the lock and the re-check, which test_replication_handler covers)."""

    def __init__(self, store: MemoryStore, max_pending: int = 4) -> None:
        self.now = 1_000
        self.core = FollowerCore(PEERS, max_pending, 1_000)
        self.view = view()
        self.store = store
        self.replies: list[Reply] = []
        self.rid = 0

    def run(self, effects: list) -> None:
        s = self.store
        for e in effects:
            if isinstance(e, Reply):
                self.replies.append(e)
            elif isinstance(e, SetCommitted):
                s.set_committed_index(e.index)
            elif isinstance(e, StoreAppend):
                end = s.append_follower(e.blob, e.recs, run_crc=e.run_crc)
                s.set_committed_index(self.core.appended(end, e.req.commit_index, s.committed_index))
                self.replies.append(Reply(e.ident, e.req, RC.SUCCESS, self.view.current_term))
            elif isinstance(e, StoreTruncate):
                try:
                    if e.cut <= s.ledger_end_index:
                        s.truncate(e.cut)
                except StoreError:
                    self.replies.append(Reply(e.ident, e.req, RC.INCONSISTENT_STATE, self.view.current_term))
                    self.run(self.core.write_failed(self.view))
                    continue
                self.core.truncated(e.req)
                self.replies.append(Reply(e.ident, e.req, RC.SUCCESS, self.view.current_term))

    def drain(self) -> None:
        while effects := self.core.drain(self.view, self.store):
            self.run(effects)

    def push(self, kind: P.PushKind, **kw) -> int:  # noqa: ANN003
        self.rid += 1
        r = req(kind, rid=self.rid, **kw)
        self.run(self.core.on_push(b"L", r, b"", self.view, self.now, self.store))
        if kind == P.PushKind.APPEND:
            self.drain()
        return self.rid

    def append(self, leader_log: MemoryStore, first: int, last: int, commit: int = -1) -> int:
        blob, n = leader_log.get_raw(first, last - first + 1, 1 << 20)
        pre = first - 1
        pre_term = leader_log.term_at(pre) if pre >= 0 else -1
        return self.push(P.PushKind.APPEND, first=first, blob=bytes(blob), count=n, pre=(pre, pre_term),
                         commit=commit)

    def abnormal_check(self) -> None:
        self.run(self.core.check_abnormal(self.view, self.now, self.store))
        self.drain()

    def answer(self, rid: int) -> Reply | None:
        got = [r for r in self.replies if r.req.request_id == rid]
        assert len(got) <= 1, f"request {rid} answered {len(got)} times"
        return got[0] if got else None

    def terms(self) -> list[int]:
        s = self.store
        return [s.term_at(i) for i in range(max(s.ledger_begin_index, 0), s.ledger_end_index + 1)]


@pytest.fixture
def leader_log() -> MemoryStore:
    return store_of(LEADER_LOG)


@pytest.mark.parametrize(("member", "push_term", "push_leader", "code"), [
    pytest.param((Role.FOLLOWER, TERM, 0), TERM - 1, "n0", RC.INCONSISTENT_TERM, id="older-term"),
    pytest.param((Role.FOLLOWER, TERM, 0), TERM + 1, "n0", RC.INCONSISTENT_TERM, id="newer-term"),
    pytest.param((Role.CANDIDATE, TERM, NO_SLOT), TERM, "n0", RC.NOT_FOLLOWER, id="not-follower"),
    pytest.param((Role.FOLLOWER, TERM, 2), TERM, "n0", RC.INCONSISTENT_LEADER, id="other-leader"),
])
def test_push_refused_unless_from_my_leader_in_my_term(member: tuple, push_term: int, push_leader: str,
                                                      code: RC) -> None:
    f = Follower(store_of([1, 1]))
    f.view = view(*member)
    for kind in P.PushKind:
        rid = f.push(kind, term=push_term, leader=push_leader, first=2, pre=(1, 1))
        r = f.answer(rid)
        assert r.code == code
        assert r.term == member[1]  # my term: the leader learns it is behind
    assert f.terms() == [1, 1]


def test_append_at_end_plus_one_is_stored_and_commit_follows(leader_log) -> None:
    f = Follower(store_of([1, 1, 2]))
    assert f.answer(f.push(P.PushKind.COMPARE, pre=(2, 2))).code == RC.SUCCESS
    rid = f.append(leader_log, 3, 5, commit=4)
    assert f.answer(rid).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2, 2, 2]
    assert f.store.committed_index == 4  # min(leader commit 4, verified end 5)


def test_push_ahead_of_a_gap_waits_then_both_apply_in_order(leader_log) -> None:
    # DLedger's EntryHandler: appends are applied at ledgerEnd + 1; one further ahead waits.
    f = Follower(store_of([1, 1]))
    later = f.append(leader_log, 4, 5, commit=3)
    assert f.answer(later) is None and list(f.core.queue) == [4]
    first = f.append(leader_log, 2, 3, commit=3)
    assert f.answer(first).code == RC.SUCCESS
    assert f.answer(later).code == RC.SUCCESS
    assert [r.req.request_id for r in f.replies] == [first, later]
    assert f.terms() == [1, 1, 2, 2, 2, 2]
    assert not f.core.queue


def test_duplicate_queued_push_is_repeated_push(leader_log) -> None:
    # DLedger's handlePush: writeRequestMap.putIfAbsent → REPEATED_PUSH for a duplicate.
    f = Follower(store_of([1, 1]))
    a = f.append(leader_log, 4, 5)
    b = f.append(leader_log, 4, 6)
    assert f.answer(a) is None
    assert f.answer(b).code == RC.REPEATED_PUSH


def test_full_push_queue_is_push_request_is_full(leader_log) -> None:
    f = Follower(store_of([1, 1]), max_pending=2)
    f.append(leader_log, 4, 4)
    f.append(leader_log, 5, 5)
    rid = f.append(leader_log, 6, 6)
    assert f.answer(rid).code == RC.PUSH_REQUEST_IS_FULL
    assert len(f.core.queue) == 2


def test_resend_overlapping_what_i_have_appends_only_the_new_part(leader_log) -> None:
    f = Follower(store_of([1, 1, 2, 2]))
    f.push(P.PushKind.COMPARE, pre=(3, 2))
    rid = f.append(leader_log, 2, 6)
    assert f.answer(rid).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2, 2, 2, 2]
    assert f.store.get(2).body == leader_log.get(2).body


def test_resend_of_entries_already_stored_is_success_not_repeated_push(leader_log) -> None:
    # DLedger #331: the ack of a push was lost and the leader resends it; the
    # follower must acknowledge it (never loop on REPEATED_PUSH).
    f = Follower(store_of([1, 1, 2, 2, 2]))
    f.push(P.PushKind.COMPARE, pre=(4, 2))
    rid = f.append(leader_log, 2, 4, commit=3)
    assert f.answer(rid).code == RC.SUCCESS
    assert f.store.committed_index == 3
    assert f.core.verified_end == 4


def test_compare_answers_and_clears_the_append_queue(leader_log) -> None:
    # DLedger's handlePush: COMPARE/TRUNCATE clear writeRequestMap; we answer the dropped pushes
    # INCONSISTENT_STATE instead of letting them time out.
    f = Follower(store_of([1, 1, 2, 2, 3]))
    queued = f.append(leader_log, 7, 7)
    rid = f.push(P.PushKind.COMPARE, pre=(4, 2))
    assert f.answer(queued).code == RC.INCONSISTENT_STATE
    r = f.answer(rid)
    assert (r.code, r.x_term, r.x_index) == (RC.INCONSISTENT_STATE, 3, 4)
    assert not f.core.queue
    rid = f.push(P.PushKind.COMPARE, pre=(3, 2))
    assert f.answer(rid).code == RC.SUCCESS
    assert f.core.verified_end == 3


def test_truncate_drops_the_tail_and_verifies_up_to_the_cut(leader_log) -> None:
    # DLedger's handleDoTruncate.
    f = Follower(store_of([1, 1, 1, 1, 1]))
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2, commit=1)).code == RC.SUCCESS
    assert f.terms() == [1, 1]
    assert f.core.verified_end == 1
    assert f.answer(f.append(leader_log, 2, 3)).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2]


def test_truncate_beyond_my_end_is_a_no_op_success() -> None:
    f = Follower(store_of([1, 1]))
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2)).code == RC.SUCCESS
    assert f.terms() == [1, 1]


def test_truncate_below_the_committed_index_keeps_the_committed_entries(leader_log) -> None:
    """The store never drops committed entries (docs/store.md "Truncate"). A TRUNCATE below the
    committed index comes from a leader that compared at an old watermark (its APPEND answers
    were lost, so after its push timeout it went back to COMPARE at match + 1, below what this
    follower has since stored and committed). Refusing it (INCONSISTENT_STATE) made the leader
    compare at the same place again, for ever: the follower never caught up (simulator seeds
    2579 and 99589). Committed entries are in every later leader's log, so the follower cuts
    after its committed index instead, answers SUCCESS, and the leader's APPENDs from its old
    watermark skip what matches and catch the follower up."""
    s = store_of([1, 1, 2, 2, 2])  # 0..3 as the leader's log, 4 an uncommitted extra of term 2
    s.set_committed_index(3)
    f = Follower(s)
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2)).code == RC.SUCCESS
    assert f.terms() == [1, 1, 2, 2] and s.committed_index == 3  # nothing committed dropped
    assert f.answer(f.append(leader_log, 2, 5, commit=5)).code == RC.SUCCESS
    assert f.terms() == [leader_log.term_at(i) for i in range(6)]
    assert s.committed_index == 5


def test_commit_push_advances_committed_only_over_verified_entries() -> None:
    # An old-term tail not yet compared with this leader must not become committed just
    # because the leader's commit index is high (Raft §5.3/§5.4: the follower's entries past
    # the agreed point may still be overwritten). Here 2, 3 are term-1 entries the new leader
    # of term 2 does not have.
    f = Follower(store_of([1, 1, 1, 1]))
    assert f.answer(f.push(P.PushKind.COMMIT, commit=3)).code == RC.SUCCESS
    assert f.store.committed_index == -1
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    f.push(P.PushKind.COMMIT, commit=3)
    assert f.store.committed_index == 1


def test_new_leader_resets_verified_end_and_drops_the_queue(leader_log) -> None:
    f = Follower(store_of([1, 1, 2, 2]))
    f.push(P.PushKind.COMPARE, pre=(3, 2))
    queued = f.append(leader_log, 6, 6)
    assert f.core.verified_end == 3
    f.view = view(term=TERM + 1, leader=2)  # the elector follows n2 in a new term
    rid = f.push(P.PushKind.COMMIT, term=TERM + 1, leader="n2", commit=3)
    assert f.answer(queued).code == RC.INCONSISTENT_STATE
    assert f.answer(rid).code == RC.SUCCESS
    assert f.core.verified_end == -1
    assert f.store.committed_index == -1  # nothing verified against n2 yet


def test_abnormal_check_answers_a_gap_that_never_fills(leader_log) -> None:
    # DLedger's checkAbnormalFuture: once a second; a push waiting beyond
    # ledgerEnd + 1 for longer than the push timeout → INCONSISTENT_STATE (leader compares).
    f = Follower(store_of([1, 1]))
    rid = f.append(leader_log, 4, 5)
    f.abnormal_check()  # arms the once-a-second check; too young to fail
    assert f.answer(rid) is None
    f.now += 999
    f.abnormal_check()
    assert f.answer(rid) is None  # not checked again within the second
    f.now += 1
    f.abnormal_check()
    assert f.answer(rid).code == RC.INCONSISTENT_STATE
    assert not f.core.queue


def test_a_queued_push_the_log_caught_up_with_is_acknowledged_at_once(leader_log) -> None:
    # DLedger's checkAbnormalFuture, "PushFallBehind": a queued push now at or below ledgerEnd is
    # answered SUCCESS if it matches (the leader's earlier ack was lost). DLedger waits for the
    # once-a-second check; the core's drain takes every queued push at or below end + 1.
    f = Follower(store_of([1, 1]))
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    queued = f.append(leader_log, 4, 5)
    big = f.append(leader_log, 2, 6)  # a resend from the watermark covers the queued one
    assert f.answer(big).code == RC.SUCCESS
    assert f.answer(queued).code == RC.SUCCESS
    assert not f.core.queue


def test_a_failed_write_forgets_what_was_verified(leader_log) -> None:
    """After a store write failed, what the store holds is not what the core assumed: it
    forgets its verified end and the queue, so the leader compares again."""
    f = Follower(store_of([1, 1, 2]))
    f.push(P.PushKind.COMPARE, pre=(2, 2))
    queued = f.append(leader_log, 6, 6)
    f.run(f.core.write_failed(f.view))
    assert f.core.verified_end == -1
    assert f.answer(queued).code == RC.INCONSISTENT_STATE


def test_duplicate_truncate_must_not_drop_entries_already_acknowledged(leader_log) -> None:
    """A TRUNCATE(m + 1) delivered again (duplicated, or delayed past the APPENDs that followed
    it — possible across a dispatcher restart, whose new connection is fair-queued with the old
    one at the follower's ROUTER) must not drop entries this follower already acknowledged in
    this term: the leader has counted them and may have committed them. Raft §5.3 only ever
    deletes *conflicting* entries."""
    f = Follower(store_of([1, 1, 1]))  # index 2: an old term-1 entry, must go
    f.push(P.PushKind.COMPARE, pre=(1, 1))
    assert f.answer(f.push(P.PushKind.TRUNCATE, first=2)).code == RC.SUCCESS
    assert f.answer(f.append(leader_log, 2, 5, commit=-1)).code == RC.SUCCESS
    f.push(P.PushKind.TRUNCATE, first=2)  # the same TRUNCATE, again
    assert f.terms() == [1, 1, 2, 2, 2, 2], "acknowledged entries were truncated"


def test_a_truncate_that_empties_a_log_retention_cut_carries_the_base_term_only_when_it_is_committed():
    """Seeds 50664/60045: this follower's retention deleted everything up to its committed
    index 4, and 5.. is an old leader's tail. The new leader compares at 4 (answered from the
    committed index) and truncates at 5 with the term of 4: the core hands that term on so the
    handler can empty the log to begin after 4. An uncommitted 4 gets no base term."""
    core = FollowerCore(["n0", "n1", "n2"], 100, 1000)
    store = BegunStore(5, [2, 2, 3], committed=4)
    t = P.PushRequest("g", "n1", "n0", TERM, P.PushKind.TRUNCATE, first_index=5, pre_log_index=4,
                      pre_log_term=2)
    out = core.on_push(b"id", t, b"", view(), 0, store)
    assert out[-1] == StoreTruncate(b"id", t, 5, 2)
    store.committed_index = 3
    out = core.on_push(b"id", t, b"", view(), 0, store)
    assert out[-1] == StoreTruncate(b"id", t, 5, -1)
