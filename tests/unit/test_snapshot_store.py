"""Snapshot files on disk (docs/snapshots.md "Layout") and the file-level ends of an install
("Install: the receiving side").

Pure file tests in tmp_path: take/commit/abort, retention, crash leftovers, damaged snapshots
skipped with a warning, chunked receive with resume, refusal of bad chunks and bad bytes.
Crash points are simulated by copying the store directory just before every fsync, rename,
unlink and rmdir a commit or an install makes ("the disk as a process killed right here
leaves it"), then opening each copy: a snapshot-named directory must always be complete.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from node.statemachine import snapshot_store as ss
from node.statemachine.snapshot_store import (
    MAX_CHUNK_BYTES,
    Snapshot,
    SnapshotChecksumMismatch,
    SnapshotChunkError,
    SnapshotError,
    SnapshotExists,
    SnapshotIncomplete,
    SnapshotIOError,
    SnapshotMeta,
    SnapshotMetaError,
    SnapshotNotFound,
    SnapshotStore,
    SnapshotStoreBusy,
    read_chunk,
)

SM = "kv"


def take(store: SnapshotStore, index: int, term: int, data: bytes) -> Snapshot:
    with store.begin(index, term, SM) as p:
        p.file.write(data)
    assert p.result is not None
    return p.result


def names(store: SnapshotStore) -> list[str]:
    return [s.path.name for s in store.list()]


def send_all(src: Snapshot, rx, chunk: int) -> None:
    off = rx.received_bytes()
    while off < src.size:
        off = rx.write_chunk(off, read_chunk(src, off, chunk))


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(tmp_path / "n0")
    yield s
    s.close()


# ---- taking a snapshot -------------------------------------------------------------------

def test_commit_publishes_data_and_meta_under_index_term_name(store):
    data = os.urandom(3 * 1024 * 1024 + 17)  # more than the 1 MiB write buffer
    snap = take(store, 1234, 5, data)
    assert snap.path == store.dir / "00000000000000001234-00000000000000000005"
    assert snap.data_path.read_bytes() == data
    meta = json.loads((snap.path / "meta.json").read_bytes())
    assert meta["last_index"] == 1234 and meta["last_term"] == 5
    assert meta["size"] == len(data) and meta["crc32c"] == crc32c(data)
    assert meta["format"] == 1 and meta["state_machine"] == SM
    datetime.fromisoformat(meta["created"].replace("Z", "+00:00"))
    assert [p.name for p in store.dir.iterdir() if p.name.startswith(".tmp-")] == []
    assert store.newest_valid() == snap and store.list() == [snap]


def test_commit_uses_the_streamed_checksum_without_rereading(store, monkeypatch):
    def no_reread(*a, **k):
        raise AssertionError("commit re-read the data to checksum it")

    monkeypatch.setattr(ss, "crc_of_fd", no_reread)
    snap = take(store, 1, 1, b"abc" * 100_000)
    assert snap.meta.crc32c == crc32c(b"abc" * 100_000)


def test_commit_fsyncs_data_meta_tmp_dir_then_the_parent_after_rename(store, monkeypatch):
    real = os.fsync
    seen: list[tuple[str, bool]] = []
    final = store.dir / "00000000000000000007-00000000000000000002"

    def fsync(fd):
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), final.exists()))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    take(store, 7, 2, b"x" * 10)
    paths = [Path(p) for p, _ in seen]
    kinds = [p.name if p.parent.name.startswith(".tmp-take") else p for p in paths]
    assert kinds[:4] == ["data", "meta.json", paths[2], store.dir], seen
    assert paths[2].name.startswith(".tmp-take-")
    assert seen[3][1], "the parent must be fsynced after the rename"


def test_context_manager_aborts_on_exception_and_leaves_nothing(store):
    with pytest.raises(RuntimeError), store.begin(1, 1, SM) as p:
        p.file.write(b"half")
        raise RuntimeError("state machine failed")
    assert store.list() == [] and list(store.dir.glob(".tmp-*")) == []
    assert not p.path.exists()


def test_abort_is_idempotent_and_commit_after_abort_refused(store):
    p = store.begin(3, 1, SM)
    p.write(b"data")
    p.abort()
    p.abort()
    with pytest.raises(SnapshotError, match="already aborted"):
        p.commit()
    assert store.list() == []


def test_state_machine_closing_its_writer_still_commits_fsynced_data(store):
    p = store.begin(4, 1, SM)
    p.file.write(b"hello")
    p.file.close()  # e.g. a TextIOWrapper around it was garbage-collected
    snap = p.commit()
    assert snap.data_path.read_bytes() == b"hello" and snap.meta.crc32c == crc32c(b"hello")


def test_disk_full_while_writing_is_a_snapshot_io_error_and_nothing_published(store, monkeypatch):
    p = store.begin(5, 1, SM)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(SnapshotIOError) as ei:
        p.file.write(b"x" * (2 << 20))  # past the buffer: reaches the raw write
    assert ei.value.code_name == "DISK_FULL" and "\n" not in str(ei.value)
    monkeypatch.undo()
    with pytest.raises(SnapshotIOError):  # swallowed by user code: commit still refuses
        p.commit()
    assert store.list() == [] and not p.path.exists()


def test_begin_refuses_an_existing_snapshot_before_any_write(store):
    take(store, 9, 2, b"a")
    with pytest.raises(SnapshotExists, match="00000000000000000009-00000000000000000002"):
        store.begin(9, 2, SM)


def test_commit_replaces_a_damaged_snapshot_of_the_same_position(store):
    old = take(store, 9, 2, b"good")
    (old.path / "meta.json").write_bytes(b"{garbage")
    snap = take(store, 9, 2, b"again")
    assert store.newest_valid() == snap and snap.data_path.read_bytes() == b"again"


# ---- retention ---------------------------------------------------------------------------

def test_keeps_the_newest_max_snapshots_kept(tmp_path):
    with SnapshotStore(tmp_path, max_snapshots_kept=2) as s:
        for i in range(1, 5):
            take(s, i * 10, 1, bytes([i]) * 10)
        assert names(s) == [f"{30:020d}-{1:020d}", f"{40:020d}-{1:020d}"]


def test_damaged_snapshots_do_not_count_toward_the_quota(tmp_path):
    with SnapshotStore(tmp_path, max_snapshots_kept=2) as s:
        take(s, 1, 1, b"one")
        take(s, 2, 1, b"two")
        bad = take(s, 3, 1, b"three")
        bad.data_path.write_bytes(b"th")  # truncated: not intact
        take(s, 4, 1, b"four")
        kept = [p.name for p in sorted(s.dir.iterdir()) if not p.name.startswith(".")]
        assert kept == [f"{i:020d}-{1:020d}" for i in (2, 3, 4)]


def test_the_snapshot_just_committed_is_never_pruned(tmp_path, caplog):
    with SnapshotStore(tmp_path, max_snapshots_kept=1) as s:
        take(s, 5, 1, b"five")
        newer = take(s, 9, 1, b"nine")
        newer.data_path.write_bytes(b"NINE")  # same size, wrong bytes: counts as intact
        older = take(s, 7, 1, b"seven")
        assert names(s) == [older.path.name, newer.path.name]
        assert s.newest_valid() == older
        assert newer.path.name in caplog.text


# ---- open: leftovers and damage ----------------------------------------------------------

def test_open_removes_tmp_leftovers_and_keeps_a_partial_install(tmp_path):
    d = tmp_path / "snapshots"
    (d / ".tmp-take-00000000000000000001-00000000000000000001-abc").mkdir(parents=True)
    (d / ".tmp-take-00000000000000000001-00000000000000000001-abc" / "data").write_bytes(b"ha")
    (d / ".tmp-del-00000000000000000000-00000000000000000001-x").mkdir()
    (d / ".tmp-stray-file").write_bytes(b"")
    (d / ".install").mkdir()
    with SnapshotStore(tmp_path) as s:
        assert sorted(p.name for p in s.dir.iterdir()) == [".install", ".lock"]
        assert s.newest_valid() is None


def _truncate(s: Snapshot) -> None:
    with open(s.data_path, "r+b") as f:
        f.truncate(s.size - 1)


def _flip_byte(s: Snapshot) -> None:
    b = bytearray(s.data_path.read_bytes())
    b[len(b) // 2] ^= 0x01
    s.data_path.write_bytes(bytes(b))


def _set_meta(field: str, value: object):
    def damage(s: Snapshot) -> None:
        m = json.loads((s.path / "meta.json").read_bytes())
        m[field] = value
        (s.path / "meta.json").write_text(json.dumps(m))
    return damage


DAMAGE = {
    "data truncated": _truncate,
    "a byte flipped": _flip_byte,
    "data deleted": lambda s: s.data_path.unlink(),
    "meta.json deleted": lambda s: (s.path / "meta.json").unlink(),
    "meta.json garbage": lambda s: (s.path / "meta.json").write_bytes(b"\x00\xffnot json"),
    "meta.json empty": lambda s: (s.path / "meta.json").write_bytes(b""),
    "meta.json a list": lambda s: (s.path / "meta.json").write_bytes(b"[1, 2]"),
    "meta index disagrees with name": _set_meta("last_index", 99),
    "meta negative size": _set_meta("size", -1),
    "meta from a newer format": _set_meta("format", 2),
    "meta size as a string": _set_meta("size", "10"),
}


@pytest.mark.parametrize("how", DAMAGE)
def test_newest_valid_skips_a_damaged_snapshot_for_the_next_older_with_a_warning(tmp_path, caplog,
                                                                                   how):
    with SnapshotStore(tmp_path) as s:
        good = take(s, 10, 1, os.urandom(5000))
        bad = take(s, 20, 2, os.urandom(5000))
        DAMAGE[how](bad)
    caplog.set_level(logging.WARNING, logger="dledger.snapshot")
    with SnapshotStore(tmp_path) as s:  # as at a node's start
        assert s.newest_valid() == good
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad.path.name in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_the_store_never_serves_a_damaged_snapshot(tmp_path, caplog):
    with SnapshotStore(tmp_path) as s:
        snaps = [take(s, i, 1, os.urandom(100)) for i in (1, 2, 3)]
        for snap, how in zip(snaps, ("data truncated", "a byte flipped", "meta.json garbage"),
                             strict=True):
            DAMAGE[how](snap)
        assert s.newest_valid() is None
    assert caplog.text.count("skipping damaged snapshot") == 3


def test_size_only_verification_misses_a_flipped_byte_as_documented(store):
    snap = take(store, 1, 1, b"abcdef")
    _flip_byte(snap)
    assert store.newest_valid(verify_checksum=False) == snap
    assert store.newest_valid() is None


# ---- simulated crashes -------------------------------------------------------------------

def record_crash_images(monkeypatch, store_dir: Path, out: Path) -> list[Path]:
    """Copy ``store_dir`` just before every fsync, rename, unlink and rmdir: each copy is what
    a process killed at that point leaves (the page cache keeps what it wrote)."""
    images: list[Path] = []
    real = {n: getattr(os, n) for n in ("fsync", "rename", "unlink", "rmdir")}

    def image() -> None:
        dst = out / f"img{len(images):03d}"
        shutil.copytree(store_dir, dst, symlinks=True)
        images.append(dst)

    def hook(name):
        def call(*a, **k):
            image()
            return real[name](*a, **k)
        return call

    for n in real:
        monkeypatch.setattr(os, n, hook(n))
    return images


def assert_crash_safe(image: Path, allowed: set[str], caplog) -> str | None:
    """Open a crash image like a restarting node: every snapshot-named directory is complete,
    nothing damaged is ever seen, and the newest valid one is one of ``allowed``."""
    caplog.clear()
    with SnapshotStore(image) as s:
        assert not list(s.dir.glob(".tmp-*"))
        for snap_dir in (p for p in s.dir.iterdir() if ss.parse_dir_name(p.name)):
            s.verify(s.load(snap_dir))  # raises if a named directory is incomplete
        newest = s.newest_valid()
    assert "damaged" not in caplog.text
    name = newest.path.name if newest else None
    assert name in allowed, f"{image}: newest valid is {name}"
    return name


def test_a_crash_at_any_step_of_commit_and_prune_leaves_old_or_new(tmp_path, monkeypatch, caplog):
    with SnapshotStore(tmp_path / "n", max_snapshots_kept=1) as s:
        old = take(s, 10, 1, os.urandom(4000))
        images = record_crash_images(monkeypatch, tmp_path / "n", tmp_path / "crash")
        new = take(s, 20, 1, os.urandom(4000))
        monkeypatch.undo()
    assert len(images) >= 8  # data, meta, dir, rename, parent, prune's rename/fsync/unlinks
    seen = {assert_crash_safe(i, {old.path.name, new.path.name}, caplog) for i in images}
    assert seen == {old.path.name, new.path.name}


def test_a_crash_at_any_step_of_an_install_leaves_old_or_new(tmp_path, monkeypatch, caplog):
    with SnapshotStore(tmp_path / "leader") as leader:
        src = take(leader, 50, 3, os.urandom(10_000))
    with SnapshotStore(tmp_path / "f", max_snapshots_kept=1) as s:
        old = take(s, 10, 1, b"old state")
        images = record_crash_images(monkeypatch, tmp_path / "f", tmp_path / "crash")
        rx = s.receive(src.meta)
        send_all(src, rx, 3000)
        rx.install()
        monkeypatch.undo()
    seen = {assert_crash_safe(i, {old.path.name, src.path.name}, caplog) for i in images}
    assert seen == {old.path.name, src.path.name}


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "match"), [
    ((-1, 1, SM), "last_index=-1"),
    ((1, -2, SM), "last_term=-2"),
    ((1 << 63, 1, SM), "out of range"),
    (("1", 1, SM), "last_index must be an integer"),
    ((True, 1, SM), "last_index must be an integer"),
    ((1, 1, ""), "state_machine is empty"),
    ((1, 1, "a\nb"), "not printable"),
    ((1, 1, 7), "state_machine must be a string"),
])
def test_begin_refuses_bad_positions_and_names_with_one_line(store, args, match):
    with pytest.raises(SnapshotMetaError, match=match) as ei:
        store.begin(*args)
    assert "\n" not in str(ei.value)
    assert list(store.dir.glob(".tmp-*")) == []


@pytest.mark.parametrize(("raw", "match"), [
    (b"{", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
    (b"3", "JSON object"),
    (b'{"last_index": 1}', "lacks last_term"),
    (b'{"last_index": 1, "last_term": 1, "size": 1, "crc32c": 4294967296, "state_machine": "kv",'
     b' "created": "", "format": 1}', "crc32c=4294967296"),
    (b'{"last_index": 1, "last_term": 1, "size": 1.5, "crc32c": 1, "state_machine": "kv",'
     b' "created": "", "format": 1}', "size must be an integer"),
])
def test_meta_parsing_errors_are_one_line_snapshot_meta_errors(raw, match):
    with pytest.raises(SnapshotMetaError, match=match) as ei:
        SnapshotMeta.from_json(raw, "peer n1")
    assert "\n" not in str(ei.value) and str(ei.value).startswith("peer n1: ")


def test_meta_round_trips_through_json():
    m = SnapshotMeta(5, 2, 100, 0xDEADBEEF, SM, "2024-01-01T00:00:00.000Z")
    assert SnapshotMeta.from_json(m.to_json()) == m
    assert SnapshotMeta.from_dict({**json.loads(m.to_json()), "future_field": 1}) == m


def test_max_snapshots_kept_must_be_positive(tmp_path):
    with pytest.raises(SnapshotError, match="max_snapshots_kept"):
        SnapshotStore(tmp_path, max_snapshots_kept=0)


def test_one_writer_per_store_and_readers_cannot_write(tmp_path):
    with SnapshotStore(tmp_path) as w:
        snap = take(w, 1, 1, b"x")
        with pytest.raises(SnapshotStoreBusy):
            SnapshotStore(tmp_path)
        r = SnapshotStore(tmp_path, writable=False)
        assert r.newest_valid() == snap
        with pytest.raises(SnapshotError, match="read-only"):
            r.begin(2, 1, SM)
        with pytest.raises(SnapshotError, match="read-only"):
            r.receive(snap.meta)
    SnapshotStore(tmp_path).close()  # released at close


def test_open_data_and_read_chunk_of_a_pruned_snapshot(tmp_path):
    with SnapshotStore(tmp_path, max_snapshots_kept=1) as s:
        first = take(s, 1, 1, b"first state")
        f = s.open_data(first)
        take(s, 2, 1, b"second")  # prunes `first`
        assert f.read() == b"first state"  # an open file survives pruning
        f.close()
        with pytest.raises(SnapshotNotFound):
            s.open_data(first)
        with pytest.raises(SnapshotNotFound):
            read_chunk(first, 0, 10)


# ---- the sending side --------------------------------------------------------------------

def test_read_chunk_is_bounded_and_ends_with_empty_bytes(store):
    data = os.urandom(2500)
    snap = take(store, 1, 1, data)
    assert read_chunk(snap, 0, 1000) == data[:1000]
    assert read_chunk(snap, 2000, 1000) == data[2000:]
    assert read_chunk(snap, 2500, 1000) == b""
    for bad in ({"offset": 2501, "max_bytes": 10}, {"offset": -1, "max_bytes": 10},
                {"offset": 0, "max_bytes": 0}, {"offset": 0, "max_bytes": MAX_CHUNK_BYTES + 1}):
        with pytest.raises(SnapshotChunkError):
            read_chunk(snap, **bad)


def test_read_chunk_of_a_data_file_shorter_than_its_meta_is_damage(store):
    snap = take(store, 1, 1, b"0123456789")
    _truncate(snap)
    with pytest.raises(ss.SnapshotDamaged, match="ends at 9"):
        read_chunk(snap, 5, 100)


# ---- the receiving side ------------------------------------------------------------------

@pytest.fixture
def leader_snap(tmp_path) -> Snapshot:
    with SnapshotStore(tmp_path / "leader") as s:
        return take(s, 100, 4, os.urandom(10_000))


def test_in_order_chunks_install_the_exact_snapshot(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    assert rx.received_bytes() == 0 and not rx.complete
    send_all(leader_snap, rx, 999)
    assert rx.complete
    snap = rx.install()
    assert snap.meta == leader_snap.meta
    assert snap.data_path.read_bytes() == leader_snap.data_path.read_bytes()
    assert store.newest_valid() == snap and not (store.dir / ".install").exists()
    with pytest.raises(SnapshotError, match="installed"):
        rx.write_chunk(0, b"")


def test_resume_after_a_receiver_restart(tmp_path, leader_snap):
    s = SnapshotStore(tmp_path / "f")
    rx = s.receive(leader_snap.meta)
    for off in range(0, 4000, 1000):
        rx.write_chunk(off, read_chunk(leader_snap, off, 1000))
    s.close()  # the receiving process dies; nothing else is kept
    del rx
    with SnapshotStore(tmp_path / "f") as s2:
        rx2 = s2.receive(leader_snap.meta)
        assert rx2.received_bytes() == 4000
        send_all(leader_snap, rx2, 1500)
        snap = rx2.install()
        assert snap.data_path.read_bytes() == leader_snap.data_path.read_bytes()


@pytest.mark.parametrize("offset", [1000, 2000, 0, -1])
def test_out_of_order_or_overlapping_chunks_are_refused_and_change_nothing(store, leader_snap,
                                                                           offset):
    rx = store.receive(leader_snap.meta)
    rx.write_chunk(0, read_chunk(leader_snap, 0, 1000))
    rx.write_chunk(1000, read_chunk(leader_snap, 1000, 1000))
    if offset == 2000:
        offset = 2500  # a gap
    with pytest.raises(SnapshotChunkError, match="expected 2000") as ei:
        rx.write_chunk(offset, b"z" * 500)
    assert ei.value.expected_offset == 2000 and "\n" not in str(ei.value)
    assert rx.received_bytes() == 2000
    assert (store.dir / ".install" / "data").stat().st_size == 2000


def test_a_chunk_beyond_the_size_is_refused(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    send_all(leader_snap, rx, 4096)
    with pytest.raises(SnapshotChunkError, match="runs past") as ei:
        rx.write_chunk(10_000, b"x")
    assert ei.value.expected_offset == 10_000
    with pytest.raises(SnapshotChunkError, match="bytes-like"):
        rx.write_chunk(10_000, "text")  # type: ignore[arg-type]


def test_install_before_the_last_byte_is_refused(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    rx.write_chunk(0, read_chunk(leader_snap, 0, 10))
    with pytest.raises(SnapshotIncomplete, match="10 of 10000"):
        rx.install()


def test_checksum_mismatch_is_refused_and_nothing_is_replaced(store, leader_snap):
    old = take(store, 50, 2, b"old state")
    rx = store.receive(leader_snap.meta)
    data = bytearray(leader_snap.data_path.read_bytes())
    data[7777] ^= 0x80  # damaged in transit
    rx.write_chunk(0, bytes(data))
    with pytest.raises(SnapshotChecksumMismatch, match="resend from offset 0"):
        rx.install()
    assert store.list() == [old] and store.newest_valid() == old
    assert old.data_path.read_bytes() == b"old state"
    assert rx.received_bytes() == 0  # the sender starts over; the receiver is still usable
    send_all(leader_snap, rx, 4096)
    assert rx.install().meta == leader_snap.meta


def test_a_partial_damaged_on_disk_is_caught_before_install(tmp_path, leader_snap):
    with SnapshotStore(tmp_path / "f") as s:
        rx = s.receive(leader_snap.meta)
        rx.write_chunk(0, read_chunk(leader_snap, 0, 5000))
    part = tmp_path / "f" / "snapshots" / ".install" / "data"
    b = bytearray(part.read_bytes())
    b[100] ^= 1  # a power loss damaged what was received
    part.write_bytes(bytes(b))
    with SnapshotStore(tmp_path / "f") as s:
        rx = s.receive(leader_snap.meta)
        send_all(leader_snap, rx, 5000)
        with pytest.raises(SnapshotChecksumMismatch):
            rx.install()
        assert s.list() == []


def test_a_different_meta_discards_the_partial_install(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    rx.write_chunk(0, b"x" * 100)
    other = SnapshotMeta(200, 5, 3, crc32c(b"abc"), SM, "")
    rx2 = store.receive(other)
    assert rx2.received_bytes() == 0
    with pytest.raises(SnapshotError, match="superseded"):
        rx.write_chunk(100, b"y")
    rx2.write_chunk(0, b"abc")
    assert rx2.install().data_path.read_bytes() == b"abc"


def test_a_partial_longer_than_its_meta_is_discarded(tmp_path, leader_snap):
    with SnapshotStore(tmp_path) as s:
        s.receive(leader_snap.meta).write_chunk(0, b"x" * 10)
        with open(s.dir / ".install" / "data", "ab") as f:
            f.write(b"y" * 20_000)
        assert s.receive(leader_snap.meta).received_bytes() == 0


def test_receiving_a_snapshot_already_present_is_refused(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    send_all(leader_snap, rx, 10_000)
    rx.install()
    with pytest.raises(SnapshotExists):
        store.receive(leader_snap.meta)


def test_abort_deletes_the_partial_install(store, leader_snap):
    rx = store.receive(leader_snap.meta)
    rx.write_chunk(0, b"x" * 10)
    rx.abort()
    assert not (store.dir / ".install").exists()


def test_a_local_snapshot_as_new_drops_a_useless_partial_install(store, leader_snap):
    rx = store.receive(leader_snap.meta)  # index 100
    rx.write_chunk(0, b"x" * 10)
    take(store, 99, 4, b"s")
    assert (store.dir / ".install").exists()  # still useful: it is newer
    take(store, 100, 4, b"s")
    assert not (store.dir / ".install").exists()
    with pytest.raises(SnapshotError, match="superseded"):
        rx.write_chunk(10, b"y")


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=0, max_size=3000),
       cuts=st.lists(st.integers(min_value=1, max_value=700), max_size=30),
       restarts=st.sets(st.integers(min_value=0, max_value=30)))
def test_random_chunk_sizes_and_restarts_reassemble_exactly(data, cuts, restarts):
    with tempfile.TemporaryDirectory() as d:
        with SnapshotStore(Path(d) / "leader") as leader:
            src = take(leader, 7, 1, data)
        store = SnapshotStore(Path(d) / "f")
        rx = store.receive(src.meta)
        sizes = iter(cuts)
        step = 0
        while not rx.complete:
            if step in restarts:  # the receiving process restarts mid-transfer
                store.close()
                store = SnapshotStore(Path(d) / "f")
                rx = store.receive(src.meta)
            off = rx.received_bytes()
            rx.write_chunk(off, read_chunk(src, off, next(sizes, 1000)))
            step += 1
        snap = rx.install()
        assert snap.data_path.read_bytes() == data and snap.meta == src.meta
        store.close()


def test_receiving_a_position_the_node_already_has_locally_is_refused_up_front(store,
                                                                               leader_snap):
    take(store, leader_snap.last_index, leader_snap.last_term, b"same state, other bytes")
    with pytest.raises(SnapshotExists, match=leader_snap.path.name):
        store.receive(leader_snap.meta)
    assert not (store.dir / ".install").exists()
