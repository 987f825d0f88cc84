"""The state block (node/block/shared_state.py): layout rules, lifecycle, seqlock, resource tracker.

Cross-process tests start real interpreters (``sys.executable -c``) so that nothing is inherited
by fork: that is how the role processes attach. Every test removes the segments it made.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import struct
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import pytest
from child_process import Child

from node.block import shared_state as ss
from node.block.shared_state import (
    FIELDS,
    LAYOUT,
    PEER_LAYOUT,
    LayoutMismatch,
    NotTheWriter,
    Role,
    SegmentNotFound,
    SeqlockTimeout,
    SharedState,
    UnsupportedPlatformError,
)

REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _shm_path(name: str) -> Path:
    return Path("/dev/shm") / name


@pytest.fixture
def shm_name() -> Iterator[str]:
    """A fresh segment name; whatever exists under it at the end is removed."""
    name = f"dl_t{os.getpid()}_{next(_names)}"
    try:
        yield name
    finally:
        if _shm_path(name).exists():
            ss._unlink_raw(name)


@pytest.fixture
def block(shm_name: str) -> Iterator[SharedState]:
    st = SharedState.create(shm_name, n_peers=5, self_slot=0)
    try:
        yield st
    finally:
        st.unlink()
        st.close()


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# the layout
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_peers", [1, 3, 7])
def test_fields_are_8_aligned_disjoint_and_inside_the_block(n_peers: int) -> None:
    spans = [(f.offset, f.name) for f in LAYOUT]
    for p in range(n_peers):
        base = ss.PEERS_OFFSET + p * ss.PEER_STRIDE
        spans += [(base + f.offset, f"peer[{p}].{f.name}") for f in PEER_LAYOUT]
    spans.sort()
    for (off, name), (next_off, next_name) in itertools.pairwise(spans):
        assert next_off >= off + 8, f"{name}@{off} overlaps {next_name}@{next_off}"
    assert all(off % 8 == 0 for off, _ in spans)
    assert spans[-1][0] + 8 <= ss.layout_size(n_peers)
    assert all(f.fmt == "q" for f in LAYOUT + PEER_LAYOUT)
    assert len({f.name for f in LAYOUT}) == len(LAYOUT)
    assert len({f.name for f in PEER_LAYOUT}) == len(PEER_LAYOUT)
    # different writers never share a 64-byte line (no false sharing between roles)
    lines: dict[int, str] = {}
    for f in LAYOUT:
        assert lines.setdefault(f.offset // 64, f.writer) == f.writer, f.name
    assert ss.PEERS_OFFSET % 64 == 0 and ss.PEER_STRIDE % 64 == 0


def test_every_field_has_one_known_writer_and_groups_have_one_seq() -> None:
    for f in LAYOUT:
        assert f.writer in ss.FIXED_ROLES, f.name
    assert {f.writer for f in PEER_LAYOUT} == {"dispatcher[p]"}
    groups: dict[str, list[ss.FieldSpec]] = {}
    for f in LAYOUT + PEER_LAYOUT:
        if f.group is not None:
            groups.setdefault(f.group, []).append(f)
    assert set(groups) == {"member", "ledger", "quorum", "snapshot", "peer"}
    for name, fields in groups.items():
        assert len({f.writer for f in fields}) == 1, f"group {name} has several writers"
        assert sum(f.is_seq for f in fields) == 1, f"group {name} needs exactly one seq word"
        offs = [f.offset for f in fields]
        assert offs == list(range(offs[0], offs[0] + 8 * len(offs), 8)), f"{name} not contiguous"


def test_layout_table_is_the_same_in_docstring_and_docs() -> None:
    table = ss.render_layout_table()
    assert table in (ss.__doc__ or ""), "module docstring table is stale: paste render_layout_table()"
    docs = (REPO / "docs" / "shared_state.md").read_text()
    assert table in docs, "docs/shared_state.md table is stale: paste render_layout_table()"


def test_segment_name_is_deterministic_short_and_distinct(tmp_path: Path) -> None:
    a = ss.segment_name("g", "n0", tmp_path)
    assert a == ss.segment_name("g", "n0", str(tmp_path) + "/.")  # same dir, other spelling
    assert a.startswith("dl_") and len(a) < 30
    assert len({a, ss.segment_name("g", "n1", tmp_path), ss.segment_name("h", "n0", tmp_path),
                ss.segment_name("g", "n0", tmp_path / "x")}) == 4


def test_unsupported_cpu_is_refused(monkeypatch: pytest.MonkeyPatch, shm_name: str) -> None:
    monkeypatch.setattr(ss.platform, "machine", lambda: "aarch64")
    with pytest.raises(UnsupportedPlatformError, match="aarch64"):
        SharedState.create(shm_name, 3, 0)
    assert not _shm_path(shm_name).exists()


# ---------------------------------------------------------------------------------------------
# create / attach / groups
# ---------------------------------------------------------------------------------------------


def test_create_initialises_every_group(block: SharedState) -> None:
    h = block.header()
    assert (h.magic, h.layout_version, h.n_peers, h.self_slot) == (ss.MAGIC, ss.LAYOUT_VERSION, 5, 0)
    assert h.total_size == ss.layout_size(5) and h.supervisor_pid == os.getpid()
    assert block.read_member() == ss.MemberView(Role.CANDIDATE, 0, -1, -1, -1, 0, 0, 0)
    assert block.read_ledger() == ss.LedgerView(-1, -1, -1, -1)
    assert block.read_quorum() == ss.QuorumView(-1, -1)
    assert [p.slot for p in block.read_peers()] == [1, 2, 3, 4]
    assert all((p.match_index, p.match_term, p.alive) == (-1, -1, False)
               for p in block.read_peers())


def test_attach_round_trips_every_group(block: SharedState) -> None:
    with SharedState.attach(block.name) as other:
        assert (other.n_peers, other.self_slot) == (5, 0)
        m = block.write_member(role=Role.LEADER, current_term=4, leader_slot=0, voted_for_slot=0,
                               transferee_slot=3, last_quorum_heartbeat_ms=1234)
        assert other.read_member() == m == ss.MemberView(Role.LEADER, 4, 0, 0, 3, 1, 0, 1234)
        # role_epoch moves only when role or term changes
        assert block.write_member(last_leader_heartbeat_ms=9).role_epoch == 1
        assert block.write_member(current_term=5).role_epoch == 2
        assert other.read_member().last_leader_heartbeat_ms == 9

        other.write_ledger(ledger_begin_index=0, ledger_end_index=10, ledger_end_term=4,
                           committed_index=8)
        assert block.read_ledger() == ss.LedgerView(0, 10, 4, 8)
        assert block.get("committed_index") == 8
        other.write_ledger(store_generation=6)  # the other fields keep their values
        assert block.read_ledger() == ss.LedgerView(0, 10, 4, 8, 6)
        other.set("store_unwritable_ms", 4321)
        assert block.get("store_unwritable_ms") == 4321
        other.write_quorum(quorum_index=9, quorum_term=4)
        assert block.read_quorum() == ss.QuorumView(9, 4)

        other.write_peer(3, match_index=7, match_term=4, alive=True, last_ack_ms=55)
        other.incr_peer(3, "pushes_sent")
        other.incr_peer(3, "bytes_pushed", 4096)
        other.beat("dispatcher[3]", now_ms=77)
        assert block.read_peer(3) == ss.PeerView(3, 7, 4, True, 55, 77, 1, 0, 4096)
        assert block.read_peer(2).match_index == -1  # neighbours untouched

        for counter in ("appends", "append_errors", "gets", "push_requests", "votes_requested",
                        "votes_granted", "elections_started", "heartbeats_sent"):
            assert other.incr(counter, 3) == 3 and block.get(counter) == 3
        for role in ("elector", "handler", "ack_checker"):
            other.beat(role, now_ms=100)
            assert block.last_beat(role) == 100
        assert block.bump_generation() == 1 and other.header().generation == 1


def test_store_generation_is_read_with_the_ledger_it_describes(block: SharedState) -> None:
    """C1/C2: a reader takes the store generation from the same seqlock snapshot as the ledger
    end it reads up to, so "end E of generation G" is one fact, never half of two."""
    block.write_ledger(ledger_begin_index=0, ledger_end_index=5, ledger_end_term=2,
                       committed_index=3, store_generation=4)
    assert block.read_ledger() == ss.LedgerView(0, 5, 2, 3, 4)
    assert ss.FIELDS["store_generation"].group == "ledger"
    assert ss.FIELDS["store_unwritable_ms"].group is None
    assert ss.FIELDS["store_unwritable_ms"].writer == "handler"


def test_single_writer_is_enforced_when_a_role_is_given(block: SharedState) -> None:
    with SharedState.attach(block.name, role="dispatcher[2]") as d2:
        d2.write_peer(2, match_index=1)
        d2.incr_peer(2, "entries_pushed")
        with pytest.raises(NotTheWriter):
            d2.write_peer(1, match_index=1)
        with pytest.raises(NotTheWriter):
            d2.write_member(current_term=9)
        with pytest.raises(NotTheWriter):
            d2.incr("appends")
        with pytest.raises(NotTheWriter):
            d2.beat("handler")
    with SharedState.attach(block.name, role="handler") as h:
        with pytest.raises(ValueError, match="group ledger"):
            h.set("committed_index", 3)  # group fields only move under the seqlock
        with pytest.raises(ValueError, match="immutable"):
            h.set("n_peers", 3)
    with pytest.raises(ValueError, match="dispatcher slot"):
        SharedState.attach(block.name, role="dispatcher[0]")  # our own slot: no such role
    with pytest.raises(ValueError, match="-1..15"):  # any of the block's 16 records
        block.write_member(leader_slot=16)
    block.write_member(leader_slot=5)  # a member added later holds a slot past --peers


# ---------------------------------------------------------------------------------------------
# seqlock
# ---------------------------------------------------------------------------------------------

_TORN_WRITER = """
    import select, sys
    from node.block.shared_state import Role, SharedState
    st = SharedState.attach(sys.argv[1])
    print("ready", flush=True)
    k = 0
    while True:  # until the reader writes a line (or closes stdin)
        k += 1
        st.write_member(role=Role(k % 3), current_term=k, leader_slot=k % 5,
                        voted_for_slot=(k + 1) % 5, transferee_slot=(k + 2) % 5 - 1,
                        last_leader_heartbeat_ms=3 * k, last_quorum_heartbeat_ms=7 * k)
        st.write_ledger(ledger_begin_index=k, ledger_end_index=2 * k, ledger_end_term=3 * k,
                        committed_index=4 * k)
        st.write_peer(2, match_index=k, match_term=k + 1, alive=bool(k & 1), last_ack_ms=5 * k)
        if k % 256 == 0 and select.select([sys.stdin], [], [], 0)[0]:
            break
    print("done", k, flush=True)
    st.close()
"""


def test_snapshots_are_never_torn_across_processes(block: SharedState, children) -> None:
    """A writer process derives every field of a group from one counter k; a reader in this
    process checks for ~2 s that each snapshot is one k (never a mix) and that k advances."""
    writer = Child(_TORN_WRITER, block.name)
    children.append(writer)
    assert writer.line() == "ready"
    seen: set[int] = set()
    last = {"member": 0, "ledger": 0, "peer": 0}
    reads = 0
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        for _ in range(50):
            reads += 1
            m = block.read_member()
            k = m.current_term
            if k:
                assert m == ss.MemberView(Role(k % 3), k, k % 5, (k + 1) % 5, (k + 2) % 5 - 1, k,
                                          3 * k, 7 * k), f"torn member snapshot {m}"
            assert k >= last["member"]
            last["member"] = k
            seen.add(k)

            g = block.read_ledger()
            k = g.ledger_begin_index
            if k != -1:
                assert g == ss.LedgerView(k, 2 * k, 3 * k, 4 * k), f"torn ledger snapshot {g}"
                assert k >= last["ledger"]
                last["ledger"] = k

            p = block.read_peer(2)
            k = p.match_index
            if k != -1:
                assert (p.match_term, p.alive, p.last_ack_ms) == (k + 1, bool(k & 1), 5 * k), (
                    f"torn peer snapshot {p}")
                assert k >= last["peer"]
                last["peer"] = k
    assert len(seen) > 100, f"writer made too little progress: {len(seen)} terms in {reads} reads"
    assert min(last.values()) > 0
    print(f"{reads} reads, {len(seen)} distinct terms, {block.read_retries} retried attempts")
    writer.send("stop")
    assert writer.line(timeout=20).startswith("done")
    assert writer.finish() == 0


def test_a_copy_that_overlaps_a_write_is_discarded(block: SharedState,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic interleaving: a whole write lands between the reader's copy of the fields
    and its second seq load. The copy (old term) must be thrown away and the read retried."""
    real = ss._MEMBER_S
    seq = FIELDS["member_seq"].offset // 8
    term = FIELDS["current_term"].offset // 8

    class CopyThenWrite:
        calls = 0

        def unpack_from(self, buf, offset):  # the reader's copy ...
            vals = real.unpack_from(buf, offset)
            if self.calls == 0:  # ... then a writer runs to completion before the recheck
                block._w[seq] += 1
                block._w[term] = 8
                block._w[seq] += 1
            self.calls += 1
            return vals

    block.write_member(current_term=7)
    before = block.read_retries
    monkeypatch.setattr(ss, "_MEMBER_S", CopyThenWrite())
    assert block.read_member().current_term == 8
    assert block.read_retries == before + 1


_DIES_MID_WRITE = """
    import sys
    from node.block.shared_state import FIELDS, SharedState
    st = SharedState.attach(sys.argv[1], role="elector")
    st._seq_begin(FIELDS["member_seq"].offset // 8)          # seq is now odd ...
    st._w[FIELDS["current_term"].offset // 8] = 99           # ... and one field is written
    print("mid-write", flush=True)
    sys.stdin.readline()
"""


def test_reader_gives_up_on_a_dead_writer_and_repair_recovers(block: SharedState,
                                                              children) -> None:
    block.write_member(current_term=3, leader_slot=1)
    writer = Child(_DIES_MID_WRITE, block.name)
    children.append(writer)
    assert writer.line() == "mid-write"
    writer.kill()

    t0 = time.monotonic()
    with pytest.raises(SeqlockTimeout, match="'member'.*repair_seqs"):
        block.read_member(timeout_s=0.2)
    assert time.monotonic() - t0 < 2.0  # bounded, not a hang
    assert block.read_ledger().ledger_end_index == -1  # other groups unaffected

    with SharedState.attach(block.name, role="elector") as restarted:
        assert restarted.repair_seqs("elector") == ["member"]
        assert restarted.repair_seqs("elector") == []  # idempotent
        # readable again; the half-done write is visible, which is why the restarted role
        # rewrites its group from its durable source right after repairing
        assert block.read_member(timeout_s=0.2).current_term == 99
        restarted.write_member(current_term=3)
        assert block.read_member().current_term == 3


def test_a_write_over_an_odd_seq_repairs_it(block: SharedState) -> None:
    seq = ss.PEERS_OFFSET // 8 + 2 * ss.PEER_STRIDE // 8  # peer[2].seq
    block._w[seq] = 41  # a dispatcher died mid-write
    with pytest.raises(SeqlockTimeout):
        block.read_peer(2, timeout_s=0.05)
    block.write_peer(2, match_index=5, match_term=1)
    assert block._w[seq] % 2 == 0 and block._w[seq] > 41
    assert block.read_peer(2, timeout_s=0.05).match_index == 5
    block._w[seq] = 43
    assert block.repair_seqs("dispatcher[2]") == ["peer[2]"]
    assert block.read_peer(2, timeout_s=0.05).match_index == 5


# ---------------------------------------------------------------------------------------------
# lifecycle and the resource tracker
# ---------------------------------------------------------------------------------------------

_ATTACH_AND_WAIT = """
    import sys
    from multiprocessing import resource_tracker
    from node.block.shared_state import SharedState
    st = SharedState.attach(sys.argv[1], role="handler")
    st.incr("gets")
    print("attached", st.read_member().current_term, resource_tracker._resource_tracker._pid,
          flush=True)
    sys.stdin.readline()
"""


def test_block_survives_sigkill_of_an_attached_process(block: SharedState, children) -> None:
    block.write_member(current_term=7)
    reader = Child(_ATTACH_AND_WAIT, block.name)
    children.append(reader)
    # "None": attaching started no resource tracker that could unlink the block when we die
    assert reader.line() == "attached 7 None"
    reader.kill()
    assert _shm_path(block.name).exists()
    assert block.read_member().current_term == 7 and block.get("gets") == 1
    with SharedState.attach(block.name) as again:
        assert again.read_member().current_term == 7

    block.unlink()
    assert not _shm_path(block.name).exists()
    with pytest.raises(SegmentNotFound):
        SharedState.attach(block.name)


@pytest.mark.parametrize("close", [True, False], ids=["close", "no-close"])
def test_attached_process_exiting_leaves_block_and_prints_nothing(block: SharedState, children,
                                                                   close: bool) -> None:
    code = """
        import sys
        from node.block.shared_state import SharedState
        st = SharedState.attach(sys.argv[1], role="handler")
        st.incr("appends", 5)
        if sys.argv[2] == "1":
            st.close()
    """
    child = Child(code, block.name, "1" if close else "0")
    children.append(child)
    assert child.finish() == 0
    err = child.stderr()
    assert "resource_tracker" not in err and "leaked" not in err
    assert err == ""
    assert _shm_path(block.name).exists() and block.get("appends") == 5


def test_sigkilled_creator_has_its_block_removed_by_its_resource_tracker(shm_name: str,
                                                                         children) -> None:
    code = """
        import sys
        from node.block.shared_state import SharedState
        SharedState.create(sys.argv[1], 3, 0)
        print("created", flush=True)
        sys.stdin.readline()
    """
    creator = Child(code, shm_name)
    children.append(creator)
    assert creator.line() == "created" and _shm_path(shm_name).exists()
    creator.kill()
    _wait_until(lambda: not _shm_path(shm_name).exists(), 10, "the tracker to unlink the block")


def test_create_replaces_a_stale_block_from_a_killed_node(shm_name: str, children,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 of a whole node, tracker included, leaves the segment behind; the restarted
    supervisor (same name) must start from a fresh block, not the dead run's values."""
    code = """
        import sys
        from multiprocessing import resource_tracker
        from node.block.shared_state import Role, SharedState
        st = SharedState.create(sys.argv[1], 3, 1)
        st.write_member(role=Role.LEADER, current_term=42, leader_slot=1)
        st.write_ledger(ledger_end_index=100, ledger_end_term=42, committed_index=100)
        st.bump_generation()
        print("created", resource_tracker._resource_tracker._pid, flush=True)
        sys.stdin.readline()
    """
    old = Child(code, shm_name)
    children.append(old)
    word, tracker_pid = old.line().split()
    assert word == "created"
    os.kill(int(tracker_pid), signal.SIGKILL)  # first the tracker, so nothing cleans up
    old_pid = old.proc.pid
    old.kill()
    assert _shm_path(shm_name).exists()

    with caplog.at_level(logging.WARNING, logger="dledger.shared_state"):
        st = SharedState.create(shm_name, n_peers=5, self_slot=2)
    try:
        assert f"stale shared state block {shm_name}" in caplog.text
        assert f"supervisor pid {old_pid}" in caplog.text
        h = st.header()
        assert (h.n_peers, h.self_slot, h.generation, h.supervisor_pid) == (5, 2, 0, os.getpid())
        assert st.read_member() == ss.MemberView(Role.CANDIDATE, 0, -1, -1, -1, 0, 0, 0)
        assert st.read_ledger() == ss.LedgerView(-1, -1, -1, -1)
        with SharedState.attach(shm_name) as other:
            assert other.n_peers == 5
    finally:
        st.unlink()
        st.close()
    assert not _shm_path(shm_name).exists()


def test_attach_to_a_missing_segment_is_a_clear_error(shm_name: str) -> None:
    with pytest.raises(SegmentNotFound, match=f"no shared state block '{shm_name}'") as e:
        SharedState.attach(shm_name)
    assert isinstance(e.value, FileNotFoundError)


def _raw_segment(name: str, size: int, words: dict[str, int]) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name, create=True, size=size)
    for field, value in words.items():
        struct.pack_into("@q", shm.buf, FIELDS[field].offset, value)
    return shm


_GOOD = {"magic": ss.MAGIC, "layout_version": ss.LAYOUT_VERSION, "total_size": ss.layout_size(3), "n_peers": 3,
         "self_slot": 0}


@pytest.mark.parametrize(
    ("size", "words", "message"),
    [
        (ss.layout_size(3), {}, "bad magic"),
        (ss.layout_size(3), {**_GOOD, "magic": 12345}, "bad magic"),
        (ss.layout_size(3), {**_GOOD, "layout_version": 99}, "layout version 99"),
        (ss.layout_size(3), {**_GOOD, "n_peers": 17}, "n_peers 17 does not fit"),
        (ss.layout_size(3), {**_GOOD, "total_size": 4096}, "size mismatch"),
        (ss.layout_size(3), {**_GOOD, "self_slot": 3}, "self_slot 3"),
        (64, {}, "smaller than a state block header"),
    ],
    ids=["zeros", "magic", "version", "short", "size", "self-slot", "tiny"],
)
def test_attach_rejects_a_foreign_segment(shm_name: str, size: int, words: dict[str, int],
                                          message: str) -> None:
    shm = _raw_segment(shm_name, size, words)
    try:
        with pytest.raises(LayoutMismatch, match=message):
            SharedState.attach(shm_name)
        assert _shm_path(shm_name).exists()  # a failed attach never removes anything
    finally:
        shm.close()
        shm.unlink()


def test_close_and_unlink_are_idempotent(shm_name: str) -> None:
    with SharedState.create(shm_name, 2, 0) as st:
        st.unlink()
        st.unlink()
        assert st.read_member().current_term == 0  # the mapping outlives the name
    assert st.closed
    st.close()
    assert not _shm_path(shm_name).exists()


def test_the_block_always_holds_max_members_peer_records() -> None:
    """A member added while the group runs needs a record without a new block: every block has
    MAX_MEMBERS records, initialised (watermark -1) whether a slot is used yet or not."""
    from node.core.membership import MAX_MEMBERS
    assert ss.PEER_RECORDS == MAX_MEMBERS
    assert ss.layout_size(1) == ss.layout_size(16) == ss.PEERS_OFFSET + ss.PEER_STRIDE * MAX_MEMBERS
    with pytest.raises(ValueError):
        ss.layout_size(MAX_MEMBERS + 1)
