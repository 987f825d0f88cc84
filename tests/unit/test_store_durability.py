"""flush_mode=sync really is durable: a power loss right after an acknowledged append (or a
truncation) finds on disk what the store answered.

* a segment file created, renamed into place or deleted is only durable once its directory
  is fsynced;
* a truncation's zeroed range must reach the disk, or a power loss brings the truncated
  (old-term) entries back behind a shorter rewrite;
* the checkpoint (what recovery trusts to refuse cutting committed entries) is kept current.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node.store.layout import read_checkpoint
from node.store.segment_store import SegmentStore, StoreConfig


def _cfg(path, **kw):
    kw.setdefault("flush_mode", "sync")
    return StoreConfig(store_dir=str(path), data_file_size=4096, index_file_size=8 * 32, **kw)


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def synced(monkeypatch):
    """Record the path of every fd passed to os.fsync / os.fdatasync, in call order."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd):
        calls.append(("fsync", _path_of(fd)))
        return real_fsync(fd)

    def fdatasync(fd):
        calls.append(("fdatasync", _path_of(fd)))
        return real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def test_sync_mode_fsyncs_the_directory_after_creating_and_deleting_segments(tmp_path, synced):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        data, index = str(tmp_path / "data"), str(tmp_path / "index")
        synced.clear()
        s.append_leader(b"a" * 100, 1)  # creates data file 0 and index file 0
        assert ("fsync", data) in synced and ("fsync", index) in synced
        for _ in range(40):
            s.append_leader(b"b" * 400, 1)  # rolls several data and index files
        assert len(s.data.files) > 2 and len(s.index.files) > 2
        synced.clear()
        s.truncate(3)  # deletes every file but the first of each list
        assert synced.count(("fsync", data)) >= 1 and synced.count(("fsync", index)) >= 1
        assert not any(Path(p).exists() for p in (data + f"/{4096:020d}", index + f"/{256:020d}"))
    finally:
        s.close()


def test_async_mode_does_not_fsync_directories_on_the_append_path(tmp_path, synced):
    s = SegmentStore(_cfg(tmp_path, flush_mode="async", flush_interval_ms=10_000))
    s.open()
    try:
        synced.clear()
        for _ in range(20):
            s.append_leader(b"b" * 400, 1)
        assert not synced
    finally:
        s.close()


def test_truncate_in_sync_mode_makes_the_zeroed_range_durable(tmp_path, synced):
    s = SegmentStore(_cfg(tmp_path))
    s.open()
    try:
        for i in range(6):
            s.append_leader(b"entry-%d" % i * 20, 1)  # all in data file 0 / index file 0
        synced.clear()
        s.truncate(2)  # zeroes the tail of both files, deletes nothing
        data0, index0 = str(tmp_path / "data" / f"{0:020d}"), str(tmp_path / "index" / f"{0:020d}")
        assert ("fdatasync", data0) in synced and ("fdatasync", index0) in synced
        # and the zeroes are what is on disk (read through a fresh descriptor)
        pos = s.data.wrote_position
        with open(data0, "rb") as fh:
            fh.seek(pos)
            assert fh.read(200) == bytes(200)
    finally:
        s.close()


def test_sync_mode_keeps_the_checkpoint_current(tmp_path):
    s = SegmentStore(_cfg(tmp_path, checkpoint_interval_ms=20))
    s.open()
    try:
        for i in range(5):
            s.append_leader(b"%d" % i, 1)
        s.set_committed_index(3)
        deadline = time.monotonic() + 5
        while read_checkpoint(tmp_path).committed_index != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_checkpoint(tmp_path).committed_index == 3  # without waiting for close()
    finally:
        s.close()


def test_open_in_sync_mode_makes_the_recovered_files_durable(tmp_path, synced):
    with SegmentStore(_cfg(tmp_path, flush_mode="async")) as s:
        for _ in range(10):
            s.append_leader(b"c" * 400, 1)
    synced.clear()
    with SegmentStore(_cfg(tmp_path)) as s:
        datafiles = {str(f.path) for f in s.data.files}
        assert datafiles <= {p for op, p in synced if op == "fdatasync"}


def test_sync_mode_creates_the_generation_file_durably(tmp_path, synced):
    with SegmentStore(_cfg(tmp_path)):
        pass
    i = synced.index(("fsync", str(tmp_path / "generation.tmp")))
    assert ("fsync", str(tmp_path)) in synced[i + 1:]
