"""Storage errors are store errors: ENOSPC/EDQUOT → DISK_FULL, EIO and others → DISK_ERROR,
on every write path, with a message naming the file, and a half-done append rolled back.

Why: a bare OSError escaping a write path (ENOSPC preallocating the next segment during the
new leader's NOOP) crash-looped the handler while its elector kept leading, so the group had a
leader that could not write and never failed over. Errors are injected by monkeypatching the
`os` functions the store calls (posix_fallocate, pwrite, pwritev, fdatasync, fsync, write).
"""

from __future__ import annotations

import errno
import logging
import os
import time

import pytest

from node.store import codec
from node.store.base import DiskError, DiskFull, StoreError
from node.store.layout import read_checkpoint
from node.store.reader import StoreReader
from node.store.segment_store import SegmentStore, StoreConfig
from node.store.term_vote import TermVoteFile

ENTRY = 48 + 20


def _cfg(path, **kw):
    kw.setdefault("data_file_size", 4096)
    kw.setdefault("index_file_size", 8 * 32)
    return StoreConfig(store_dir=str(path), **kw)


def _fail(e_no, times=None, real=None):
    """An os function that raises `e_no` (the first `times` calls, then calls `real`)."""
    calls = []

    def boom(*a, **kw):
        calls.append(1)
        if times is not None and len(calls) > times:
            return real(*a, **kw)
        raise OSError(e_no, os.strerror(e_no))
    return boom


def _fill_data_file(s):
    """Append until the next entry (even a NOOP) needs a new data file."""
    s.append_leader(b"x" * 20, 1)
    while 4096 - s.data.files[-1].wrote >= ENTRY + 8 + 48 + 8:
        s.append_leader(b"x" * 20, 1)
    s.append_leader(b"y" * 20, 1)


def _files_hold_nothing_past_the_end(s):
    """What recovery would find equals the ledger (no resurrectable bytes past the end)."""
    end, term = s.ledger_end_index, s.ledger_end_term
    s.close()
    s.open()
    assert (s.ledger_end_index, s.ledger_end_term) == (end, term)


@pytest.mark.parametrize("e_no,cls,code", [
    (errno.ENOSPC, DiskFull, "DISK_FULL"),
    (errno.EDQUOT, DiskFull, "DISK_FULL"),
    (errno.EIO, DiskError, "DISK_ERROR"),
])
def test_a_new_leaders_noop_on_a_full_disk_is_a_store_error_naming_the_file(tmp_path, monkeypatch, e_no, cls, code):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        _fill_data_file(s)
        end, wrote = s.ledger_end_index, s.data.wrote_position
        monkeypatch.setattr(os, "posix_fallocate", _fail(e_no))
        with pytest.raises(cls) as ei:
            s.append_leader(b"", 2, codec.MAGIC_NOOP)  # what the handler does on becoming leader
        assert ei.value.code_name == code
        assert str(tmp_path / "data" / f"{4096:020d}") in str(ei.value)
        assert (s.ledger_end_index, s.data.wrote_position) == (end, wrote)  # rolled back
        assert not any(p.name.endswith(".tmp") for p in (tmp_path / "data").iterdir())
        monkeypatch.undo()
        r = s.append_leader(b"", 2, codec.MAGIC_NOOP)  # space is back: it works
        assert r.index == end + 1
        _files_hold_nothing_past_the_end(s)
    finally:
        s.close()


def test_batch_append_that_fails_rolling_a_file_half_way_leaves_nothing_behind(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        s.append_batch_raw([b"a" * 100] * 5, 1)
        monkeypatch.setattr(os, "posix_fallocate", _fail(errno.ENOSPC))
        with pytest.raises(DiskFull, match="append of entries 5..54"):
            s.append_batch_raw([b"b" * 100] * 50, 1)  # crosses into a second data file
        assert s.ledger_end_index == 4
        monkeypatch.undo()
        _files_hold_nothing_past_the_end(s)
        assert s.ledger_end_index == 4
    finally:
        s.close()


@pytest.mark.parametrize("target", ["pwritev", "pwrite"])
def test_eio_writing_data_or_index_rolls_the_append_back(tmp_path, monkeypatch, target):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        s.append_leader(b"first", 1)
        # pwritev: the data; pwrite: the index record (once: the rollback's zeroing works)
        monkeypatch.setattr(os, target, _fail(errno.EIO, times=1, real=getattr(os, target)))
        with pytest.raises(DiskError) as ei:
            s.append_leader(b"second", 1)
        sub = "data" if target == "pwritev" else "index"
        assert str(tmp_path / sub) in str(ei.value) and ei.value.code_name == "DISK_ERROR"
        assert s.ledger_end_index == 0
        monkeypatch.undo()
        assert s.append_leader(b"third", 1).index == 1
        assert bytes(s.get(1).body) == b"third"
        _files_hold_nothing_past_the_end(s)
    finally:
        s.close()


@pytest.mark.parametrize("fast", [True, False])
def test_follower_append_failing_is_a_store_error_and_rolled_back(tmp_path, monkeypatch, fast):
    lead = SegmentStore(_cfg(tmp_path / "l"))
    lead.open()
    lead.append_batch_raw([b"e%d" % i for i in range(6)], 1)
    r = StoreReader(tmp_path / "l")
    blob, n, recs = r.get_run(0, 5, 6, 1 << 20)
    blob, recs = bytes(blob), bytes(recs)
    r.close()
    lead.close()
    f = SegmentStore(_cfg(tmp_path / "f"))
    f.open()
    try:
        monkeypatch.setattr(os, "pwrite", _fail(errno.ENOSPC, times=1, real=os.pwrite))
        with pytest.raises(DiskFull, match="follower append of entries 0..5"):
            f.append_follower(blob, recs if fast else b"")
        assert f.ledger_end_index == -1
        monkeypatch.undo()
        assert f.append_follower(blob, recs if fast else b"") == 5
        _files_hold_nothing_past_the_end(f)
    finally:
        f.close()


def test_index_file_roll_on_a_full_disk_rolls_back_the_data(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(8):  # index file 0 holds exactly 8 records
            s.append_leader(b"%d" % i, 1)
        wrote = s.data.wrote_position
        monkeypatch.setattr(os, "posix_fallocate", _fail(errno.ENOSPC))
        with pytest.raises(DiskFull, match=str(tmp_path / "index")):
            s.append_leader(b"8", 1)
        assert (s.ledger_end_index, s.data.wrote_position) == (7, wrote)
        monkeypatch.undo()
        _files_hold_nothing_past_the_end(s)
    finally:
        s.close()


def test_a_failed_fdatasync_stops_writes_until_the_store_is_reopened(tmp_path, monkeypatch):
    """After a failed fdatasync the kernel may have dropped the dirty pages and report success
    next time: nothing written before can be trusted, so the store refuses writes (the leader
    steps down, C5) until a restart recovers from what is really on disk."""
    s = SegmentStore(_cfg(tmp_path, flush_mode="sync"))
    s.open()
    try:
        s.append_leader(b"ok", 1)
        monkeypatch.setattr(os, "fdatasync", _fail(errno.EIO))
        assert s.write_error is None
        with pytest.raises(DiskError, match="flush"):
            s.append_leader(b"not durable", 1)
        assert isinstance(s.write_error, DiskError) and s.stats()["refusing_writes"] == 1
        monkeypatch.undo()
        with pytest.raises(DiskError, match="refuses writes until it is reopened"):
            s.append_leader(b"later", 1)
        with pytest.raises(DiskError):
            s.truncate(1)
        assert bytes(s.get(0).body) == b"ok"  # reads still work
        s.close()
        s.open()
        assert s.write_error is None
        assert s.append_leader(b"after restart", 1).index >= 1
    finally:
        s.close()


def test_truncate_failing_is_a_store_error_and_stops_writes(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for _i in range(12):
            s.append_leader(b"z" * 400, 1)
        monkeypatch.setattr(os, "pwrite", _fail(errno.EIO))  # zeroing the dropped tail
        with pytest.raises(DiskError, match=r"truncate\(3\)"):
            s.truncate(3)
        monkeypatch.undo()
        with pytest.raises(DiskError):
            s.append_leader(b"no", 1)
        assert s.generation % 2 == 0  # the fence is closed even on failure
    finally:
        s.close()


def test_checkpoint_on_a_full_disk_names_the_checkpoint_file(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        s.append_leader(b"a", 1)
        s.set_committed_index(0)
        monkeypatch.setattr(os, "write", _fail(errno.ENOSPC))
        with pytest.raises(DiskFull, match=str(tmp_path / "checkpoint")):
            s.checkpoint()
        monkeypatch.undo()
        assert not (tmp_path / "checkpoint.tmp").exists()
        s.checkpoint()
        assert read_checkpoint(tmp_path).committed_index == 0
    finally:
        s.close()


def test_flush_service_error_is_logged_and_kept_visible(tmp_path, monkeypatch, caplog):
    s = SegmentStore(_cfg(tmp_path, flush_interval_ms=5, checkpoint_interval_ms=5))
    s.open()
    try:
        monkeypatch.setattr(os, "fsync", _fail(errno.ENOSPC))  # the checkpoint's fsync
        with caplog.at_level(logging.ERROR, logger="dledger.store"):
            s.append_leader(b"a", 1)
            s.set_committed_index(0)
            deadline = time.monotonic() + 5
            while s.last_flush_error is None and time.monotonic() < deadline:
                time.sleep(0.005)
        assert isinstance(s.last_flush_error, DiskFull)
        assert "checkpoint" in str(s.last_flush_error)
        assert any("flush service" in r.getMessage() for r in caplog.records)
        monkeypatch.undo()
        deadline = time.monotonic() + 5
        while s.last_flush_error is not None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert s.last_flush_error is None  # cleared once a pass succeeds again
    finally:
        s.close()


def test_saving_the_term_vote_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    tv = TermVoteFile(tmp_path)
    tv.save(3, "n1")
    monkeypatch.setattr(os, "fsync", _fail(errno.ENOSPC))
    with pytest.raises(StoreError, match=str(tmp_path / "currterm")) as ei:
        tv.save(4, None)
    assert ei.value.code_name == "DISK_FULL"
    monkeypatch.undo()
    assert tv.current.term == 3 and TermVoteFile(tmp_path).current.term == 3
    assert not (tmp_path / "currterm.tmp").exists()


def test_open_on_a_failing_disk_is_a_store_error(tmp_path, monkeypatch):
    with SegmentStore(_cfg(tmp_path, flush_mode="sync")) as s:
        s.append_leader(b"a", 1)
    monkeypatch.setattr(os, "fdatasync", _fail(errno.EIO))
    with pytest.raises(DiskError, match="open"):
        SegmentStore(_cfg(tmp_path, flush_mode="sync")).open()


def test_a_rollback_that_fails_too_stops_writes_and_recovery_cuts_the_debris(tmp_path, monkeypatch):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        s.append_leader(b"first", 1)
        monkeypatch.setattr(os, "pwrite", _fail(errno.EIO))  # index record and the rollback's zeroing
        with pytest.raises(DiskError):
            s.append_leader(b"second", 1)
        monkeypatch.undo()
        with pytest.raises(DiskError, match="rollback"):
            s.append_leader(b"third", 1)
        s.close()
        s.open()  # recovery: the data entry without an index record past the end is the log's
        assert s.ledger_end_index in (0, 1)  # (recovery trusts the data list, never loses 0)
        assert bytes(s.get(0).body) == b"first"
        assert s.append_leader(b"third", 1).index == s.ledger_end_index
    finally:
        s.close()


def test_has_room_says_whether_one_more_data_file_fits(tmp_path) -> None:  # noqa: ANN001
    """What a handler that stepped down for DISK_FULL asks before standing again: free space
    for one more data and index file, from the file system (statvfs)."""
    import dataclasses

    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    small = SegmentStore(StoreConfig(str(tmp_path / "a"), data_file_size=1 << 16, index_file_size=1 << 12))
    small.open()
    try:
        assert small.has_room()
        # a data file bigger than the free space
        small.config = dataclasses.replace(small.config, data_file_size=free + (1 << 30))
        assert not small.has_room()
    finally:
        small.close()
