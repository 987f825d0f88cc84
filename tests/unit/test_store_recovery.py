"""Recovery at open (SPEC §4): torn tails are cut, index files are rebuilt from data, and a
damaged *committed* entry is never silently lost: it is cut with a repair index recorded first
(the node then does not vote until the range is fetched again: docs/store.md "Repair from
peers")."""

import os
import struct

import pytest

from node.store import codec
from node.store.base import CorruptEntry
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
    pos = _write(tmp_path, 30, committed=28)
    _patch(tmp_path, pos[25] + codec.HEADER_SIZE + 2, b"\xff")
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index) == (24, 24)
        assert s.repair_index == 29  # everything it may have acknowledged: the old end
        assert read_checkpoint(tmp_path).repair_index == 29  # durable before the cut
    with SegmentStore(_cfg(tmp_path)) as s:  # a restart keeps the mark
        assert s.repair_index == 29


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
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (4, 4, 9)


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
