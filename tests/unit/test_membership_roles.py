"""Configurations in the log, counted by the real roles (docs/membership.md "Which configuration
is in force", "Counting"): the handler's `ConfigKeeper` (node/roles/handling/configs.py) through
pushes, truncations, restarts and `DIR/configuration`; the ack checker and `ElectorCore`
counting the voters the handler publishes. Driven in one process with the fakes of
test_replication_roles.py (a real NodeConfig, the in-memory block, a virtual clock)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role, VoteResult
from ipc.entry_codec import MAGIC_NOOP, encode_entry
from node.block.shared_state import QuorumView
from node.core.election import ElectorCore, LedgerEnd
from node.core.membership import (
    Change,
    ChangeKind,
    Configuration,
    apply_change,
    bootstrap_configuration,
    encode_configuration,
)
from node.core.slots import SlotOwner, SlotTable, assign, bootstrap_slots, release
from node.roles.ack_checker import AckChecker
from node.roles.handler import Handler
from node.roles.handling.configs import CONFIG_FILE, find_configurations
from node.store.memory_store import MemoryStore
from node.store.segment_store import SegmentStore
from node.wiring.slot_file import SlotFile
from tests.unit.test_replication_roles import (
    PEER_SPEC,
    Clock,
    FakeState,
    Fatal,
    HandlerWire,
    make_handler,
    make_rc,
    member,
    publish,
    push,
)

BOOT = bootstrap_configuration(PEER_SPEC)  # n0, n1, n2: slots 0, 1, 2
PEER_MAP = {m.id: m.address for m in BOOT.members}


def removed(who: str, index: int, base: Configuration = BOOT) -> Configuration:
    return apply_change(base, Change(ChangeKind.REMOVE, who), index)


def leader_log(entries: list[tuple[int, bytes, int]]) -> MemoryStore:
    """A leader's log: (term, body, magic) per entry."""
    s = MemoryStore()
    for term, body, magic in entries:
        s.append_leader(body, term, magic)
    return s


def push_run(h, x: MemoryStore, first: int, n: int, *, term: int, rid: int, pre_term: int) -> None:  # noqa: ANN001
    blob, got = x.get_raw(first, n, 1 << 20)
    h.handle_frame(b"n0", push(P.PushKind.APPEND, term=term, leader="n0", rid=rid, first_index=first,
                               count=got, entries=bytes(blob), pre_log_index=first - 1,
                               pre_log_term=pre_term))


def words(state: FakeState) -> tuple[int, int, int]:
    _led, w = state.read_ledger_config()
    return w.config_index, w.config_voters, w.config_learners


# ------------------------------------------------------------------------------------------
# The handler keeps the newest configuration through pushes, cuts and restarts
# ------------------------------------------------------------------------------------------
def test_a_pushed_configuration_is_published_then_rolled_back_by_a_cut(tmp_path: Path) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    store = MemoryStore()
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=store)
    assert words(state) == (-1, 0b111, 0)  # the bootstrap: every --peers member a voter
    c = removed("n2", 1)
    x = leader_log([(1, b"a", 1), (1, encode_configuration(c), MAGIC_NOOP), (1, b"b", 1)])
    push_run(h, x, 0, 3, term=1, rid=1, pre_term=-1)
    assert wire.answer(1).code == RC.SUCCESS
    assert words(state) == (1, 0b011, 0)  # published with the ledger end that holds it
    assert h.configs.latest == c
    assert (tmp_path / "n1" / CONFIG_FILE).read_text().startswith("entry.1=")
    # a new leader of term 2 never had it: its TRUNCATE cuts entry 1, the bootstrap is back
    state.member = member(Role.FOLLOWER, 2, 2)
    h.handle_frame(b"n2", push(P.PushKind.COMPARE, term=2, leader="n2", rid=2, pre_log_index=0, pre_log_term=1))
    h.handle_frame(b"n2", push(P.PushKind.TRUNCATE, term=2, leader="n2", rid=3, first_index=1))
    assert wire.answer(3).code == RC.SUCCESS and store.ledger_end_index == 0
    assert words(state) == (-1, 0b111, 0)
    assert "entry.1" not in (tmp_path / "n1" / CONFIG_FILE).read_text()


def test_a_restart_finds_the_configuration_in_its_file_without_scanning_the_log(tmp_path: Path) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    store = MemoryStore()
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=store)
    c1 = removed("n2", 1)
    c2 = apply_change(c1, Change(ChangeKind.ADD_LEARNER, "n2", "127.0.0.1", 20002), 3)
    x = leader_log([(1, b"a", 1), (1, encode_configuration(c1), MAGIC_NOOP), (1, b"b", 1),
                    (1, encode_configuration(c2), MAGIC_NOOP)])
    push_run(h, x, 0, 4, term=1, rid=1, pre_term=-1)
    assert words(state) == (3, 0b011, 0b100)
    # The restarted handler must not read the log for it: make every read fail.
    state2 = FakeState()
    reads = []
    store.get = lambda i, verify_crc=True, _g=store.get: reads.append(i) or _g(i, verify_crc)
    make_handler(tmp_path, "n1", state2, Clock(), store=store)
    assert words(state2) == (3, 0b011, 0b100)
    assert sorted(reads) == [1, 3]  # only the entries the file names, to check them


def test_a_file_entry_the_log_does_not_hold_is_dropped_at_open(tmp_path: Path) -> None:
    """The file is written before the store: a crash in between leaves an entry past the log's
    end (or another entry at its index). Neither may be counted after the restart."""
    state = FakeState()
    store = MemoryStore()
    store.append_leader(b"a", 1)
    store.append_leader(b"not a configuration", 1)
    d = tmp_path / "n1"
    d.mkdir()
    import base64
    (d / CONFIG_FILE).write_text(
        f"entry.1={base64.b64encode(encode_configuration(removed('n2', 1))).decode()}\n"
        f"entry.5={base64.b64encode(encode_configuration(removed('n0', 5))).decode()}\n")
    h, _ = make_handler(tmp_path, "n1", state, Clock(), store=store)
    assert words(state) == (-1, 0b111, 0)
    assert h.configs.latest == BOOT


def test_a_configuration_naming_a_new_machine_gives_it_a_free_slot_on_file(tmp_path: Path) -> None:
    """A member outside --peers takes the lowest free slot, written to the run directory's
    slot table BEFORE the masks naming it are published (node.wiring.slot_file)."""
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=MemoryStore())
    c = apply_change(BOOT, Change(ChangeKind.ADD_LEARNER, "n9", "127.0.0.1", 20009), 0)
    x = leader_log([(1, encode_configuration(c), MAGIC_NOOP)])
    push_run(h, x, 0, 1, term=1, rid=1, pre_term=-1)
    assert h.store.ledger_end_index == 0
    on_file = h.configs.slot_file.read()  # the table the other roles read
    assert on_file is not None and on_file.slot_of("n9") == 3 and on_file.id_of(3) == "n9"
    assert words(state) == (0, 0b0111, 0b1000)
    assert h.slot_id(3) == "n9" and h.follower.peer_ids[3] == "n9"


def test_a_handler_restarted_after_a_peers_members_slot_was_released_starts(tmp_path: Path) -> None:
    """The run's slot table outlives a handler crash: a --peers member removed and released
    there has no slot any more, and the bootstrap configuration still names it. The handler
    built its first masks from the bootstrap and crashed in a loop (the simulator's join
    fault found it); it now assigns only once its log says which configuration is in force."""
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    rc = make_rc(tmp_path, "n0", state, Clock())
    rc.run_dir = tmp_path / "run"
    rc.run_dir.mkdir()
    gone = release(assign(bootstrap_slots(PEER_MAP), removed("n1", 0)), 1)
    SlotFile(rc.run_dir).update(lambda _: gone)
    h = Handler(rc)  # raised ConfigurationError: member n1 has no slot
    h.store = MemoryStore()
    h.transport = HandlerWire()
    h.open()  # nothing in this log: the bootstrap configuration, n1 given a free slot again
    assert h.configs.slots.slot_of("n1") == 1 and bin(words(state)[1]).count("1") == 3


def test_a_configuration_with_no_free_slot_stops_the_node_before_storing_it(tmp_path: Path) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=MemoryStore())
    full = SlotTable(tuple(SlotOwner(f"x{i}", "127.0.0.1", 30000 + 2 * i, 5, removed_at=5)
                           if i > 2 else o for i, o in enumerate(h.configs.slots.owners)))
    h.configs.slot_file.update(lambda _: full)  # every other slot still leaving
    c = apply_change(BOOT, Change(ChangeKind.ADD_LEARNER, "n9", "127.0.0.1", 20009), 0)
    x = leader_log([(1, encode_configuration(c), MAGIC_NOOP)])
    with pytest.raises(Fatal, match="no free slot for n9"):
        push_run(h, x, 0, 1, term=1, rid=1, pre_term=-1)
    assert h.store.ledger_end_index == -1  # nothing stored that it cannot count


def test_find_configurations_walks_only_runs_that_hold_the_tag() -> None:
    c = encode_configuration(removed("n2", 11))
    run = (encode_entry(10, 1, 0, b"user data with DLCF inside") + encode_entry(11, 1, 0, c, MAGIC_NOOP)
           + encode_entry(12, 1, 0, b"", MAGIC_NOOP))
    assert find_configurations(memoryview(run), 10) == [(11, c)]
    assert find_configurations(encode_entry(3, 1, 0, b"x" * 100), 3) == []


def _records(run: bytes) -> bytes:
    from node.store.codec import encode_index, iter_entries
    return b"".join(encode_index(e.magic, off, len(e.body) + 48, e.index, e.term)
                    for off, e in iter_entries(run))


def test_find_configurations_reads_the_records_first() -> None:
    """With the leader's index records a run is walked only if a record names a NOOP (a
    configuration is one): a run of client data costs a strided copy of the records, not a
    search of every body byte (~80 µs for 256 KiB of 1 KiB entries)."""
    c = encode_configuration(removed("n2", 11))
    with_config = encode_entry(10, 1, 0, b"user data with DLCF inside") + encode_entry(11, 1, 0, c, MAGIC_NOOP)
    assert find_configurations(memoryview(with_config), 10, _records(with_config)) == [(11, c)]
    data = b"".join(encode_entry(i, 1, 0, b"DLCF" * 256) for i in range(20, 30))  # the tag in every body
    assert find_configurations(memoryview(data), 20, memoryview(_records(data))) == []
    assert find_configurations(memoryview(data), 20) == []  # walked (no records): no NOOP either
    # records that are no whole number of records: the search, as without
    assert find_configurations(memoryview(with_config), 10, _records(with_config)[:-1]) == [(11, c)]


def test_a_run_whose_records_hide_a_configuration_is_refused_by_the_store(tmp_path: Path) -> None:
    """What `find_configurations` relies on: a run whose records say NORMAL where a header says
    NOOP (so the records' check would pass a configuration by) is not stored, by either store."""
    from node.store.base import StoreConfig, StoreError
    from node.store.codec import encode_index

    c = encode_configuration(removed("n2", 1))
    run = encode_entry(0, 1, 0, b"data") + encode_entry(1, 1, 0, c, MAGIC_NOOP)
    lying = _records(run)[:32] + encode_index(1, len(encode_entry(0, 1, 0, b"data")), 48 + len(c), 1, 1)
    assert find_configurations(memoryview(run), 0, lying) == []
    seg = SegmentStore(StoreConfig(store_dir=str(tmp_path), data_file_size=1 << 20, index_file_size=1 << 16))
    seg.open()
    try:
        for store in (MemoryStore(), seg):
            with pytest.raises(StoreError, match="disagrees|index record"):
                store.append_follower(run, lying)
            assert store.ledger_end_index == -1
    finally:
        seg.close()


# ------------------------------------------------------------------------------------------
# The ack checker counts the published voters
# ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _leader_ack_checker(tmp_path: Path, terms: tuple[int, ...], without: str):
    """n0 leads term 2 of {n0, n1, n2} with entries of `terms` in its log, and the published
    configuration (entry 1) removed `without`: (block, ack checker). Closed at the end."""
    clock = Clock()
    state = FakeState()
    rc = make_rc(tmp_path, "n0", state, clock)
    x = SegmentStore(rc.cfg.store_config())
    x.open()
    try:
        for t in terms:
            x.append_leader(b"a", t)
        publish(state, x)
        v, lr = bootstrap_slots(rc.cfg.peer_map).masks(removed(without, 1))
        state.write_ledger(config_index=1, config_voters=v, config_learners=lr)
        a = AckChecker(rc)
        a.transport = SimpleNamespace(commit_wakeup=lambda: None)
        state.member = member(Role.LEADER, 2, 0, quorum_ms=clock.now)
        try:
            yield state, a
        finally:
            a.close()
    finally:
        x.close()


def test_ack_checker_counts_the_voters_the_handler_published(tmp_path: Path) -> None:
    """n0 leads {n0, n1, n2}; n1 acknowledged nothing of term 2, n2 everything. With all three
    voters, n0 + n2 are a majority; once the published configuration is {n0, n1} (n2 removed)
    the same watermarks are not."""
    with _leader_ack_checker(tmp_path, (1, 2, 2), "n2") as (state, a):
        state.write_peer(2, match_index=2, match_term=2)
        a.tick()
        assert state.quorum == QuorumView(-1, -1)  # n0 alone is not a majority of {n0, n1}
        state.write_ledger(config_index=-1, config_voters=0b111, config_learners=0)
        a.tick()
        assert state.quorum == QuorumView(2, 2)


def test_a_leader_that_removed_itself_does_not_count_its_own_log(tmp_path: Path) -> None:
    with _leader_ack_checker(tmp_path, (2, 2, 2), "n0") as (state, a):
        state.write_peer(1, match_index=2, match_term=2)
        a.tick()
        assert state.quorum == QuorumView(-1, -1)  # n1 is one of {n1, n2}: no majority
        state.write_peer(2, match_index=1, match_term=2)
        a.tick()
        assert state.quorum == QuorumView(1, 2)  # n1 and n2 both hold 1


# ------------------------------------------------------------------------------------------
# The elector core counts the newest configuration
# ------------------------------------------------------------------------------------------
def leader_core(config: Configuration, me: str = "n0") -> ElectorCore:
    core = ElectorCore(me, config, "g")
    core._change_role_to_leader(core.term, 0)  # noqa: SLF001 - a leader, for the rules below
    return core


def test_heartbeats_reach_learners_but_only_voters_renew_the_lease() -> None:
    c = apply_change(removed("n2", 1), Change(ChangeKind.ADD_LEARNER, "n2", "127.0.0.1", 20002), 2)
    core = leader_core(c)
    step = core.tick(10_000, LedgerEnd(2, 0))
    sent = {e.peer: e.message for e in step.effects if hasattr(e, "peer")}
    assert set(sent) == {"n1", "n2"}
    # the learner answers, the voter n1 does not: no majority of {n0, n1}
    core.on_response(P.HeartbeatResponse(int(RC.SUCCESS), "g", core.term, "n0", sent["n2"].request_id), 10_001)
    assert core.last_succ_heartbeat_ms == 0
    core.on_response(P.HeartbeatResponse(int(RC.SUCCESS), "g", core.term, "n0", sent["n1"].request_id), 10_002)
    assert core.last_succ_heartbeat_ms == 10_000


def test_a_leader_that_removed_itself_leads_until_the_change_commits_then_never_stands() -> None:
    core = leader_core(BOOT)
    core.set_configuration(removed("n0", 5), 10_000)
    assert core.role == Role.LEADER and not core.stands
    core.tick(10_000, LedgerEnd(5, core.term, committed=4))
    assert core.role == Role.LEADER  # the change is not committed: it must finish it
    core.tick(10_100, LedgerEnd(5, core.term, committed=5))
    assert core.role == Role.CANDIDATE
    for t in range(10_200, 40_000, 100):  # however long it waits, it never asks for votes
        step = core.tick(t, LedgerEnd(5, core.term, committed=5))
        assert not [e for e in step.effects if hasattr(e, "peer")]


def test_a_candidate_outside_the_newest_configuration_is_refused() -> None:
    core = ElectorCore("n1", removed("n2", 1), "g")
    req = P.VoteRequest("g", "n1", "n2", core.term + 1, 5, 10, 7)
    step = core.on_vote_request(req, LedgerEnd(1, 1), 10_000)
    assert step.effects[-1].message.vote_result == VoteResult.REJECT_UNKNOWN_LEADER
    assert core.term == 0  # and its term was not raised by it


def test_a_voter_grants_a_peers_member_its_newest_configuration_lacks() -> None:
    """n0 still counts the entry that removed n1; n1 and n2 count a later one that re-added
    n1 and removed n2. n1 can win only with n0's vote: refusing it because n0's configuration
    lacks n1 left the group without a leader for good (simulator seed 510003). A --peers
    member is never refused for that; the log comparison still applies."""
    core = ElectorCore("n0", removed("n1", 20), "g", peers=["n0", "n1", "n2"])
    step = core.on_vote_request(P.VoteRequest("g", "n0", "n1", core.term + 1, 2, 25, 7), LedgerEnd(20, 1), 10_000)
    assert step.effects[-1].message.vote_result != VoteResult.REJECT_UNKNOWN_LEADER  # adopts the term
    step = core.on_vote_request(P.VoteRequest("g", "n0", "n1", core.term, 2, 25, 8), LedgerEnd(20, 1), 10_001)
    assert step.effects[-1].message.vote_result == VoteResult.ACCEPT
    behind = P.VoteRequest("g", "n0", "n2", core.term, 1, 3, 9)  # a shorter log: refused on it
    step = core.on_vote_request(behind, LedgerEnd(20, 1), 10_002)
    assert step.effects[-1].message.vote_result != VoteResult.ACCEPT


def test_the_elector_role_counts_what_the_block_publishes() -> None:
    """SlotTable.configuration is the counting roles' reading of the ledger group: the inverse
    of the masks the handler publishes."""
    table = bootstrap_slots(bootstrap_configuration(PEER_SPEC).addresses)
    assert table.configuration(-1, *table.masks(BOOT)) == BOOT
    c = removed("n1", 4)
    assert table.configuration(4, *table.masks(c)) == c


def test_a_member_with_a_stale_configuration_follows_the_groups_leader() -> None:
    """n1's newest configuration is {n2} alone (it missed the entries that added n0 back and
    made it leader). It must still follow n0's heartbeats, or it never receives those entries:
    found by the simulator's membership fault (the group never converged). Its vote is where
    its configuration decides, not whom it follows."""
    only_n2 = removed("n0", 5, removed("n1", 4))
    core = ElectorCore("n1", only_n2, "g", peers=["n0", "n1", "n2"])
    step = core.on_heartbeat_request(P.HeartbeatRequest("g", "n1", "n0", core.term), 10_000)
    assert step.effects[-1].message.code == RC.SUCCESS
    assert (core.role, core.leader_id) == (Role.FOLLOWER, "n0")
    # A leader that no configuration here names at all (a machine added by entries this node
    # missed) is followed too: only its entries can tell this node about it.
    without = ElectorCore("n1", only_n2, "g")
    step = without.on_heartbeat_request(P.HeartbeatRequest("g", "n1", "n9", without.term), 10_000)
    assert step.effects[-1].message.code == RC.SUCCESS and without.leader_id == "n9"


# ------------------------------------------------------------------------------------------
# MEMBER_CHANGE on the leader's data port (node/roles/handling/member_change.py)
# ------------------------------------------------------------------------------------------
def change(kind: ChangeKind, who: str, rid: int, host: str = "", port: int = 0) -> bytes:
    return P.encode(P.MemberChangeRequest("g", "n0", int(kind), who, host, port, "", rid))


def leading_handler(tmp_path: Path):  # noqa: ANN201
    clock = Clock()
    state = FakeState()
    state.member = member(Role.LEADER, 2, 0, quorum_ms=clock.now)
    h, wire = make_handler(tmp_path, "n0", state, clock, store=MemoryStore())
    h.tick()  # the NOOP of term 2
    assert h.leader_term == 2
    return h, wire, state, clock


def commit_all(h) -> None:  # noqa: ANN001
    h.store.set_committed_index(h.store.ledger_end_index)


def test_member_change_is_refused_until_the_terms_noop_commits_then_appended(tmp_path: Path) -> None:
    h, wire, state, _ = leading_handler(tmp_path)
    h.handle_frame(b"c", change(ChangeKind.REMOVE, "n2", 1))
    assert wire.answer(1).code == RC.TERM_NOT_READY  # the 2015 rule: own term first
    commit_all(h)
    h.handle_frame(b"c", change(ChangeKind.REMOVE, "n2", 2))
    assert wire.answer(2) is None  # appended: answered at commit
    e = h.store.get(h.store.ledger_end_index)
    assert e.magic == MAGIC_NOOP and bytes(e.body) == encode_configuration(removed("n2", e.index))
    assert words(state) == (e.index, 0b011, 0)  # counted at once, committed or not
    h.handle_frame(b"c", change(ChangeKind.REMOVE, "n1", 3))
    assert wire.answer(3).code == RC.MEMBERSHIP_CHANGE_IN_PROGRESS
    commit_all(h)
    h.handle_frame(b"c", change(ChangeKind.ADD_LEARNER, "n9", 4, "127.0.0.1", 20009))
    assert wire.answer(4) is None  # a machine outside --peers: appended, in slot 3
    assert words(state)[1:] == (0b011, 0b1000) and h.configs.slots.id_of(3) == "n9"


def test_promote_counts_a_learner_watermark_of_this_term_only(tmp_path: Path) -> None:
    """The learner's peer record may hold a watermark of an earlier leadership (cut since):
    it says nothing of what the learner holds now. Found by the simulator: a member whose
    log was 66 entries behind and not following anyone was promoted on such a record."""
    h, wire, state, clock = leading_handler(tmp_path)
    commit_all(h)
    h.handle_frame(b"c", change(ChangeKind.REMOVE, "n2", 1))
    commit_all(h)
    h.handle_frame(b"c", change(ChangeKind.ADD_LEARNER, "n2", 2, "127.0.0.1", 20002))
    commit_all(h)
    end = h.store.ledger_end_index
    state.write_peer(2, match_index=end, match_term=1, alive=1, last_ack_ms=clock.now)
    h.handle_frame(b"c", change(ChangeKind.PROMOTE, "n2", 3))
    assert wire.answer(3).code == RC.LEARNER_BEHIND
    state.write_peer(2, match_index=end, match_term=2, alive=1, last_ack_ms=clock.now)
    h.handle_frame(b"c", change(ChangeKind.PROMOTE, "n2", 4))
    assert wire.answer(4) is None and words(state)[1:] == (0b111, 0)


def test_promote_needs_the_learner_to_hold_the_entry_that_added_it(tmp_path: Path) -> None:
    """A joining node whose elector is still learning the group's term refuses pushes: its
    watermark stays below the entry that added it, though within the catch-up distance of a
    short log. Promoting it put a voter that answered no heartbeat into the quorum (a secure
    real-process test lost its leader's lease that way)."""
    h, wire, state, clock = leading_handler(tmp_path)
    commit_all(h)
    h.handle_frame(b"c", change(ChangeKind.ADD_LEARNER, "n9", 1, "127.0.0.1", 20009))
    commit_all(h)
    added = h.store.ledger_end_index
    slot = h.configs.slots.slot_of("n9")
    state.write_peer(slot, match_index=added - 1, match_term=2, alive=1, last_ack_ms=clock.now)
    h.handle_frame(b"c", change(ChangeKind.PROMOTE, "n9", 2))
    assert wire.answer(2).code == RC.LEARNER_BEHIND
    state.write_peer(slot, match_index=added, match_term=2, alive=1, last_ack_ms=clock.now)
    h.handle_frame(b"c", change(ChangeKind.PROMOTE, "n9", 3))
    assert wire.answer(3) is None and words(state)[1] == 0b1111


def test_no_second_leader_in_a_term_whose_voters_changed() -> None:
    """n2 led term 7 elected by {n2} alone, then removed itself: {n1} alone is the voter set.
    n1 never voted in term 7, and DLedger's candidates revote in their current term: it
    elected itself leader of term 7 too (the simulator's membership fault, seed 34). Its
    campaign must be in a new term."""
    core = ElectorCore("n1", removed("n0", 3, removed("n2", 2)), "g", term=7, now_ms=0,
                       peers=["n0", "n1", "n2"])
    core.on_heartbeat_request(P.HeartbeatRequest("g", "n1", "n2", 7), 1_000)
    assert (core.role, core.term) == (Role.FOLLOWER, 7)
    only_n1 = Configuration(tuple(m for m in BOOT.members if m.id == "n1"), 9)
    core.set_configuration(only_n1, 1_500)
    step = core.tick(60_000, LedgerEnd(9, 7, committed=9))  # n2 went silent
    for _ in range(10):
        if core.role == Role.LEADER:
            break
        step = core.tick(core.next_deadline(60_000), LedgerEnd(9, 7, committed=9))
    assert step is not None and core.role == Role.LEADER
    assert core.term == 8, "elected again in the term another leader led"


def test_a_member_removed_by_an_uncommitted_entry_still_stands_and_counts_only_the_new_voters() -> None:
    """n1 removed itself at entry 60 ({n2} alone) and lost leadership before 60 reached n2;
    n2 still counts {n1, n2} and cannot win against n1's longer log. n1 must stand while 60 is
    uncommitted (it holds the only copy), counting n2's vote only (simulator seed 85)."""
    core = ElectorCore("n1", removed("n1", 60, removed("n0", 40)), "g", term=4, now_ms=0,
                       peers=["n0", "n1", "n2"])
    assert not core.stands
    now = 60_000
    for _ in range(4):  # a pre-vote in term 4 (its voter set changed in it), then term 5
        step = core.tick(now, LedgerEnd(60, 4, committed=59))
        asked = [e for e in step.effects if hasattr(e, "peer")]
        if asked:
            assert [e.peer for e in asked] == ["n2"]
            core.on_response(P.VoteResponse(int(RC.SUCCESS), "g", core.term, "", VoteResult.ACCEPT, 4, 40,
                                            asked[0].message.request_id), now + 1)
        if core.role == Role.LEADER:
            break
        now = core.next_deadline(now + 1)
    assert core.role == Role.LEADER and core.term == 5  # n2's vote is the majority of {n2}
    core.tick(60_100, LedgerEnd(61, core.term, committed=61))
    assert core.role == Role.CANDIDATE  # 60 committed: it steps down, and stands no more
    step = core.tick(90_000, LedgerEnd(61, core.term, committed=61))
    assert not [e for e in step.effects if hasattr(e, "peer")]


def test_refusals_of_an_unknown_candidate_do_not_raise_its_term() -> None:
    """A removed member that lacks the entry removing it stands; the group answers
    REJECT_UNKNOWN_LEADER. Counted as a quorum that answered without a leader, they made it
    raise its term every round (term 81 after 20 s in simulator seed 85); re-added, it would
    have brought that term back and deposed the leader."""
    core = ElectorCore("n0", BOOT, "g", term=3, voted_for="n1", now_ms=0)
    terms = set()
    now = 10_000
    for _ in range(10):
        step = core.tick(now, LedgerEnd(5, 3))
        for e in step.effects:
            if isinstance(getattr(e, "message", None), P.VoteRequest):
                core.on_response(P.VoteResponse(int(RC.SUCCESS), "g", 3, "", VoteResult.REJECT_UNKNOWN_LEADER,
                                                3, 5, e.message.request_id), now + 1)
        terms.add(core.term)
        now = core.next_deadline(now) + 1
    assert max(terms) <= 4, sorted(terms)


# ------------------------------------------------------------------------------------------
# Snapshots and installs carry the configuration
# ------------------------------------------------------------------------------------------
def snapshot_meta(last_index: int, config: Configuration | None) -> bytes:
    import base64

    from node.statemachine.snapshot_meta import SnapshotMeta
    extra = {} if config is None else {"configuration": base64.b64encode(encode_configuration(config)).decode(),
                                       "configuration_index": config.index}
    return SnapshotMeta(last_index, 1, 0, 0, "kv", "", **extra).to_json()


def install_reset(h, last_index: int, meta: bytes) -> None:  # noqa: ANN001
    from node.core.follower import StoreReset
    assert h.install.store_reset(StoreReset(last_index, 1, meta), h.state.read_member())


def test_an_install_past_a_configuration_entry_never_stored_counts_its_voters(tmp_path: Path) -> None:
    """The regression: a follower whose log was reset to a snapshot that covers a configuration
    entry it never stored kept counting its old configuration (the simulator's membership fault
    with installs: 10 of 60 seeds). The snapshot's meta carries it; it becomes the base."""
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    store = MemoryStore()
    store.append_leader(b"a", 1)
    h, _ = make_handler(tmp_path, "n1", state, Clock(), store=store)
    c = removed("n2", 3)  # entry 3 of the leader's log; this follower never stored it
    install_reset(h, 5, snapshot_meta(5, c))
    assert (store.ledger_begin_index, store.ledger_end_index) == (6, 5)
    assert h.configs.latest == c
    assert words(state) == (3, 0b011, 0)
    # a restart finds it in DIR/configuration (the log holds no configuration entry at all)
    state2 = FakeState()
    h2, _ = make_handler(tmp_path, "n1", state2, Clock(), store=store)
    assert h2.configs.latest == c and words(state2) == (3, 0b011, 0)


def test_an_install_drops_an_uncommitted_configuration_of_the_old_log(tmp_path: Path) -> None:
    """A configuration entry the follower stored from a deposed leader (uncommitted, below the
    snapshot's last index) is not the group's: after the reset the snapshot's one counts, and
    with none recorded the bootstrap one, also after a restart."""
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    store = MemoryStore()
    h, _ = make_handler(tmp_path, "n1", state, Clock(), store=store)
    x = leader_log([(1, b"a", 1), (1, encode_configuration(removed("n0", 1)), MAGIC_NOOP)])
    push_run(h, x, 0, 2, term=1, rid=1, pre_term=-1)
    assert words(state) == (1, 0b110, 0)
    install_reset(h, 4, snapshot_meta(4, None))
    assert h.configs.latest == BOOT and words(state) == (-1, 0b111, 0)
    state2 = FakeState()
    h2, _ = make_handler(tmp_path, "n1", state2, Clock(), store=store)
    assert h2.configs.latest == BOOT


def test_a_crash_between_the_file_and_the_reset_keeps_the_old_logs_configuration(tmp_path: Path) -> None:
    """The base is written before the log is reset; until the log begins after the snapshot
    the base is not used (the old log is still there; the leader installs again)."""
    state = FakeState()
    state.member = member(Role.FOLLOWER, 1, 0)
    store = MemoryStore()
    h, _ = make_handler(tmp_path, "n1", state, Clock(), store=store)
    c1 = removed("n2", 1)
    x = leader_log([(1, b"a", 1), (1, encode_configuration(c1), MAGIC_NOOP)])
    push_run(h, x, 0, 2, term=1, rid=1, pre_term=-1)
    h.configs.before_reset(7, removed("n0", 5))  # ... and the process dies before reset_to
    text = (tmp_path / "n1" / CONFIG_FILE).read_text()
    assert "base.5=" in text and "covers=7" in text and "entry.1=" in text
    state2 = FakeState()
    h2, _ = make_handler(tmp_path, "n1", state2, Clock(), store=store)
    assert h2.configs.latest == c1


def test_a_snapshot_meta_carries_the_configuration_and_old_metas_stay_as_they_were() -> None:
    from node.statemachine.snapshot_meta import SnapshotMeta, SnapshotMetaError
    plain = SnapshotMeta.from_json(snapshot_meta(9, None))
    assert b"configuration" not in plain.to_json() and plain.config() is None
    c = removed("n2", 4)
    m = SnapshotMeta.from_json(snapshot_meta(9, c))
    assert m.config() == c and SnapshotMeta.from_json(m.to_json()) == m
    import json
    d = json.loads(m.to_json())
    assert d["configuration"]["index"] == 4
    for bad in ({"index": 10, "entry": d["configuration"]["entry"]},  # past last_index
                {"index": 4, "entry": "AAAA"},  # not a configuration
                {"index": 4}, "text"):
        with pytest.raises(SnapshotMetaError, match="configuration"):
            SnapshotMeta.from_json(json.dumps({**d, "configuration": bad}).encode())


def test_a_snapshot_taken_with_a_configuration_records_it_in_meta_json(tmp_path: Path) -> None:
    """The applier passes the configuration in force at the index it snapshots (it applies
    every committed entry in order, so it knows it); the published meta.json holds it."""
    from node.statemachine.snapshot_store import SnapshotStore
    c = removed("n2", 1)
    snaps = SnapshotStore(tmp_path)
    p = snaps.begin(3, 1, "kv", (c.index, encode_configuration(c)))
    p.file.write(b"state")
    snap = p.commit()
    assert SnapshotStore(tmp_path, writable=False).list()[-1].meta.config() == c == snap.meta.config()
