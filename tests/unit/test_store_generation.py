"""The store generation fence (docs/store.md "Readers in other processes", docs/contracts.md C1).

A truncation deletes segment files and later appends re-create them under the same names. A
long-lived reader (dispatcher, ack checker, dump) that still maps the old inode would read the
truncated, old-term entries with valid-looking records: COMPARE succeeds on a stale term and a
follower ends up with different committed entries. These tests pin the fence that prevents it.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from node.store import codec
from node.store.base import StoreError
from node.store.decoder import STALE_ERROR, StoreDecoder
from node.store.generation import GENERATION_FILE, GenerationCounter, GenerationView
from node.store.memory_store import MemoryStore
from node.store.mmap_file import MappedFileList
from node.store.reader import StaleRead, StoreReader
from node.store.segment_store import SegmentStore, StoreConfig


def _cfg(path, **kw):
    # 8 index records per index file; ~500-byte entries: 8 per 4 KiB data file.
    return StoreConfig(store_dir=str(path), data_file_size=4096, index_file_size=8 * 32, **kw)


def _old(i):
    return b"T1-old-%02d" % i + b"x" * 443


def _new(i):
    return b"T2-new-%02d" % i + b"y" * 150


def _bodies(blob):
    return [(e.index, e.term, bytes(e.body[:9])) for _o, e in codec.iter_entries(blob)]


def _truncate_and_rewrite(s):
    """Term 1 entries 0..11 (data/index file 1 hold 8..11); truncate(6) deletes both files;
    term-2 entries 6..13 re-create them under the same names."""
    s.truncate(6)
    for i in range(6, 14):
        s.append_leader(_new(i), 2)


def test_reader_never_serves_a_segment_a_truncation_replaced(tmp_path):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(12):
            s.append_leader(_old(i), 1)
        r = StoreReader(tmp_path)
        g1 = s.generation
        r.begin(g1)
        assert r.term_at(9) == 1  # maps index/data file 1 (the old inodes)
        r.validate(g1)

        _truncate_and_rewrite(s)
        g2 = s.generation
        assert g2 != g1 and g2 % 2 == 0

        # A read that started before the truncation cannot be used ...
        with pytest.raises(StaleRead):
            r.validate(g1)
        # ... and no read starts from the old snapshot any more.
        with pytest.raises(StaleRead):
            r.begin(g1)
        # From the new snapshot on, only the new files are read (one begin() suffices).
        r.begin(g2)
        assert r.term_at(9) == 2
        blob, n, recs = r.get_run(8, s.ledger_end_index, 4, 1 << 20)
        r.validate(g2)
        assert _bodies(blob) == [(i, 2, b"T2-new-%02d" % i) for i in range(8, 8 + n)]
        assert [codec.INDEX.unpack_from(recs, k * 32)[4] for k in range(n)] == [2] * n
        r.close()
    finally:
        s.close()


def test_a_destructive_change_is_odd_while_it_happens_and_fences_readers(tmp_path):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(12):
            s.append_leader(_old(i), 1)
        seen = []
        real = s.data.set_wrote_position

        def spy(*a, **kw):
            seen.append(GenerationView(tmp_path).read())
            return real(*a, **kw)

        s.data.set_wrote_position = spy
        before = s.generation
        s.truncate(6)
        assert seen and all(g % 2 == 1 for g in seen)
        assert s.generation == before + 2  # one odd..even transition, however many files went
        s.data.set_wrote_position = real
        # Appends and retention (front files only: their names never come back) do not move it.
        g = s.generation
        for i in range(6, 40):
            s.append_leader(_new(i), 2)
        s.set_committed_index(39)
        assert s.delete_before(30) > 0
        assert s.generation == g
    finally:
        s.close()


def test_open_moves_the_generation_and_an_older_store_starts_at_zero(tmp_path):
    with SegmentStore(_cfg(tmp_path)) as s:
        s.append_leader(b"x", 1)
        g = s.generation
    os.unlink(tmp_path / GENERATION_FILE)  # a store written before the fence existed
    assert GenerationView(tmp_path).read() == 0
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.generation == 2 and s.ledger_end_index == 0
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.generation == 4
    assert g % 2 == 0


def test_a_crash_mid_change_leaves_an_odd_counter_that_the_next_open_makes_even(tmp_path):
    c = GenerationCounter(tmp_path)
    c.begin_change()  # and the process dies here
    assert c.value % 2 == 1
    c.close()
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.generation % 2 == 0 and s.generation > 1


def test_rollback_that_deletes_a_new_file_moves_the_generation(tmp_path, monkeypatch):
    """A failed append that created a file deletes it again; a reader may have mapped it and
    the next roll re-creates the name: the deletion is fenced like a truncation."""
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        s.append_leader(_old(0), 1)
        g = s.generation
        real = s.index._new_file
        calls = []

        def index_roll_fails(start):  # the data file of the entry is created, the index file is not
            calls.append(start)
            raise OSError(5, "Input/output error")

        for i in range(1, 8):
            s.append_leader(_old(i), 1)  # data file 0 full: the next entry rolls the data file
        g = s.generation
        monkeypatch.setattr(s.index, "_new_file", index_roll_fails)
        with pytest.raises(StoreError, match="Input/output error") as ei:
            s.append_leader(_old(8), 1)
        assert ei.value.code_name == "DISK_ERROR"
        assert calls and s.generation == g + 2
        assert s.ledger_end_index == 7 and len(s.data.files) == 1
        monkeypatch.setattr(s.index, "_new_file", real)
        s.append_leader(_old(8), 1)
        assert bytes(s.get(8).body) == _old(8)
    finally:
        s.close()


def test_refresh_maps_a_replaced_file_in_one_call(tmp_path):
    w = MappedFileList(tmp_path, 4096)
    f = w.last_file_for_append(0)
    f.write(0, b"old-inode")
    f.wrote = 9
    r = MappedFileList(tmp_path, 4096, readonly=True)
    r.refresh()
    assert bytes(r.read(0, 9)) == b"old-inode"
    w.set_wrote_position(0)
    w.delete_all()
    f = w.last_file_for_append(0)  # same name, new inode
    f.write(0, b"new-inode")
    r.refresh()  # ONE call
    assert len(r.files) == 1 and bytes(r.read(0, 9)) == b"new-inode"
    r.close()
    w.close()


def test_memory_store_generation_moves_on_truncate():
    m = MemoryStore()
    for i in range(5):
        m.append_leader(b"%d" % i, 1)
    g = m.generation
    assert g % 2 == 0
    m.truncate(3)
    assert m.generation == g + 2
    m.truncate(10)  # nothing dropped
    assert m.generation == g + 2


def test_decoder_rereads_a_chunk_when_the_store_was_truncated_under_it(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(12):
            s.append_leader(_old(i), 1)
        d = StoreDecoder(tmp_path)
        assert d.generation == s.generation and not d.generation_moved()
        real = d._decode_chunk
        fired = []

        def truncate_during_first_chunk(i, hi, body):
            rows = real(i, hi, body)
            if not fired:  # the writer truncates and rewrites right after the chunk was read
                fired.append(1)
                _truncate_and_rewrite(s)
            return rows

        monkeypatch.setattr(d, "_decode_chunk", truncate_during_first_chunk)
        rows = list(d.iter_rows(body=True))
        assert d.generation == s.generation
        assert [(r[0], r[1], r[8][:9]) for r in rows] == (
            [(i, 1, b"T1-old-%02d" % i) for i in range(6)] + [(i, 2, b"T2-new-%02d" % i) for i in range(6, 14)])
        assert all(r[7] is None for r in rows)
        d.close()
    finally:
        s.close()


def test_decoder_marks_rows_stale_when_the_store_keeps_changing(tmp_path, monkeypatch):
    with SegmentStore(_cfg(tmp_path)) as s:
        for i in range(4):
            s.append_leader(_old(i), 1)
    d = StoreDecoder(tmp_path)
    c = GenerationCounter(tmp_path)
    real = d._decode_chunk

    def always_moving(i, hi, body):
        rows = real(i, hi, body)
        c.begin_change()
        c.end_change()
        return rows

    monkeypatch.setattr(d, "_decode_chunk", always_moving)
    rows = list(d.iter_rows())
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert all(r[7] == STALE_ERROR for r in rows)
    d.close()
    c.close()


def test_follow_begin_drops_a_replaced_mapping_even_without_begin(tmp_path):
    """Every long-lived reader calls follow_begin on its loop: a mapping of a replaced file
    must not survive it (t2c: the dispatcher's reader kept it for ever, COMPARE succeeded on a
    stale term and a follower committed different entries)."""
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(12):
            s.append_leader(_old(i), 1)
        r = StoreReader(tmp_path)
        r.follow_begin(s.ledger_begin_index)
        assert r.term_at(10) == 1
        _truncate_and_rewrite(s)
        r.follow_begin(s.ledger_begin_index)  # begin unchanged; the generation moved
        assert r.term_at(10) == 2
        blob, n, _recs = r.get_run(8, s.ledger_end_index, 3, 1 << 20)
        assert _bodies(blob) == [(i, 2, b"T2-new-%02d" % i) for i in range(8, 8 + n)]
        r.close()
    finally:
        s.close()


def test_a_record_rewritten_during_a_read_is_a_stale_read_not_a_crash(tmp_path, monkeypatch):
    """A truncation can rewrite an index record between two reads of it inside one `get_run`
    (seen in the process test: a reader died on `struct.error: offset -8192 out of range`).
    Whatever the second read returns, the reader answers StaleRead, never an exception its
    role process would die of."""
    from node.store import reader as reader_mod

    with _store_and_reader(tmp_path, 20) as (_s, r):
        _blob, n, _recs = r.get_run(10, 19, 4, 1 << 20)  # a clean read first
        assert n >= 2
        real = reader_mod.INDEX
        calls = [0]

        class Rewritten:  # the record's pos moves to another file after the first reads
            size = real.size

            def unpack_from(self, buf, off=0):
                calls[0] += 1
                m, p, sz, i, t = real.unpack_from(buf, off)
                return (m, p - 8192, sz, i, t) if calls[0] > 2 else (m, p, sz, i, t)

        monkeypatch.setattr(reader_mod, "INDEX", Rewritten())
        with pytest.raises(StaleRead):
            r.get_run(10, 19, 4, 1 << 20)


@contextlib.contextmanager
def _store_and_reader(path, entries):
    """A segment store holding `entries` old-style entries of term 1, and a reader on it."""
    s = SegmentStore(_cfg(path))
    s.open()
    try:
        for i in range(entries):
            s.append_leader(_old(i), 1)
        r = StoreReader(path)
        try:
            yield s, r
        finally:
            r.close()
    finally:
        s.close()
