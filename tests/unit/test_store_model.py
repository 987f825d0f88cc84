"""The segment store against a simple model (a list), over random operation sequences.

Tiny files (4 KiB data, 8-record index files) make rolling, BLANK padding and file deletion
happen constantly. The memory store runs the same sequences: both must equal the model.
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.store import codec
from node.store.base import IndexOutOfRange, StoreError
from node.store.memory_store import MemoryStore
from node.store.reader import StoreReader
from node.store.segment_store import SegmentStore, StoreConfig

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.binary(max_size=700)),
        st.tuples(st.just("batch"), st.lists(st.binary(max_size=300), min_size=1, max_size=12)),
        st.tuples(st.just("truncate"), st.integers(0, 10_000)),
        st.tuples(st.just("commit"), st.integers(0, 10_000)),
        st.tuples(st.just("term"), st.integers(1, 3)),
        st.tuples(st.just("reopen"), st.none()),
        st.tuples(st.just("follower"), st.lists(st.binary(max_size=300), min_size=1, max_size=6)),
    ),
    max_size=60,
)


def _cfg(path):
    return StoreConfig(store_dir=str(path), data_file_size=4096, index_file_size=32 * 8,
                       flush_interval_ms=5, recover_verify_files=100)


def _check(store, model, committed):
    if not model:
        assert store.ledger_end_index == -1
        return
    assert store.ledger_begin_index == 0
    assert store.ledger_end_index == len(model) - 1
    assert store.ledger_end_term == model[-1][0]
    assert store.committed_index == committed
    for i, (term, body) in enumerate(model):
        e = store.get(i)
        assert (e.index, e.term, bytes(e.body)) == (i, term, body)


def _check_reader(r, store, model):
    """A long-lived reader (another process's, created once) that starts each read at the
    store's published generation sees exactly the model: never a replaced file's bytes."""
    g = store.generation
    r.begin(g)
    seen = []
    while len(seen) < len(model):
        blob, _n, _recs = r.get_run(len(seen), len(model) - 1, 64, 1 << 20)
        seen.extend((e.index, e.term, bytes(e.body)) for _o, e in codec.iter_entries(blob))
    r.validate(g)
    assert seen == [(i, term, body) for i, (term, body) in enumerate(model)]


@given(seq=ops)
@settings(max_examples=150, deadline=None)
def test_segment_and_memory_store_match_model(tmp_path_factory, seq):
    path = tmp_path_factory.mktemp("store")
    seg = SegmentStore(_cfg(path))
    seg.open()
    reader = StoreReader(path)
    mem = MemoryStore()
    model: list[tuple[int, bytes]] = []
    committed, term = -1, 1
    try:
        for k, (op, arg) in enumerate(seq):
            # Unique bodies: a stale read of a replaced file must show as different bytes.
            if op == "append":
                arg = b"@%d:" % k + arg
            elif op in ("batch", "follower"):
                arg = [b"@%d.%d:" % (k, j) + b for j, b in enumerate(arg)]
            if op == "term":
                term = max(term, term + arg - 1)
            elif op == "append":
                for s in (seg, mem):
                    r = s.append_leader(arg, term)
                    assert r.index == len(model)
                model.append((term, arg))
            elif op == "batch":
                for s in (seg, mem):  # both batch entry points, on both stores
                    if k % 2:
                        rs = s.append_leader_batch(arg, term)
                        assert [r.index for r in rs] == list(range(len(model), len(model) + len(arg)))
                    else:
                        first, positions = s.append_batch_raw(arg, term)
                        assert first == len(model) and len(positions) == len(arg)
                model.extend((term, b) for b in arg)
            elif op == "follower":
                # encode on a scratch leader, push the raw bytes: positions must be re-stamped
                src = MemoryStore()
                for t, b in model:
                    src.append_leader(b, t)
                for b in arg:
                    src.append_leader(b, term)
                blob, n = src.get_raw(len(model), len(arg), 1 << 30)
                assert n == len(arg)
                for s in (seg, mem):
                    assert s.append_follower(blob) == len(model) + len(arg) - 1
                model.extend((term, b) for b in arg)
            elif op == "truncate":
                if not model:
                    continue
                i = arg % (len(model) + 1)
                if i <= committed:
                    for s in (seg, mem):
                        with pytest.raises(StoreError):
                            s.truncate(i)
                    continue
                for s in (seg, mem):
                    s.truncate(i)
                del model[i:]
            elif op == "commit":
                if model:
                    c = arg % len(model)
                    for s in (seg, mem):
                        s.set_committed_index(c)
                    committed = max(committed, c)
            elif op == "reopen":
                seg.close()
                seg = SegmentStore(_cfg(path))
                seg.open()
            _check(seg, model, committed)
            _check(mem, model, committed)
            _check_reader(reader, seg, model)
        seg.close()
        seg = SegmentStore(_cfg(path))
        seg.open()
        _check(seg, model, committed)
        if model:  # a reader in "another process" sees the same bytes
            r = StoreReader(path)
            from_reader, from_store, recs = [], [], []
            i = 0
            while i < len(model):  # runs may end at different places; the bytes may not differ
                blob, n, idx = r.get_run(i, len(model) - 1, 5, 1 << 20)
                assert 1 <= n <= 5 and len(idx) == 32 * n
                from_reader.append(bytes(blob))
                recs.append(bytes(idx))
                i += n
            i = 0
            while i < len(model):
                raw, n = seg.get_raw(i, 5, 1 << 20)
                from_store.append(bytes(raw))
                i += n
            assert b"".join(from_reader) == b"".join(from_store)
            assert b"".join(recs) == b"".join(bytes(seg.index.read(k * 32, 32)) for k in range(len(model)))
            r.close()
    finally:
        reader.close()
        seg.close()


def test_follower_append_must_be_end_plus_one(tmp_path):
    src = MemoryStore()
    for i in range(5):
        src.append_leader(b"b%d" % i, 1)
    with SegmentStore(_cfg(tmp_path)) as s:
        blob, _ = src.get_raw(1, 2, 1 << 20)
        with pytest.raises(StoreError):
            s.append_follower(blob)  # starts at 1, store is empty (needs 0)
        s.append_follower(src.get_raw(0, 3, 1 << 20)[0])
        assert s.ledger_end_index == 2
        with pytest.raises(StoreError):
            s.append_follower(src.get_raw(2, 1, 1 << 20)[0])  # duplicate of 2
        bad = bytearray(src.get_raw(3, 1, 1 << 20)[0])
        bad[-1] ^= 0xFF
        with pytest.raises(StoreError, match="CRC"):
            s.append_follower(bytes(bad))
        assert s.ledger_end_index == 2  # nothing written by the refused pushes


def test_reads_outside_the_log_are_errors(tmp_path):
    with SegmentStore(_cfg(tmp_path)) as s:
        with pytest.raises(IndexOutOfRange):
            s.get(0)
        s.append_leader(b"a", 1)
        for bad in (-1, 1, 10**12):
            with pytest.raises(IndexOutOfRange):
                s.get(bad)


def test_first_index_of_term_and_term_order(tmp_path):
    with SegmentStore(_cfg(tmp_path)) as s:
        for t, n in ((1, 3), (2, 4), (5, 2)):
            s.append_leader_batch([b"x"] * n, t)
        assert s.first_index_of_term(2, 6) == 3
        assert s.first_index_of_term(5, 8) == 7
        assert s.first_index_of_term(1, 2) == 0
        with pytest.raises(StoreError):
            s.append_leader(b"old", 4)  # a term below the ledger end term


def test_retention_deletes_whole_files_never_past_committed(tmp_path):
    with SegmentStore(_cfg(tmp_path)) as s:
        s.append_leader_batch([bytes(200)] * 100, 1)
        files_before = len(s.data.files)
        assert s.delete_before(80) == 0  # nothing committed yet
        s.set_committed_index(60)
        n = s.delete_before(80)
        assert n > 0 and len(s.data.files) == files_before - n
        begin = s.ledger_begin_index
        assert 0 < begin <= 61
        assert s.get(begin).index == begin and s.get(99).index == 99
        with pytest.raises(IndexOutOfRange):
            s.get(begin - 1)
    with SegmentStore(_cfg(tmp_path)) as s:  # recovery starts at the new begin
        assert s.ledger_begin_index == begin and s.ledger_end_index == 99


def test_sync_flush_mode_and_checkpoint(tmp_path):
    cfg = StoreConfig(store_dir=str(tmp_path), data_file_size=4096, index_file_size=256, flush_mode="sync")
    with SegmentStore(cfg) as s:
        s.append_leader_batch([b"abc"] * 10, 1)
        assert all(f.flushed == f.wrote for f in s.data.files)
        s.set_committed_index(7)
    text = (tmp_path / "checkpoint").read_text()
    assert "committedIndex=7" in text and "endIndex=9" in text


def test_large_random_workload_rolls_many_files(tmp_path):
    rnd = random.Random(7)
    with SegmentStore(_cfg(tmp_path)) as s:
        bodies = [rnd.randbytes(rnd.randrange(1, 1500)) for _ in range(400)]
        for i in range(0, 400, 10):
            s.append_leader_batch(bodies[i:i + 10], 1 + i // 100)
        assert len(s.data.files) > 50
        for i in rnd.sample(range(400), 50):
            assert bytes(s.get(i).body) == bodies[i]


@pytest.mark.parametrize("follower_file_size", [4096, 8192])
def test_follower_stores_leader_runs_fast_when_positions_match(tmp_path, follower_file_size, monkeypatch):
    """Pushed runs carry the leader's index records. Same file size → same positions → the
    follower copies data and index verbatim (fast path); a different size → per-entry path."""
    rnd = random.Random(3)
    leader = SegmentStore(_cfg(tmp_path / "l"))
    follower = SegmentStore(StoreConfig(store_dir=str(tmp_path / "f"), data_file_size=follower_file_size,
                                        index_file_size=32 * 8))
    fast = []
    orig = SegmentStore._append_follower_fast
    monkeypatch.setattr(SegmentStore, "_append_follower_fast",
                        lambda self, mv, recs, n: fast.append(orig(self, mv, recs, n)) or fast[-1])
    with leader, follower:
        for t in (1, 1, 2, 3):
            leader.append_leader_batch([rnd.randbytes(rnd.randrange(1, 900)) for _ in range(40)], t)
        r = StoreReader(tmp_path / "l")
        i = 0
        while i <= leader.ledger_end_index:
            blob, n, recs = r.get_run(i, leader.ledger_end_index, 7, 1 << 20)
            crc = codec.push_run_crc(recs, blob) if i % 2 else None  # with and without a run CRC
            assert follower.append_follower(blob, recs, crc) == i + n - 1
            i += n
        r.close()
        assert follower.ledger_end_index == leader.ledger_end_index == 159
        same_pos = []
        for k in range(160):
            a, b = leader.get(k), follower.get(k)
            assert (a.index, a.term, bytes(a.body)) == (b.index, b.term, bytes(b.body))
            same_pos.append(a.pos == b.pos)
        assert all(same_pos) == (follower_file_size == 4096)
    assert fast and all(fast) == (follower_file_size == 4096)
    with SegmentStore(StoreConfig(store_dir=str(tmp_path / "f"), data_file_size=follower_file_size,
                                  index_file_size=32 * 8)) as f2:  # and it recovers cleanly
        assert f2.ledger_end_index == 159


def test_fast_path_refuses_a_run_that_does_not_continue_the_log(tmp_path):
    with SegmentStore(_cfg(tmp_path / "l")) as leader, SegmentStore(_cfg(tmp_path / "f")) as f:
        leader.append_leader_batch([b"x" * 10] * 6, 1)
        r = StoreReader(tmp_path / "l")
        blob, n, recs = r.get_run(2, 5, 4, 1 << 20)
        with pytest.raises(StoreError):
            f.append_follower(blob, recs)  # starts at 2, the follower is empty
        assert f.ledger_end_index == -1
        r.close()
