"""Known-bad variants of the code, to show the simulator catches them (`--mutate NAME`).

Each mutation reverts one fix (or breaks one Raft rule) by patching the live modules for the
duration of a run; `apply(name)` is a context manager that undoes the patch on exit. They exist
for tests/scenarios/test_simulator.py and for checking, after a change, that the simulator still
finds what it found before. The names say what they break:

- `t2c-fence`: readers ignore the store generation (StoreReader.begin/validate do nothing and
  follow_begin refreshes only when the ledger begin moves): a dispatcher keeps reading a
  segment file a truncation replaced (docs/contracts.md C1).
- `t3-two-reads`: the follower keys its verified end on one member snapshot and validates the
  push on a second one (docs/contracts.md C2).
- `quorum-max`: the ack checker takes the best watermark for a quorum (commits what only the
  leader holds).
- `follower-commit`: a follower commits the leader's commit index without having verified its
  log matches the leader's up to it.
- `old-term-commit`: the ack checker commits an entry of an earlier term by counting replicas
  (Raft §5.4.2, Figure 8).
- `t5-flag-leader`: the handler acts as leader on the role flag alone (no lease) and serves a
  linearizable GET without confirming its leadership (docs/contracts.md C3, C4).
- `vote-any-log`: a voter grants its vote without comparing logs (Raft §5.4.1): a candidate
  missing committed entries can win.
- `t1-ends-only`: the follower's fast path checks only the two ends of a pushed run
  (docs/contracts.md C12): with the `corrupt` fault, a damaged middle entry is stored and committed.
- `t4-old-term`: a leader deposed by a higher term campaigns again in its old term
  (docs/contracts.md C18).
- `t6-no-stepdown`: the elector ignores the handler's "store not writable": a leader whose
  disk is full keeps leading (docs/contracts.md C5); fault `disk-full` fills the leader's disk at
  the heal.
- `membership-no-own-term`: a leader appends a membership change before an entry of its own
  term committed (the 2015 single-server-change bug; fault `membership`).
- `restart-same-term`: a restarted node whose vote is its own campaigns in its old term (the
  restart rule reverted): a restarted leader can lead the same term twice.
- `lost-state-no-wait`: a node with no currterm and no log takes `majority - 1` answers
  without a log for a new group at once (node/core/lost_state.py, the wait reverted): with
  fault `lost-disk`, a leader that lost its disk and heard first from a member that never got
  an entry elects with it a leader without the committed entries.
- `catch-up-no-vote`: a node catching up after a lost disk gives no vote at all until it
  caught up (the vote floor reverted): with fault `lost-disk`, a leader that dies before
  pushing it the group's entries leaves the survivors without a leader for good.

With `--state-machine` (the applier, snapshots and retention; tools/sim/smcheck.py):

- `applier-skip`: the applier skips the first entry of every run that starts at an index
  ending in 7.
- `replay-from-snapshot-index`: a restarted applier replays from its snapshot's index instead
  of the entry after it (that entry is applied twice).
- `snapshot-index-early`: a snapshot is recorded one index before the state it holds.
- `apply-uncommitted`: the applier applies up to the ledger end, not the committed index.
- `results-shifted`: the applier sends each entry's result as the next entry's.
- `no-compaction-floor`: retention ignores the newest snapshot (`--store segment`).
- `applier-keeps-deleted`: the applier never unmaps the data files retention deleted (the fix
  reverted: `follow_begin` in `Applier.apply_some`; `--store segment`).

Install snapshot (`--state-machine --store segment`: retention strands lagging followers):

- `reset-before-restore`: the follower's handler resets its log to begin after the snapshot as
  soon as it forwards the last chunk to the applier, before the applier verified and restored
  it (a crash, a checksum mismatch or a slow applier leaves a log after a state nobody has).
- `install-keeps-conflicting-suffix`: after the install the follower keeps its log whenever it
  was not compacted past the snapshot, without checking that it holds (S, T): it only marks S
  committed, on a log that ends before S or holds another entry there.
- `install-match-past-snapshot`: the leader counts the installed follower as holding its whole
  log (match index = the leader's end) instead of the snapshot's last entry.
- `install-no-verify`: the follower's receiver skips the whole-file checksum; with the
  `corrupt` fault (which also flips a byte of install chunks) a damaged snapshot is installed.

Client sessions (the session faults; each reverts one of the fixes of the leader's session code):

- `session-start-any`: an unknown session of the leader's own term may start at seq 1 (the
  start invariant reverted): an evicted session's, or one a restarted handler's bounded
  rebuild missed, seq-1 resend is written again (`session-evict`, `handler-restart`).
- `capacity-before-session`: pending-full / DISK_FULL refusals run before the session check:
  a resend of an entry the leader holds is refused DISK_FULL (`disk-probe`).
- `deleted-duplicate-error`: a resend whose entry retention deleted is answered INTERNAL_ERROR
  (`retention`, `--store segment`).
- `multi-repeat-admitted`: one (session, seq) twice in one MULTI frame is written twice
  (`bad-client`).

Damage at rest (`rot`, `--store segment`):

- `rot-as-torn-tail`: recovery reads only the checkpoint's committed index as vouched for, so
  a damaged entry above it that the checkpoint's end index says was on disk is cut as a torn
  tail: the node votes with a shorter log than it acknowledged (a committed entry is lost).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

MUTATIONS: dict[str, Callable[[], Callable[[], None]]] = {}


def _mutation(name: str) -> Callable[[Callable[[], Callable[[], None]]], Callable[[], Callable[[], None]]]:
    def deco(fn: Callable[[], Callable[[], None]]) -> Callable[[], Callable[[], None]]:
        MUTATIONS[name] = fn
        return fn
    return deco


def _patch(obj: Any, name: str, value: Any) -> Callable[[], None]:
    old = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


@_mutation("t2c-fence")
def _t2c() -> Callable[[], None]:
    from node.store.reader import StoreReader

    def follow_begin(self: StoreReader, ledger_begin_index: int) -> None:
        if ledger_begin_index != self._seen_begin:
            self._seen_begin = ledger_begin_index
            with contextlib.suppress(Exception):
                self.refresh()

    undo = [_patch(StoreReader, "begin", lambda self, g: None),
            _patch(StoreReader, "validate", lambda self, g: None),
            _patch(StoreReader, "follow_begin", follow_begin)]
    return lambda: [u() for u in undo] and None


@_mutation("t3-two-reads")
def _t3() -> Callable[[], None]:
    from ipc import protocol as P
    from node.roles.handling.pushes import FollowerPushes

    def on_push(self: FollowerPushes, ident: bytes, req: P.PushRequest, frame: bytes) -> None:
        h = self.h
        h.state.incr("push_requests")
        first = h.state.read_member()
        synced = h.follower.sync(first)  # (term, leader) key from the first read ...
        m = h.state.read_member()  # ... the request validated against a second one
        h.follower.sync = lambda view: []
        try:
            effects = h.follower.on_push(ident, req, frame, m, h.now(), h.store)
        finally:
            del h.follower.sync
        self.execute(synced + effects, m)
        if req.kind == P.PushKind.APPEND:
            self.drain(m)

    return _patch(FollowerPushes, "on_push", on_push)


@_mutation("quorum-max")
def _quorum_max() -> Callable[[], None]:
    from node.core import replication
    from node.roles import ack_checker

    def quorum_advance(term: int, marks: list[int], published_index: int, published_term: int,
                       term_at: Callable[[int], int]) -> int | None:
        committed = published_index if published_term == term else -1
        q = max(marks)
        if q <= committed or term_at(q) != term:
            return None
        return q

    assert ack_checker.quorum_advance is replication.quorum_advance
    return _patch(ack_checker, "quorum_advance", quorum_advance)


@_mutation("follower-commit")
def _follower_commit() -> Callable[[], None]:
    from node.core import follower

    return _patch(follower, "follower_commit",
                  lambda leader_commit, verified_end, committed: max(committed, leader_commit))


@_mutation("old-term-commit")
def _old_term_commit() -> Callable[[], None]:
    from node.core import replication
    from node.roles import ack_checker

    def quorum_advance(term: int, marks: list[int], published_index: int, published_term: int,
                       term_at: Callable[[int], int]) -> int | None:
        committed = published_index if published_term == term else -1
        q = replication.quorum_index(marks)
        return q if q > committed and q >= 0 else None

    return _patch(ack_checker, "quorum_advance", quorum_advance)


@_mutation("membership-no-own-term")
def _membership_no_own_term() -> Callable[[], None]:
    """The own-term commit rule of a membership change reverted (docs/membership.md, the 2015
    single-server-change bug): a leader may append a change before an entry of its term has
    committed. Needs fault `membership`."""
    from node.core import membership
    from node.roles.handling import member_change

    real = membership.check_change

    def check_change(current: Any, change: Any, leader: Any, progress: Any = None,
                     rule: Any = membership.CatchUp()) -> Any:  # noqa: B008
        first = min(leader.term_first_index, max(leader.committed_index, 0))
        return real(current, change, membership.LeaderState(first, leader.committed_index), progress, rule)

    return _patch(member_change, "check_change", check_change)


@_mutation("vote-any-log")
def _vote_any_log() -> Callable[[], None]:
    import dataclasses

    from node.core import election, vote

    def decide_vote(view: Any, req: Any, *, is_self: bool = False) -> Any:
        blind = dataclasses.replace(view, ledger_end_index=-1, ledger_end_term=-1)
        return vote.decide_vote(blind, req, is_self=is_self)

    return _patch(election, "decide_vote", decide_vote)


@_mutation("t5-flag-leader")
def _t5() -> Callable[[], None]:
    from ipc.codes import Role
    from node.core.leader import LeaderCore
    from node.roles.handling.reads import LeaderReads

    def leading(self: LeaderCore, m: Any, now: int) -> bool:
        return m.role == Role.LEADER and m.current_term == self.leader_term

    orig_get = LeaderReads.on_get

    def on_get(self: LeaderReads, ident: bytes, req: Any) -> None:
        req.linearizable = False  # --linearizable parsed and ignored
        orig_get(self, ident, req)

    undo = [_patch(LeaderCore, "leading", leading), _patch(LeaderReads, "on_get", on_get)]
    return lambda: [u() for u in undo] and None


@_mutation("t1-ends-only")
def _t1() -> Callable[[], None]:
    """The follower's fast path checks only the first and last entry of a pushed run against
    their index records, and no CRC at all -- neither the bodies' nor the run's (docs/contracts.md
    C12): a damaged middle entry is stored."""
    from node.store.base import StoreError
    from node.store.codec import HEADER, INDEX, INDEX_SIZE
    from node.store.segment_store import SegmentStore

    def check_ends(self: SegmentStore, mv: Any, recs: Any, n: int, run_crc: int | None = None) -> None:
        first = INDEX.unpack_from(recs, 0)
        last = INDEX.unpack_from(recs, (n - 1) * INDEX_SIZE)
        for rec, off in ((first, 0), (last, last[1] - first[1])):
            if off + HEADER.size > len(mv):
                raise StoreError("push run does not fit", "UNEXPECTED_ARGUMENT")
            magic, size, index, term, pos, _c, _cc, _crc, _body = HEADER.unpack_from(mv, off)
            if (magic, pos, size, index, term) != rec:
                raise StoreError("push run ends disagree with their records", "UNEXPECTED_ARGUMENT")

    return _patch(SegmentStore, "_check_run", check_ends)


@_mutation("t4-old-term")
def _t4() -> Callable[[], None]:
    """A leader deposed by a higher term (or stepping down) only notes the term, as DLedger
    does, and campaigns again in its old term (docs/contracts.md C18)."""
    from node.core.election import ElectorCore

    def enter_higher_term(self: ElectorCore, term: int, now_ms: int) -> None:
        self._change_role_to_candidate(term)

    def step_down(self: ElectorCore, now_ms: int) -> None:
        self._change_role_to_candidate(self.term)

    undo = [_patch(ElectorCore, "_enter_higher_term", enter_higher_term),
            _patch(ElectorCore, "_step_down", step_down)]
    return lambda: [u() for u in undo] and None


@_mutation("restart-same-term")
def _restart_same_term() -> Callable[[], None]:
    """A restarted elector campaigns first in its persisted term, even when its vote there is
    its own: a leader restarted with its self-vote on disk can lead that term again."""
    from ipc.codes import ParseResult
    from node.core.election import ElectorCore

    orig_init = ElectorCore.__init__

    def init(self: ElectorCore, *a: Any, **kw: Any) -> None:
        orig_init(self, *a, **kw)
        self.last_parse = ParseResult.WAIT_TO_REVOTE

    return _patch(ElectorCore, "__init__", init)


@_mutation("lost-state-no-wait")
def _lost_state_no_wait() -> Callable[[], None]:
    from node.core import lost_state

    return _patch(lost_state, "NEW_GROUP_PATIENCE_MS", 0)


@_mutation("catch-up-no-vote")
def _catch_up_no_vote() -> Callable[[], None]:
    from node.core import election

    return _patch(election, "vote_floor_met", lambda *_: False)


@_mutation("t6-no-stepdown")
def _t6() -> Callable[[], None]:
    """The elector ignores the handler's "store not writable" (docs/contracts.md C5): a leader whose
    disk is full keeps leading, answering DISK_FULL, and the group never fails over."""
    from node.core.election import LedgerEnd
    from node.roles.elector import Elector

    def ledger(self: Elector) -> LedgerEnd:
        led = self.state.read_ledger()
        return LedgerEnd(led.ledger_end_index, led.ledger_end_term, True)

    return _patch(Elector, "_ledger", ledger)


@_mutation("applier-skip")
def _applier_skip() -> Callable[[], None]:
    from node.core import apply as core
    from node.roles import applier

    def next_run(applied_index: int, committed_index: int,
                 max_entries: int = core.MAX_APPLY_ENTRIES) -> tuple[int, int] | None:
        run = core.next_run(applied_index, committed_index, max_entries)
        if run is not None and run[0] % 10 == 7 and run[1] > run[0]:
            return run[0] + 1, run[1]
        return run

    return _patch(applier, "next_run", next_run)


@_mutation("replay-from-snapshot-index")
def _replay_from_snapshot_index() -> Callable[[], None]:
    from node.roles.applier import Applier

    orig = Applier.restore

    def restore(self: Applier) -> None:
        orig(self)
        if self.snapshot_index >= 0:
            self.applied = self.snapshot_index - 1  # the next run starts at the snapshot's own index

    return _patch(Applier, "restore", restore)


@_mutation("snapshot-index-early")
def _snapshot_index_early() -> Callable[[], None]:
    from node.statemachine.snapshot_store import SnapshotStore

    orig = SnapshotStore.begin

    def begin(self: SnapshotStore, last_index: int, last_term: int, state_machine: str,
              configuration: Any = None) -> Any:
        return orig(self, last_index - 1, last_term, state_machine, configuration)

    return _patch(SnapshotStore, "begin", begin)


@_mutation("apply-uncommitted")
def _apply_uncommitted() -> Callable[[], None]:
    import dataclasses

    from node.roles.applier import Applier

    orig = Applier.apply_some

    def apply_some(self: Applier) -> bool:
        state = self.state
        real = state.read_ledger

        def read_ledger(*a: Any, **kw: Any) -> Any:
            led = real(*a, **kw)
            return dataclasses.replace(led, committed_index=led.ledger_end_index)

        state.read_ledger = read_ledger
        try:
            return orig(self)
        finally:
            del state.read_ledger

    return _patch(Applier, "apply_some", apply_some)


@_mutation("results-shifted")
def _results_shifted() -> Callable[[], None]:
    from node.wiring import channels

    orig = channels.encode_results
    return _patch(channels, "encode_results", lambda first, results: orig(first + 1, results))


@_mutation("no-compaction-floor")
def _no_compaction_floor() -> Callable[[], None]:
    from node.roles import retention

    return _patch(retention, "compaction_floor", lambda snapshot_index: 1 << 62)


@_mutation("applier-keeps-deleted")
def _applier_keeps_deleted() -> Callable[[], None]:
    from node.roles.applier import Applier

    orig = Applier.apply_some

    def apply_some(self: Applier) -> bool:
        reader = self.reader
        reader.follow_begin = lambda ledger_begin_index: None
        try:
            return orig(self)
        finally:
            del reader.follow_begin

    return _patch(Applier, "apply_some", apply_some)


@_mutation("reset-before-restore")
def _reset_before_restore() -> Callable[[], None]:
    from node.core.follower import StoreReset
    from node.roles.handling.install import FollowerInstall
    from node.statemachine.snapshot_meta import SnapshotError, SnapshotMeta

    orig = FollowerInstall.forward

    def forward(self: Any, e: Any, m: Any) -> None:
        r = e.req
        try:
            meta = SnapshotMeta.from_json(bytes(r.meta), "install meta")
        except SnapshotError:
            meta = None
        if meta is not None and len(r.data) and r.offset + len(r.data) == meta.size:
            self.h.pushes.execute([StoreReset(meta.last_index, meta.last_term, bytes(r.meta))], m)  # "the last chunk is here"
        orig(self, e, m)

    return _patch(FollowerInstall, "forward", forward)


@_mutation("install-keeps-conflicting-suffix")
def _install_keeps_conflicting_suffix() -> Callable[[], None]:
    from ipc.codes import ResponseCode as RC
    from ipc.codes import Role
    from node.core.follower import FollowerCore, InstallReply, SetCommitted, StoreReset

    def snapshot_installed(self: FollowerCore, ident: bytes, req: Any, index: int, term: int, view: Any,
                           store: Any) -> list:
        done = InstallReply(ident, req, RC.SUCCESS, view.current_term, installed=True)
        if view.role == Role.LEADER or index <= store.committed_index:
            return [done]
        if store.ledger_begin_index >= 0 and store.ledger_begin_index - 1 <= index:
            return [SetCommitted(index), done]  # no check that the log holds (index, term)
        return [StoreReset(index, term, bytes(req.meta)), done]

    return _patch(FollowerCore, "snapshot_installed", snapshot_installed)


@_mutation("install-match-past-snapshot")
def _install_match_past_snapshot() -> Callable[[], None]:
    from node.core.replication import PushState
    from node.roles.dispatcher import Dispatcher

    orig = Dispatcher._on_install_reply

    def _on_install_reply(self: Dispatcher, msg: Any, offset: int, now: int) -> None:
        was = self.core.state
        orig(self, msg, offset, now)
        if was == PushState.INSTALL and self.core.state == PushState.COMPARE and self.core.installed:
            end = self.state.read_ledger().ledger_end_index
            self.core.match_index = max(self.core.match_index, end)  # "it is caught up"
            self.state.write_peer(self.slot, match_index=self.core.match_index, match_term=self.core.term)
            self._moved = True

    return _patch(Dispatcher, "_on_install_reply", _on_install_reply)


@_mutation("install-no-verify")
def _install_no_verify() -> Callable[[], None]:
    from node.statemachine.snapshot_install import SnapshotReceiver

    orig = SnapshotReceiver.install

    def install(self: SnapshotReceiver) -> Any:
        if self.complete:
            self._crc = self.meta.crc32c  # the checksum "matches"
        return orig(self)

    return _patch(SnapshotReceiver, "install", install)


@contextlib.contextmanager
def apply(names: str | list[str] | None) -> Iterator[None]:
    """Apply the named mutations (comma-separated or a list) for the duration of the block."""
    if not names:
        yield
        return
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    undo = []
    try:
        for n in names:
            if n not in MUTATIONS:
                raise ValueError(f"unknown mutation {n!r}; known: {', '.join(sorted(MUTATIONS))}")
            undo.append(MUTATIONS[n]())
        yield
    finally:
        for u in reversed(undo):
            u()


# ---- client sessions (the session faults: session-evict, handler-restart, disk-probe,
# retention, bad-client; docs/testing.md "Client sessions")

@_mutation("session-start-any")
def _session_start_any() -> Callable[[], None]:
    """The start invariant reverted: any unknown session of the leader's own term may start at
    seq 1 (an evicted one, or one a restarted handler's bounded rebuild missed: its seq-1
    resend is written a second time)."""
    from node.core.leader import ADMIT, LeaderCore

    orig = LeaderCore.session_check

    def check(self: LeaderCore, session: int, seq: int, n: int, now: int, disk_full: Any) -> Any:
        if (session not in self.sessions._sessions and seq == 1
                and (session >> 16) == (self.leader_term & 0xFFFF)):
            return ADMIT
        return orig(self, session, seq, n, now, disk_full)

    return _patch(LeaderCore, "session_check", check)


@_mutation("capacity-before-session")
def _capacity_before_session() -> Callable[[], None]:
    """The admission order reverted: the capacity refusals (pending full, DISK_FULL) run before
    the session check, so a resend of an entry the leader holds is refused DISK_FULL."""
    from node.core.leader import ADMIT, LeaderCore

    orig = LeaderCore.session_check

    def check(self: LeaderCore, session: int, seq: int, n: int, now: int, disk_full: Any) -> Any:
        if self.refuse_capacity(n, now, disk_full) is not None:
            return ADMIT  # "admitted": the capacity check that follows refuses it
        return orig(self, session, seq, n, now, disk_full)

    return _patch(LeaderCore, "session_check", check)


@_mutation("deleted-duplicate-error")
def _deleted_duplicate_error() -> Callable[[], None]:
    """A resend whose entry retention deleted is answered INTERNAL_ERROR (the store cannot
    read it), not with its index: a definite code for a committed entry (`--store segment`,
    fault retention)."""
    from ipc.codes import ResponseCode as RC
    from node.roles.handling.appends import LeaderAppends

    orig = LeaderAppends.answer_duplicate

    def answer(self: LeaderAppends, ident: bytes, req: Any, first: int, n: int, m: Any, now: int) -> None:
        if first < self.h.store.ledger_begin_index:
            self.h.replies.error(ident, req, RC.INTERNAL_ERROR, f"duplicate of entries {first}..: deleted", m=m)
            return
        orig(self, ident, req, first, n, m, now)

    return _patch(LeaderAppends, "answer_duplicate", answer)


@_mutation("multi-repeat-admitted")
def _multi_repeat_admitted() -> Callable[[], None]:
    """Within one MULTI frame, a request is admitted when it follows the frame's previous one
    of its session (seq + 1) or when the table admits it, and the table learns the frame's
    requests only after the write: the same (session, seq) twice in a frame is written twice
    (fault bad-client)."""
    from node.core.leader import ADMIT, Admit, LeaderCore
    from node.core.sessions import seq_add

    def admit_in_frame(self: LeaderCore, span: dict, session: int, seq: int, now: int, disk_full: Any) -> Any:
        if not session:
            return ADMIT
        if span.get(session) == seq:  # "follows the frame's previous one": never a repeat
            span[session] = seq_add(seq, 1)
            return ADMIT
        d = self.session_check(session, seq, 1, now, disk_full)
        if isinstance(d, Admit):
            span[session] = seq_add(seq, 1)
        return d

    return _patch(LeaderCore, "admit_in_frame", admit_in_frame)


@_mutation("rot-as-torn-tail")
def _rot_as_torn_tail() -> Callable[[], None]:
    """Recovery's checkpoint without its end index: damage above the committed index is a
    torn tail again (the fix in `SegmentStore._recover` reverted by what it reads)."""
    import dataclasses

    from node.store import segment_store
    from node.store.layout import Checkpoint

    real = segment_store.read_checkpoint

    def committed_only(store_dir: Any) -> Checkpoint:
        cp = real(store_dir)
        return dataclasses.replace(cp, end_index=min(cp.end_index, cp.committed_index))

    return _patch(segment_store, "read_checkpoint", committed_only)

