"""What GET and FETCH serve (`get_checked`): the same bytes as `get_raw`, every entry checked
against its index record and its body CRC, and any damage named by its entry so the handler
marks that range for repair (docs/store.md "Recovery": entries below the checkpoint may not
have been checked since the node opened)."""

from __future__ import annotations

import struct

import pytest

from node.store import codec
from node.store.base import CorruptEntry
from node.store.codec import HEADER_SIZE
from node.store.memory_store import MemoryStore
from node.store.segment_store import SegmentStore, StoreConfig


def _store(tmp_path, n=40, size=100):
    """A store of `n` entries (two terms, a NOOP-free run) in small data files, so runs end at
    file ends too."""
    s = SegmentStore(StoreConfig(store_dir=str(tmp_path / "s"), data_file_size=1 << 12,
                                 index_file_size=1 << 12))
    s.open()
    for i in range(n):
        s.append_leader(bytes([i]) * size, 1 if i < n // 2 else 2)
    return s


def _read_all(s, get, max_count, max_bytes):
    out, i = [], 0
    while i <= s.ledger_end_index:
        blob, n = get(i, max_count, max_bytes)
        assert n >= 1
        out.append((i, n, bytes(blob)))
        i += n
    return out


@pytest.mark.parametrize(("max_count", "max_bytes"), [(1, 1 << 20), (7, 1 << 20), (1000, 500), (1000, 1 << 20)])
def test_the_same_runs_as_get_raw(tmp_path, max_count, max_bytes):
    s = _store(tmp_path)
    try:
        checked = _read_all(s, s.get_checked, max_count, max_bytes)
        raw = _read_all(s, s.get_raw, max_count, max_bytes)
        assert b"".join(b for _i, _n, b in checked) == b"".join(b for _i, _n, b in raw)
        for i, n, blob in checked:
            assert n <= max_count
            assert n == 1 or len(blob) <= max_bytes
            assert [e.index for _o, e in codec.iter_entries(blob)] == list(range(i, i + n))
    finally:
        s.close()


def _flip_body(s, index):
    rec = s.index_record(index)
    f = s.data.find(rec.pos)
    f.mm[rec.pos - f.start + HEADER_SIZE + 3] ^= 0x40


def _rewrite_header_index(s, index):
    rec = s.index_record(index)
    f = s.data.find(rec.pos)
    struct.pack_into(">q", f.mm, rec.pos - f.start + codec.INDEX_OFFSET, index + 1000)


def _rewrite_header_term(s, index):
    rec = s.index_record(index)
    f = s.data.find(rec.pos)
    struct.pack_into(">q", f.mm, rec.pos - f.start + codec.TERM_OFFSET, 99)


@pytest.mark.parametrize("damage", [_flip_body, _rewrite_header_index, _rewrite_header_term])
@pytest.mark.parametrize("victim", [0, 5, 21, 39])
def test_damage_is_named_by_its_entry(tmp_path, damage, victim):
    s = _store(tmp_path)
    try:
        damage(s, victim)
        with pytest.raises(CorruptEntry, match=f"entry {victim}"):
            _read_all(s, s.get_checked, 1000, 1 << 20)
        if victim > 0:  # the entries before it are still served
            blob, n = s.get_checked(0, victim, 1 << 20)
            assert n == victim or [e.index for _o, e in codec.iter_entries(blob)][-1] < victim
    finally:
        s.close()


def test_the_memory_store_checks_the_same_way():
    m = MemoryStore()
    m.open()
    for _ in range(10):
        m.append_leader(b"x" * 50, 1)
    blob, n = m.get_checked(2, 5, 1 << 20)
    assert n == 5 and [e.index for _o, e in codec.iter_entries(blob)] == [2, 3, 4, 5, 6]
    m._entries[4] = m._entries[4][:-1] + bytes([m._entries[4][-1] ^ 1])  # entry 4's last body byte
    with pytest.raises(CorruptEntry):
        m.get_checked(2, 5, 1 << 20)


def test_files_recovery_did_not_walk_are_read_too(tmp_path):
    """After a clean stop the store reopens from its checkpoint without walking the files below
    it (docs/store.md "Recovery"): their entries are served, checked, byte for byte as before."""
    s = _store(tmp_path, n=120)
    before = _read_all(s, s.get_raw, 1000, 1 << 20)
    s.close()
    s = SegmentStore(StoreConfig(store_dir=str(tmp_path / "s"), data_file_size=1 << 12,
                                 index_file_size=1 << 12))
    s.open()
    try:
        assert len(s.data.files) > 3
        got = _read_all(s, s.get_checked, 1000, 1 << 20)
        assert b"".join(b for _i, _n, b in got) == b"".join(b for _i, _n, b in before)
    finally:
        s.close()


def test_the_scrub_goes_on_after_retention_deletes_the_file_it_just_finished(tmp_path):
    """Retention deletes only what the scrub checked; when the scrub had just finished a file and
    retention deleted exactly that file, the scrub's next entry became the log's first and its
    continuity check still looked for the deleted file's end: a healthy leader called its own
    first entry damaged and stopped (seen in the full-disk retention test)."""
    s = _store(tmp_path, n=120)
    s.set_committed_index(s.ledger_end_index)
    s.close()
    cfg = StoreConfig(store_dir=str(tmp_path / "s"), data_file_size=1 << 12, index_file_size=1 << 12)
    s = SegmentStore(cfg)
    s.open()
    try:
        assert s.unchecked_end >= 0  # below the checkpoint: left to the scrub
        second = s.data.files[1].start
        while s.scrub_step(1 << 20):  # one file a step: stop where the second file begins
            if s.index_record(s._scrub_next).pos == second:
                break
        assert s.index_record(s._scrub_next).pos == second
        assert s.delete_before(s._scrub_next) == 1  # the first file goes
        s.scrub()  # the rest, from the new first entry: no damage
        assert s.unchecked_end == -1
    finally:
        s.close()
