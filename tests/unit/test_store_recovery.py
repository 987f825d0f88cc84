"""Recovery at open (docs/store.md "Recovery (at open)"): torn tails are cut, index files are
rebuilt from data, and a damaged *committed* entry is never silently lost: it is cut with a repair
index recorded first (the node then does not vote until the range is fetched again: docs/store.md
"Repair from peers")."""

import os
import struct

import pytest

from node.store import codec
from node.store.base import CorruptEntry, StoreCorruptError
from node.store.layout import Checkpoint, read_checkpoint, write_checkpoint
from node.store.segment_store import SegmentStore, StoreConfig


def _cfg(path, **kw):
    return StoreConfig(store_dir=str(path), data_file_size=4096, index_file_size=256, **kw)


def _write(path, n=30, committed=-1, body=lambda i: b"body-%03d" % i * 5):
    with SegmentStore(_cfg(path)) as s:
        for i in range(n):
            s.append_leader(body(i), 1 + i // 10)
        s.set_committed_index(committed)
        positions = [s.index_record(i).pos for i in range(n)]
    return positions


def _patch(path, pos, data, file_size=4096):
    f = path / "data" / f"{pos - pos % file_size:020d}"
    with open(f, "r+b") as fh:
        fh.seek(pos % file_size)
        fh.write(data)


def test_clean_reopen_keeps_everything(tmp_path):
    _write(tmp_path, 30, committed=20)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index) == (0, 29, 20)


def test_bit_flip_in_uncommitted_tail_is_cut(tmp_path):
    pos = _write(tmp_path, 30, committed=20)
    _patch(tmp_path, pos[25] + codec.HEADER_SIZE + 2, b"\xff")
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 24
        assert s.ledger_end_term == 3
        # the cut bytes were zeroed: the next entry lands cleanly where 25 was
        r = s.append_leader(b"new", 3)
        assert (r.index, r.pos) == (25, pos[25])
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 25 and bytes(s.get(25).body) == b"new"


def test_bit_flip_in_committed_entry_is_cut_and_marked_for_repair(tmp_path):
    """The checkpoint's committed entry (28) and everything after it are walked at open."""
    pos = _write(tmp_path, 30, committed=28)
    _patch(tmp_path, pos[28] + codec.HEADER_SIZE + 2, b"\xff")
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index) == (27, 26)  # the entry before the cut stays replaceable
        assert s.repair_index == 29  # everything it may have acknowledged: the old end
        assert read_checkpoint(tmp_path).repair_index == 29  # durable before the cut
    with SegmentStore(_cfg(tmp_path)) as s:  # a restart keeps the mark
        assert s.repair_index == 29


def test_bit_flip_below_the_checkpoint_is_found_by_the_scrub_and_never_read(tmp_path):
    """Entries below the checkpoint's committed entry are not walked at open: the scrub finds
    the damage (as the one StoreCorruptError, naming the entry) and a read refuses it."""
    pos = _write(tmp_path, 30, committed=28)
    _patch(tmp_path, pos[25] + codec.HEADER_SIZE + 2, b"\xff")
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index, s.unchecked_end) == (29, 28, 27)
        with pytest.raises(CorruptEntry, match="CRC"):
            s.get(25)
        with pytest.raises(StoreCorruptError, match="committed entry 25 .*CRC"):
            s.scrub()
        assert s.unchecked_end == 27  # still unchecked: never reported as good


def test_scrub_checks_everything_below_the_checkpoint(tmp_path):
    """A clean store: the scrub walks from the first entry to the one before the checkpoint's
    committed entry, across file ends (BLANK markers), and then nothing is left unchecked."""
    _write(tmp_path, 30, committed=28, body=lambda i: bytes([i]) * 300)  # ~11 per file
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.unchecked_end == 27 and len(s.data.files) > 2
        steps = 0
        while s.scrub_step(400):  # ~1 entry per step
            steps += 1
        assert s.unchecked_end == -1 and steps >= 20


@pytest.mark.parametrize("damage", ["blank", "term"])
def test_scrub_finds_structural_damage(tmp_path, damage):
    """What the full walk at open used to find below the checkpoint, the scrub finds too: a
    file whose last entry is not followed by a BLANK marker, a term that goes backwards. (An
    index record that disagrees with an intact entry is rewritten instead: next test.)"""
    pos = _write(tmp_path, 30, committed=28, body=lambda i: bytes([i]) * 300)  # ~11 per file
    if damage == "blank":
        f0 = pos[0] // 4096
        last = max(i for i, p in enumerate(pos) if p // 4096 == f0)
        _patch(tmp_path, pos[last] + codec.HEADER_SIZE + 300, b"\x00" * 8)
        bad = last + 1
    else:
        _patch(tmp_path, pos[12] + 16, struct.pack(">q", 0))  # header term 0 after term 1
        bad = 12
    with SegmentStore(_cfg(tmp_path)) as s:
        with pytest.raises(StoreCorruptError, match=f"committed entry {bad} "):
            s.scrub()


def test_committed_corruption_outside_verified_files_is_caught_on_read(tmp_path):
    pos = _write(tmp_path, 30, committed=28, body=lambda i: bytes([i]) * 300)  # ~11 per file
    _patch(tmp_path, pos[1] + codec.HEADER_SIZE, b"\x07\x01")
    with SegmentStore(_cfg(tmp_path, recover_verify_files=1)) as s:
        assert s.ledger_end_index == 29  # structure is fine, the CRC is not checked at open here
        with pytest.raises(CorruptEntry, match="CRC"):
            s.get(1)


def test_torn_header_after_last_entry_is_cut(tmp_path):
    pos = _write(tmp_path, 10)
    end = pos[9] + codec.HEADER_SIZE + len(b"body-009" * 5)
    _patch(tmp_path, end, struct.pack(">ii", 1, 9999))  # half a header of a would-be entry 10
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 9
        s.append_leader(b"after", 1)
        assert bytes(s.get(10).body) == b"after"


def test_index_rebuilt_from_data(tmp_path):
    _write(tmp_path, 30)
    for p in (tmp_path / "index").iterdir():  # garble one record, delete a later file
        if p.name == f"{0:020d}":
            with open(p, "r+b") as fh:
                fh.seek(3 * 32)
                fh.write(b"\x07" * 32)
    files = sorted((tmp_path / "index").iterdir())
    files[-1].unlink()
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 29
        for i in range(30):
            assert s.get(i).index == i


def test_index_records_beyond_data_are_dropped(tmp_path):
    with SegmentStore(_cfg(tmp_path)) as s:
        s.append_leader_batch([b"x"] * 5, 1)
        xf = s.index.files[-1]
        # an index record written for an entry whose data never made it (crash between them)
        codec.INDEX.pack_into(xf.mm, 5 * 32, 1, 99999, 60, 5, 1)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 4
        r = s.append_leader(b"y", 1)
        assert r.index == 5 and s.index_record(5).pos == r.pos


def test_checkpoint_beyond_log_end_marks_for_repair(tmp_path):
    _write(tmp_path, 5)
    write_checkpoint(tmp_path, Checkpoint(committed_index=9, end_index=9))
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (4, 3, 9)


def test_truncate_zeroes_so_a_crash_cannot_resurrect(tmp_path):
    """Old entries 7..9 (term 4) truncated, 7' (term 3... never: terms only grow) written:
    whatever the new entries are, the dropped ones must not come back at recovery."""
    with SegmentStore(_cfg(tmp_path)) as s:
        s.append_leader_batch([b"a" * 40] * 7, 1)
        s.append_leader_batch([b"b" * 40] * 3, 4)
        s.truncate(7)
        s.append_leader(b"c" * 40, 4)  # same size as the dropped entry 7
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 7 and bytes(s.get(7).body) == b"c" * 40


def test_wrong_file_size_is_refused_with_a_clear_message(tmp_path):
    _write(tmp_path, 3)
    with pytest.raises(OSError, match="configured for 8192"):
        SegmentStore(StoreConfig(store_dir=str(tmp_path), data_file_size=8192, index_file_size=256)).open()


def test_checkpoint_file_is_atomic_and_readable(tmp_path):
    write_checkpoint(tmp_path, Checkpoint(3, 5))
    assert read_checkpoint(tmp_path) == Checkpoint(3, 5)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert os.path.getsize(tmp_path / "checkpoint") > 0


def test_bytes_past_the_end_are_zeroed_in_a_large_file(tmp_path):
    """Recovery zeroes from the log's end to the end of its last file (fallocate ZERO_RANGE
    for a range of 4 MiB or more, where the file system has it; else written zeroes): stale
    bytes a power loss left past the end can never be walked into later."""
    cfg = StoreConfig(store_dir=str(tmp_path), data_file_size=16 << 20, index_file_size=4096)
    with SegmentStore(cfg) as s:
        s.append_leader_batch([b"a" * 100] * 10, 1)
        end = s.data.wrote_position
    stale = end + (3 << 20) + 5
    with open(tmp_path / "data" / f"{0:020d}", "r+b") as fh:
        fh.seek(stale)
        fh.write(b"\x07" * 5000)
    with SegmentStore(cfg) as s:
        assert s.ledger_end_index == 9
        assert bytes(s.data.files[0].mm[end:]) == bytes((16 << 20) - end)
        assert bytes(s.get(9).body) == b"a" * 100
