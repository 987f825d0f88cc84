"""The real role classes (Handler, Dispatcher, AckChecker) driven in one process: a fake
RoleContext (real NodeConfig, a dict-backed shared block, a virtual clock) and a transport that
records what they send (docs/contracts.md C7). What is pinned here is the I/O shell around the cores:
one member snapshot per request (docs/contracts.md C2), the lease (C3), linearizable reads (C4),
the store generation fence at the dispatcher (C1), storage errors as answers (C5, C6).
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block.memory_state import MemoryState
from node.block.shared_state import NO_SLOT, MemberView, QuorumView
from node.config import NodeConfig
from node.core.lease import lease_ms
from node.core.replication import decide_compare
from node.roles.ack_checker import AckChecker
from node.roles.dispatcher import Dispatcher
from node.roles.handler import Handler
from node.store import codec
from node.store.base import StoreConfig, StoreCorruptError, StoreError
from node.store.memory_store import MemoryStore
from node.store.segment_store import SegmentStore, disk_usage_ratio
from node.wiring import channels

PEERS = ["n0", "n1", "n2"]
PEER_SPEC = ";".join(f"{p}-127.0.0.1:{20000 + i}" for i, p in enumerate(PEERS))


# ------------------------------------------------------------------------------------------
# Fakes: the shared block, the clock, the transports
# ------------------------------------------------------------------------------------------
def member(role: Role, term: int, leader: int, quorum_ms: int = 0) -> MemberView:
    return MemberView(role, term, leader, NO_SLOT, NO_SLOT, 0, 0, quorum_ms)


# The block: node/block/memory_state.py's MemoryState, the simulator's block too (one in-memory
# implementation of node/block/state_protocol.py). The name stays: other unit tests import it.
FakeState = MemoryState


class ScriptedState(FakeState):
    """A block whose member group changes between two reads: `script` is consumed one view per
    read_member(), the last one then stays."""

    def __init__(self) -> None:
        super().__init__()
        self.script: list[MemberView] = []

    def read_member(self, timeout_s: float | None = None) -> MemberView:
        if self.script:
            self.member = self.script.pop(0)
        return super().read_member(timeout_s)


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Fatal(Exception):
    pass


def make_rc(tmp_path: Path, node: str, state: FakeState, clock: Clock, peer: str | None = None,
            **cfg) -> SimpleNamespace:  # noqa: ANN003
    c = NodeConfig(id=node, peers=PEER_SPEC, group="g", store_dir=str(tmp_path / node), **cfg)
    Path(c.store_dir).mkdir(parents=True, exist_ok=True)
    fatal_calls: list[str] = []

    def fatal(message: str) -> None:
        fatal_calls.append(message)
        raise Fatal(message)

    return SimpleNamespace(cfg=c, log=logging.getLogger(f"test.{node}"), state=state, clock=clock,
                           wall_clock=time.time, disk_usage=disk_usage_ratio,  # RoleContext's defaults
                           peer_id=peer, fatal=fatal, fatal_calls=fatal_calls)


class HandlerWire:
    """Records the handler's replies (decoded), wake-ups and control frames."""

    def __init__(self, control_ok: bool = True) -> None:
        self.replies: list[tuple[bytes, P.Message]] = []
        self.appended_ends: list[int] = []
        self.controls: list[bytes] = []
        self.control_ok = control_ok

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.replies.append((ident, P.decode(frame)))

    def appended(self, end: int) -> None:
        self.appended_ends.append(end)

    def control(self, frame: bytes) -> bool:
        self.controls.append(frame)
        return self.control_ok

    def answer(self, request_id: int) -> P.Message | None:
        got = [m for _i, m in self.replies if m.request_id == request_id]
        assert len(got) <= 1, f"request {request_id} answered {len(got)} times"
        return got[0] if got else None


def make_handler(tmp_path: Path, node: str, state: FakeState, clock: Clock, store=None,  # noqa: ANN001
                 **cfg) -> tuple[Handler, HandlerWire]:  # noqa: ANN003
    rc = make_rc(tmp_path, node, state, clock, **cfg)
    h = Handler(rc)
    if store is not None:
        h.store = store
    h.transport = wire = HandlerWire()
    h.open()
    return h, wire


def store_of(terms: list[int], tag: bytes = b"") -> MemoryStore:
    s = MemoryStore()
    for i, t in enumerate(terms):
        s.append_leader(b"e%d-t%d%s" % (i, t, tag), t)
    return s


def push(kind: P.PushKind, *, term: int, leader: str, rid: int, **kw) -> bytes:  # noqa: ANN003
    return P.encode(P.PushRequest(group="g", remote_id="n1", leader_id=leader, term=term, kind=kind,
                                  request_id=rid, **kw))


# ------------------------------------------------------------------------------------------
# Handler, follower side: one member snapshot per request (docs/contracts.md C2)
# ------------------------------------------------------------------------------------------
def test_a_push_is_validated_and_applied_on_one_member_snapshot(tmp_path: Path) -> None:
    """The elector moves from FOLLOWER(1, n0) to FOLLOWER(2, n2) while the handler serves a
    COMMIT of the new leader n2. Decided on the old view it must be refused; never may the
    new leader's commit index be applied against what the OLD leader's entries verified —
    that committed n0's never-committed entries 3..4, which the group committed differently,
    and n2's TRUNCATE(3) was then refused for ever."""
    state = ScriptedState()
    s = store_of([1, 1, 1])
    s.set_committed_index(2)  # 0..2 committed everywhere
    for i in range(3, 6):
        s.append_leader(b"n0-uncommitted-%d" % i, 1)  # n0's entries, never committed
    state.member = member(Role.FOLLOWER, 1, 0)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=s)
    h.handle_frame(b"n0", push(P.PushKind.COMPARE, term=1, leader="n0", rid=1, pre_log_index=5, pre_log_term=1))
    assert wire.answer(1).code == RC.SUCCESS and h.follower.verified_end == 5
    # n2 (term 2) committed its own 3..4 without us and sends COMMIT(4); the block changes
    # between the handler's reads of it:
    state.script = [member(Role.FOLLOWER, 1, 0), member(Role.FOLLOWER, 2, 2)]
    h.handle_frame(b"n2", push(P.PushKind.COMMIT, term=2, leader="n2", rid=2, commit_index=4,
                               pre_log_index=4, pre_log_term=2))
    assert s.committed_index == 2, "the old leader's entries became committed"
    # Now stable on the new view: n2 repairs the log.
    state.script = []
    state.member = member(Role.FOLLOWER, 2, 2)
    h.handle_frame(b"n2", push(P.PushKind.COMPARE, term=2, leader="n2", rid=3, pre_log_index=2, pre_log_term=1))
    h.handle_frame(b"n2", push(P.PushKind.TRUNCATE, term=2, leader="n2", rid=4, first_index=3))
    assert wire.answer(4).code == RC.SUCCESS
    assert s.ledger_end_index == 2


def test_a_push_reads_the_member_group_once(tmp_path: Path) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=store_of([1, 1]))
    before = state.member_reads
    h.handle_frame(b"n0", push(P.PushKind.COMMIT, term=1, leader="n0", rid=1, commit_index=1,
                               pre_log_index=1, pre_log_term=1))
    assert wire.answer(1).code == RC.SUCCESS
    assert state.member_reads - before == 1


def test_a_store_write_is_skipped_when_leadership_changed_before_the_lock(tmp_path: Path) -> None:
    """The core decided on view V; under the member lock a fresh snapshot shows another term:
    the append must not happen (the entries are of a leader we no longer follow)."""
    state = ScriptedState()
    state.member = member(Role.FOLLOWER, 2, 0)
    leader_log = store_of([1, 1, 2, 2])
    s = store_of([1, 1])
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=s)
    blob, n = leader_log.get_raw(2, 2, 1 << 20)
    state.script = [member(Role.FOLLOWER, 2, 0), member(Role.FOLLOWER, 3, 2)]
    h.handle_frame(b"n0", push(P.PushKind.APPEND, term=2, leader="n0", rid=1, first_index=2, count=n,
                               entries=bytes(blob), pre_log_index=1, pre_log_term=1))
    assert wire.answer(1).code == RC.INCONSISTENT_TERM
    assert s.ledger_end_index == 1


# ------------------------------------------------------------------------------------------
# Handler, leader side: the lease (docs/contracts.md C3) and linearizable reads (C4)
# ------------------------------------------------------------------------------------------
def leader_handler(tmp_path: Path, clock: Clock, state: FakeState | None = None,
                   store=None, **cfg) -> tuple[Handler, HandlerWire, FakeState]:  # noqa: ANN001, ANN003
    state = state or FakeState()
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h, wire = make_handler(tmp_path, "n1", state, clock, store=store if store is not None else store_of([1, 2]),
                           **cfg)
    h.tick()  # writes the NOOP of term 3
    assert h.leader_term == 3
    return h, wire, state


def commit_all(h: Handler, state: FakeState) -> None:
    state.quorum = QuorumView(h.store.ledger_end_index, h.leader_term)
    h.on_commit_wakeup()


def append(h: Handler, rid: int, body: bytes = b"x") -> None:
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", body, request_id=rid)))


def get(h: Handler, rid: int, index: int, linearizable: bool = False) -> None:
    h.handle_frame(b"c", P.encode(P.GetRequest("g", "n1", index, 1, linearizable, rid)))


def test_a_leader_whose_lease_lapsed_refuses_appends_and_gets(tmp_path: Path) -> None:
    """The elector is paused (SIGSTOP): the block still says LEADER, but its quorum heartbeat
    time stops moving. Within the lease the handler still leads; after it, appends and GETs
    are NOT_LEADER and METADATA no longer claims leadership — a new leader may exist and have
    committed entries this node does not have."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    lease = lease_ms(h.cfg.election_config())
    clock.now += lease - 1
    append(h, 1)
    get(h, 2, 0)
    assert wire.answer(2).code == RC.SUCCESS
    assert wire.answer(1) is None  # pending: will be answered when it commits
    clock.now += 1  # the lease is over
    append(h, 3)
    get(h, 4, 0)
    assert wire.answer(3).code == RC.NOT_LEADER
    assert wire.answer(4).code == RC.NOT_LEADER
    h.handle_frame(b"c", P.encode(P.MetadataRequest("g", "n1", request_id=5)))
    md = wire.answer(5)
    assert (md.role, md.leader_id) == (Role.CANDIDATE, "")


def test_metadata_asked_by_a_member_that_lost_its_state_says_the_durable_term_and_last_term(tmp_path: Path) -> None:
    """The handler answers before its elector has read `currterm` into the block (term 0
    there). A member that lost its term/vote state asks with want_end_term: it must hear the
    term this node voted in, or it votes in that term again (the simulator's lost-disk fault,
    seed 11,314: two leaders in one term), and the term of the last entry (its vote floor)."""
    from node.store.term_vote import TermVoteFile

    state = FakeState()
    state.member = member(Role.CANDIDATE, 0, -1)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=store_of([1, 2]))
    TermVoteFile(h.cfg.store_dir).save(5, "n0")
    h.handle_frame(b"c", P.encode(P.MetadataRequest("g", "n1", request_id=5, want_status=True,
                                                    want_config=True, want_end_term=True)))
    md = wire.answer(5)
    assert (md.term, md.ledger_end_index, md.status.ledger_end_term) == (5, 1, 2)
    assert md.status.configuration is not None
    h.handle_frame(b"c", P.encode(P.MetadataRequest("g", "n1", request_id=6)))  # a client's
    assert wire.answer(6).term == 0 and wire.answer(6).status is None


def test_the_noop_waits_for_the_lease(tmp_path: Path) -> None:
    clock = Clock()
    state = FakeState()
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now - 10 * lease_ms(NodeConfig().election_config()))
    h, _wire = make_handler(tmp_path, "n1", state, clock, store=store_of([1]))
    h.tick()
    assert h.leader_term == -1 and h.store.ledger_end_index == 0
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert h.leader_term == 3 and h.store.term_at(1) == 3


def test_linearizable_get_waits_for_a_quorum_round_that_started_after_it(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    clock.now += 10
    get(h, 1, 0, linearizable=True)
    assert wire.controls == [channels.CONFIRM_LEADERSHIP]
    h.tick()
    assert wire.answer(1) is None  # the last quorum round started before the read arrived
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now - 1)
    h.tick()
    assert wire.answer(1) is None
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert wire.answer(1).code == RC.SUCCESS


def test_linearizable_get_is_not_served_before_the_terms_noop_commits(tmp_path: Path) -> None:
    clock = Clock()
    s = store_of([1, 2])
    s.set_committed_index(1)
    h, wire, state = leader_handler(tmp_path, clock, store=s)
    get(h, 1, 0, linearizable=True)
    clock.now += 1
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert wire.answer(1) is None  # read-index rule: the NOOP (index 2) is not committed yet
    commit_all(h, state)
    h.tick()
    assert wire.answer(1).code == RC.SUCCESS


def test_linearizable_get_fails_on_a_term_change_and_times_out(tmp_path: Path) -> None:
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    commit_all(h, state)
    get(h, 1, 0, linearizable=True)
    state.member = member(Role.FOLLOWER, 4, 2)
    h.tick()
    assert wire.answer(1).code == RC.NOT_LEADER
    state.member = member(Role.LEADER, 5, 1, quorum_ms=clock.now)
    h.tick()
    commit_all(h, state)
    clock.now += 1
    get(h, 2, 0, linearizable=True)
    ecfg = h.cfg.election_config()
    for _ in range(2 * ecfg.max_heartbeat_leak):
        clock.now += ecfg.heartbeat_interval_ms
        h.tick()
    assert wire.answer(2).code == RC.TIMEOUT


# ------------------------------------------------------------------------------------------
# Handler: storage errors are answers, never a crash loop (docs/contracts.md C5, C6)
# ------------------------------------------------------------------------------------------
class FailingStore(MemoryStore):
    """A MemoryStore whose writes fail with `error` while it is set."""

    def __init__(self, terms: list[int] = ()) -> None:
        super().__init__()
        for i, t in enumerate(terms):
            super().append_leader(b"e%d" % i, t)
        self.error: BaseException | None = None
        self.leader_writes = 0

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def append_leader(self, body: bytes, term: int, magic: int = codec.MAGIC_NORMAL, **stamp):  # noqa: ANN003, ANN201
        self.leader_writes += 1
        self._check()
        return super().append_leader(body, term, magic, **stamp)

    def append_batch_raw(self, bodies, term, *stamp):  # noqa: ANN001, ANN002, ANN201
        self._check()
        return super().append_batch_raw(bodies, term, *stamp)

    def append_follower(self, blob, index_records=b"", run_crc=None):  # noqa: ANN001, ANN201
        self._check()
        return super().append_follower(blob, index_records, run_crc)

    def truncate(self, index: int) -> None:
        self._check()
        super().truncate(index)


def test_a_failed_append_is_a_disk_full_answer_and_marks_the_store_unwritable(tmp_path: Path) -> None:
    clock = Clock()
    s = FailingStore([1])
    h, wire, state = leader_handler(tmp_path, clock, store=s)
    s.error = StoreError("no space left writing 00000000000000000000", "DISK_FULL")
    append(h, 1)
    assert wire.answer(1).code == RC.DISK_FULL
    assert state.get("store_unwritable_ms") == clock.now
    s.error = OSError(errno.ENOSPC, "No space left on device")  # one that escaped the store
    append(h, 2)
    assert wire.answer(2).code == RC.DISK_FULL
    s.error = None
    append(h, 3)
    assert wire.answer(3) is None  # written, pending
    assert state.get("store_unwritable_ms") == 0


def test_a_failed_noop_is_retried_with_backoff_and_tells_the_elector(tmp_path: Path) -> None:
    clock = Clock()
    state = FakeState()
    s = FailingStore([1])
    s.error = StoreError("cannot create 00000000000001048576: no space", "DISK_FULL")
    h, _wire = make_handler(tmp_path, "n1", state, clock, store=s)
    for _ in range(1000):  # one second of 1 ms loop turns, lease kept fresh
        state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
        h.tick()
        clock.now += 1
    assert h.leader_term == -1
    assert 1 <= s.leader_writes <= 8, f"{s.leader_writes} NOOP attempts in 1 s: a hot loop"
    assert state.get("store_unwritable_ms") != 0
    s.error = None
    clock.now += 1000
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h.tick()
    assert h.leader_term == 3
    assert state.get("store_unwritable_ms") == 0


def test_a_node_that_stepped_down_for_a_full_disk_stands_again_once_there_is_room(tmp_path: Path) -> None:
    """Found by the simulator's disk-full fault: only a leader's successful write cleared the
    mark, and a node that stepped down never leads again to make one -- once space was back it
    still refused to stand, for ever. Now the handler asks the store for room every second."""
    clock = Clock()
    s = FailingStore([1])
    room = [False]
    s.has_room = lambda: room[0]  # type: ignore[method-assign]
    h, wire, state = leader_handler(tmp_path, clock, store=s)
    s.error = StoreError("no space left writing 00000000000000000000", "DISK_FULL")
    append(h, 1)
    assert wire.answer(1).code == RC.DISK_FULL
    state.member = member(Role.CANDIDATE, 3, -1)  # the elector stepped down
    s.error = None
    for _ in range(3):  # no room yet: still unwritable, however often the loop turns
        clock.now += 1000
        h.tick()
    assert state.get("store_unwritable_ms") != 0
    room[0] = True
    clock.now += 999
    h.tick()
    h.tick()
    clock.now += 1001
    h.tick()
    assert state.get("store_unwritable_ms") == 0


@pytest.mark.parametrize(("error", "code"), [
    pytest.param(StoreError("disk full", "DISK_FULL"), RC.DISK_FULL, id="store-error"),
    pytest.param(OSError(errno.EIO, "I/O error"), RC.DISK_ERROR, id="bare-eio"),
])
def test_a_failed_follower_write_is_a_disk_answer(tmp_path: Path, error: BaseException, code: RC) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 2, 0)
    s = FailingStore([1, 1, 1])
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=s)
    leader_log = store_of([1, 1, 2, 2])
    blob, n = leader_log.get_raw(2, 2, 1 << 20)
    h.handle_frame(b"n0", push(P.PushKind.COMPARE, term=2, leader="n0", rid=1, pre_log_index=1, pre_log_term=1))
    s.error = error
    h.handle_frame(b"n0", push(P.PushKind.TRUNCATE, term=2, leader="n0", rid=2, first_index=2))
    assert wire.answer(2).code == code
    s.error = None
    h.handle_frame(b"n0", push(P.PushKind.TRUNCATE, term=2, leader="n0", rid=3, first_index=2))
    assert wire.answer(3).code == RC.SUCCESS
    s.error = error
    h.handle_frame(b"n0", push(P.PushKind.APPEND, term=2, leader="n0", rid=4, first_index=2, count=n,
                               entries=bytes(blob), pre_log_index=1, pre_log_term=1))
    assert wire.answer(4).code == code
    assert h.follower.verified_end == -1  # forgotten: the leader compares again


def test_a_store_that_refuses_to_open_is_a_fatal_stop(tmp_path: Path) -> None:
    class Corrupt(MemoryStore):
        def open(self) -> None:
            raise StoreCorruptError("entry 7 in data/00000000000000000000 fails its CRC")

    rc = make_rc(tmp_path, "n1", FakeState(), Clock())
    h = Handler(rc)
    h.store = Corrupt()
    with pytest.raises(Fatal):
        h.open()
    assert "entry 7" in rc.fatal_calls[0]


def test_construction_builds_no_socket_and_the_clock_is_injected(tmp_path: Path) -> None:
    clock = Clock(5)
    rc = make_rc(tmp_path, "n1", FakeState(), clock)
    h = Handler(rc)
    assert h.transport is None and h.now() == 5
    d = Dispatcher(make_rc(tmp_path, "n1", FakeState(), clock, peer="n2"))
    assert d.transport is None and d.now() == 5
    a = AckChecker(make_rc(tmp_path, "n1", FakeState(), clock))
    assert a.transport is None and a.now() == 5


# ------------------------------------------------------------------------------------------
# Dispatcher: the generation fence (docs/contracts.md C1) and the lease
# ------------------------------------------------------------------------------------------
class DispatcherWire:
    def __init__(self) -> None:
        self.sent: list[P.PushRequest] = []
        self.acks: list[tuple[int, int]] = []

    def send(self, frame: bytes) -> bool:
        self.sent.append(P.decode(frame))
        return True

    def ack(self, slot: int, match_index: int) -> None:
        self.acks.append((slot, match_index))


def publish(state: FakeState, s: SegmentStore) -> None:
    state.write_ledger(ledger_begin_index=s.ledger_begin_index, ledger_end_index=s.ledger_end_index,
                       ledger_end_term=s.ledger_end_term, committed_index=s.committed_index,
                       store_generation=s.generation)


def answer(msg: P.PushRequest, z: SegmentStore, zv: list[int]) -> bytes:
    """Follower z's answer to one push (the core rules, enough for this scenario)."""
    code, x_term, x_index = RC.SUCCESS, -1, -1
    if msg.kind == P.PushKind.COMPARE:
        a = decide_compare(z, msg.pre_log_index, msg.pre_log_term)
        code, x_term, x_index = a.code, a.x_term, a.x_index
        if code == RC.SUCCESS:
            zv[0] = max(zv[0], msg.pre_log_index)
    elif msg.kind == P.PushKind.TRUNCATE:
        cut = max(msg.first_index, zv[0] + 1)
        if cut <= z.ledger_end_index:
            z.truncate(cut)
    elif msg.kind == P.PushKind.APPEND:
        assert msg.run_crc >= 0, "an APPEND push without its run CRC"
        if msg.first_index == z.ledger_end_index + 1:
            z.append_follower(bytes(msg.entries), bytes(msg.index_records), msg.run_crc)
            zv[0] = z.ledger_end_index
        else:
            code = RC.INCONSISTENT_STATE
    return P.encode(P.PushResponse(code, "g", msg.term, "n0", z.ledger_end_index, z.ledger_begin_index,
                                   z.ledger_end_index, x_term, x_index, msg.request_id))


def test_dispatcher_never_pushes_entries_of_a_file_a_truncation_replaced(tmp_path: Path) -> None:
    """Term 1: this node (n0) leads and appends 0..11; follower n2 has them all. Term 2: n0
    follows another leader — TRUNCATE(6) deletes its second data/index files — and stores that
    leader's 6..9, re-creating those files under the same names. Term 3: n0 leads again. Its
    dispatcher for n2 is the same long-lived process, whose reader still maps the deleted
    files: it must neither compare with nor push the old term-1 entries (that left n2 with
    different committed entries than the group)."""
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock, peer="n2", data_file_size=4096, index_file_size=8 * 32)
    x = SegmentStore(StoreConfig(rc.cfg.store_dir, data_file_size=4096, index_file_size=8 * 32))
    z = SegmentStore(StoreConfig(str(tmp_path / "z"), data_file_size=4096, index_file_size=8 * 32))
    x.open()
    z.open()
    try:
        for i in range(12):  # 500-byte entries: the second data file starts at 8
            x.append_leader(b"T1-old-%02d" % i + b"x" * 443, 1)
            z.append_leader(b"T1-old-%02d" % i + b"x" * 443, 1)
        x.set_committed_index(5)
        z.set_committed_index(5)
        publish(state, x)
        d = Dispatcher(rc)
        d.transport = wire = DispatcherWire()
        zv = [-1]
        state.member = member(Role.LEADER, 1, 0, quorum_ms=clock.now)
        for _ in range(3):  # term 1: n0 leads and n2 is in sync (one COMPARE, one TRUNCATE)
            d.tick()
            while wire.sent:
                d.on_reply(answer(wire.sent.pop(0), z, zv))
        assert d.reader.term_at(10) == 1  # the long-lived reader maps the term-1 files
        state.member = member(Role.FOLLOWER, 2, 1)
        d.tick()
        # term 2: n0 follows; the truncation replaces files, the new leader's entries follow
        x.truncate(6)
        for i in range(6, 10):
            x.append_leader(b"T2-new-%02d" % i + b"y" * 150, 2)
        x.set_committed_index(9)
        x.append_leader(b"", 3, codec.MAGIC_NOOP)  # term 3: n0 leads, its NOOP
        publish(state, x)
        state.member = member(Role.LEADER, 3, 0, quorum_ms=clock.now)
        zv = [-1]
        for _ in range(40):
            d.tick()
            while wire.sent:
                msg = wire.sent.pop(0)
                if msg.kind == P.PushKind.COMPARE and msg.pre_log_index >= 0:
                    assert msg.pre_log_term == x.term_at(msg.pre_log_index), "compared with a stale term"
                if msg.kind == P.PushKind.APPEND:
                    for k, (_off, e) in enumerate(codec.iter_entries(bytes(msg.entries))):
                        assert e.term == x.term_at(msg.first_index + k), "pushed a replaced entry"
                d.on_reply(answer(msg, z, zv))
            clock.now += 10
            state.member = member(Role.LEADER, 3, 0, quorum_ms=clock.now)
        assert z.ledger_end_index == x.ledger_end_index
        assert [z.term_at(i) for i in range(11)] == [x.term_at(i) for i in range(11)]
        d.close()
    finally:
        x.close()
        z.close()


def test_dispatcher_never_sends_what_it_read_while_a_truncation_changed_the_files(tmp_path: Path) -> None:
    """The generation fence's second half: the writer starts a truncation (and re-creates the
    files) after the dispatcher began its read and before it sends. The bytes it holds may be
    a replaced file's or zeroed; `validate` after reading and before sending must stop them."""
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock, peer="n2", data_file_size=4096, index_file_size=8 * 32)
    x = SegmentStore(StoreConfig(rc.cfg.store_dir, data_file_size=4096, index_file_size=8 * 32))
    z = SegmentStore(StoreConfig(str(tmp_path / "z"), data_file_size=4096, index_file_size=8 * 32))
    x.open()
    z.open()
    try:
        for i in range(12):
            x.append_leader(b"T1-%02d" % i + b"x" * 443, 1)
            if i < 6:
                z.append_leader(b"T1-%02d" % i + b"x" * 443, 1)
        x.set_committed_index(5)
        publish(state, x)
        d = Dispatcher(rc)
        d.transport = wire = DispatcherWire()
        real_get_run = d.reader.get_run
        raced = []

        def get_run_racing_the_writer(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            out = real_get_run(*a, **kw)
            if not raced:  # the writer (another process) changes the files right now
                raced.append(1)
                x.truncate(6)
                for i in range(6, 10):
                    x.append_leader(b"T2-%02d" % i + b"y" * 150, 2)
                publish(state, x)
            return out

        d.reader.get_run = get_run_racing_the_writer
        zv = [-1]
        for _ in range(20):
            state.member = member(Role.LEADER, 1, 0, quorum_ms=clock.now)
            d.tick()
            while wire.sent:
                msg = wire.sent.pop(0)
                if msg.kind == P.PushKind.APPEND:
                    for k, (_off, e) in enumerate(codec.iter_entries(bytes(msg.entries))):
                        assert (e.index, e.term) == (msg.first_index + k, x.term_at(msg.first_index + k)), \
                            "sent bytes of a file the truncation changed"
                d.on_reply(answer(msg, z, zv))
            clock.now += 10
        assert raced
        assert [z.term_at(i) for i in range(z.ledger_end_index + 1)] == \
            [x.term_at(i) for i in range(x.ledger_end_index + 1)]
        d.close()
    finally:
        x.close()
        z.close()


def test_dispatcher_pushes_nothing_without_the_lease(tmp_path: Path) -> None:
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock, peer="n1")
    x = SegmentStore(rc.cfg.store_config())
    x.open()
    try:
        x.append_leader(b"a", 1)
        publish(state, x)
        d = Dispatcher(rc)
        d.transport = wire = DispatcherWire()
        lease = lease_ms(rc.cfg.election_config())
        state.member = member(Role.LEADER, 1, 0, quorum_ms=clock.now - lease)
        d.tick()
        assert wire.sent == []
        state.member = member(Role.LEADER, 1, 0, quorum_ms=clock.now)
        d.tick()
        assert [m.kind for m in wire.sent] == [P.PushKind.COMPARE]
        d.close()
    finally:
        x.close()


class RawDispatcherWire(DispatcherWire):
    """Keeps the frames as sent too, to hand them to a real follower handler."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> bool:
        self.frames.append(frame)
        return super().send(frame)


def test_a_dispatcher_built_append_carries_a_run_crc_the_follower_handler_checks(tmp_path: Path) -> None:
    """End to end through encode/decode: the leader's dispatcher (n0) pushes to a real follower
    handler (n1, segment store). Its APPEND frames carry the run CRC of records + entries; the
    handler passes it to the store, which accepts the pushes as sent and refuses one whose
    entries were damaged on the way (nothing stored, the leader compares and resends)."""
    clock = Clock()
    files = dict(data_file_size=4096, index_file_size=8 * 32)
    lstate, fstate = FakeState(), FakeState()
    rc = make_rc(tmp_path, "n0", lstate, clock, peer="n1", **files)
    x = SegmentStore(rc.cfg.store_config())
    x.open()
    fstate.member = member(Role.FOLLOWER, 1, 0)
    h, hwire = make_handler(tmp_path, "n1", fstate, clock, **files)
    try:
        x.append_batch_raw([b"entry-%02d" % i + b"z" * 100 for i in range(20)], 1)
        publish(lstate, x)
        d = Dispatcher(rc)
        d.transport = wire = RawDispatcherWire()
        damaged: list[int] = []
        for _ in range(60):
            lstate.member = member(Role.LEADER, 1, 0, quorum_ms=clock.now)
            d.tick()
            while wire.frames:
                frame, msg = wire.frames.pop(0), wire.sent.pop(0)
                if msg.kind == P.PushKind.APPEND:
                    assert msg.run_crc == codec.push_run_crc(msg.index_records, msg.entries)
                    assert len(msg.index_records) == 32 * msg.count  # what the CRC covers
                    if not damaged:  # the first APPEND arrives with one flipped entry byte
                        end_before = h.store.ledger_end_index
                        bad = bytearray(msg.entries)
                        bad[len(bad) // 2] ^= 0x04
                        msg.entries = bytes(bad)
                        frame = P.encode(msg)
                        damaged.append(msg.request_id)
                h.handle_frame(b"n0", frame)
                reply = hwire.answer(msg.request_id)
                if damaged and msg.request_id == damaged[0]:
                    assert reply.code == RC.INCONSISTENT_STATE
                    assert h.store.ledger_end_index == end_before  # nothing stored
                if reply is None:
                    continue  # a pipelined push beyond the follower's end: queued, not answered
                d.on_reply(P.encode(reply))
            clock.now += 10
        assert damaged, "no APPEND was pushed"
        assert h.store.ledger_end_index == x.ledger_end_index == 19
        assert [bytes(h.store.get(i).body) for i in range(20)] == [bytes(x.get(i).body) for i in range(20)]
        d.close()
    finally:
        h.close()
        x.close()


# ------------------------------------------------------------------------------------------
# Ack checker
# ------------------------------------------------------------------------------------------
def test_ack_checker_advances_the_quorum_only_while_it_holds_the_lease(tmp_path: Path) -> None:
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock)
    x = SegmentStore(rc.cfg.store_config())
    x.open()
    try:
        for t in (1, 2, 2):
            x.append_leader(b"a", t)
        publish(state, x)
        a = AckChecker(rc)
        woken = []
        a.transport = SimpleNamespace(commit_wakeup=lambda: woken.append(1))
        state.write_peer(1, match_index=2, match_term=2)
        lease = lease_ms(rc.cfg.election_config())
        state.member = member(Role.LEADER, 2, 0, quorum_ms=clock.now - lease)
        a.tick()
        assert (state.quorum, woken) == (QuorumView(-1, -1), [])
        state.member = member(Role.LEADER, 2, 0, quorum_ms=clock.now)
        a.tick()
        assert (state.quorum, woken) == (QuorumView(2, 2), [1])
        a.close()
    finally:
        x.close()


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE])
def test_a_followers_dispatcher_lets_go_of_files_retention_deleted(tmp_path: Path, role: Role) -> None:
    """Retention deletes old data files on followers too. Every process that still maps a
    deleted file keeps its space from the disk, so a dispatcher must follow the ledger begin
    whatever its role — not only while it pumps as leader (seen: a follower's dispatchers held
    deleted 1 MiB files until they next led)."""
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock, peer="n2", data_file_size=4096, index_file_size=8 * 32)
    x = SegmentStore(StoreConfig(rc.cfg.store_dir, data_file_size=4096, index_file_size=8 * 32))
    x.open()
    try:
        for i in range(40):
            x.append_leader(b"e%02d" % i + b"x" * 400, 1)
        x.set_committed_index(39)
        publish(state, x)
        d = Dispatcher(rc)
        state.member = member(role, 1, 1 if role == Role.FOLLOWER else NO_SLOT)
        d.tick()
        d.reader.term_at(0)  # mapped (a follower's reader maps the store like any other)
        first = Path(rc.cfg.store_dir) / "data" / "00000000000000000000"
        held = lambda: any(f.path == first for f in d.reader._data.files)  # noqa: E731
        assert held()
        assert x.delete_before(30) > 0
        publish(state, x)
        d.tick()
        assert not held()
        d.close()
    finally:
        x.close()
