"""A log that begins after a snapshot: `reset_to(S, T)` (the store half of an install;
docs/store.md "A log that begins after a snapshot").

A follower that receives its leader's snapshot (last included entry S, term T) must replace
its whole log by an empty one that begins at S + 1, so that the leader's next push (COMPARE at
S with term T, then APPEND from S + 1) is accepted -- and that log must survive a restart and a
crash at any step of the reset, and readers in other processes must never see the replaced
files' bytes as the new log. Tiny files (4 KiB data, 8-record index files) make rolls and file
deletions happen within a few entries.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.store import codec
from node.store import decoder as decoder_mod
from node.store import segment_store as segment_store_mod
from node.store.base import DiskError, DiskFull, IndexOutOfRange, StoreError
from node.store.decoder import StoreDecoder
from node.store.layout import (
    CHECKPOINT_FILE,
    Checkpoint,
    LayoutError,
    LogBase,
    read_checkpoint,
    write_checkpoint,
)
from node.store.memory_store import MemoryStore
from node.store.reader import StaleRead, StoreReader
from node.store.segment_store import SegmentStore, StoreConfig

NEVER = 10**7  # ms: keeps the flush service from writing checkpoints during a test


def _cfg(path, **kw):
    kw.setdefault("data_file_size", 4096)
    kw.setdefault("index_file_size", 8 * 32)
    kw.setdefault("flush_interval_ms", 5)
    kw.setdefault("checkpoint_interval_ms", NEVER)
    kw.setdefault("recover_verify_files", 100)
    return StoreConfig(store_dir=str(path), **kw)


def _open(path, **kw) -> SegmentStore:
    s = SegmentStore(_cfg(path, **kw))
    s.open()
    return s


def _body(tag: str, i: int) -> bytes:
    # ~200-byte entries: ~19 per 4 KiB data file. Unique, so a stale read shows as other bytes.
    return f"{tag}-{i:04d}-".encode() + b"." * 150


def _entries(s) -> list[tuple[int, int, bytes]]:
    if s.ledger_end_index < s.ledger_begin_index or s.ledger_begin_index < 0:
        return []
    return [(e.index, e.term, bytes(e.body)) for e in s.get_range(s.ledger_begin_index, 1 << 30)]


def _state(s) -> tuple:
    return (s.ledger_begin_index, s.ledger_end_index, s.ledger_end_term, s.committed_index,
            tuple(_entries(s)))


def _empty_at(index: int, term: int) -> tuple:
    return (index + 1, index, term, index, ())


def _reopen(s: SegmentStore) -> SegmentStore:
    cfg = s.config
    s.close()
    s = SegmentStore(cfg)
    s.open()
    return s


def _leader_run(first: int, prev_term: int, bodies: list[bytes], term: int):
    """Encoded entries first.. (as a leader's store holds them) with their index records: a
    scratch memory store reset to (first - 1, prev_term) -- reset_to on the sending side."""
    src = MemoryStore()
    if first > 0:
        src.reset_to(first - 1, prev_term)
    for b in bodies:
        src.append_leader(b, term)
    blob, n = src.get_raw(first, len(bodies), 1 << 30)
    assert n == len(bodies)
    recs = b"".join(codec.INDEX.pack(e.magic, e.pos, codec.HEADER_SIZE + len(e.body), e.index, e.term)
                    for e in src.get_range(first, n))
    return blob, recs


# ---- the logs a reset starts from ------------------------------------------------------------

def _log_empty(s):
    pass


def _log_short(s):
    for i in range(3):
        s.append_leader(_body("short", i), 1)
    s.set_committed_index(1)


def _log_long(s):
    """60 entries over 4 data files (terms 1 and 2), committed to 40."""
    s.append_batch_raw([_body("long", i) for i in range(30)], 1)
    s.append_batch_raw([_body("long", i) for i in range(30, 60)], 2)
    s.set_committed_index(40)


def _log_trimmed(s):
    """The long log after retention deleted its first data files: begin > 0."""
    _log_long(s)
    assert s.delete_before(40) >= 1
    assert s.ledger_begin_index > 0


def _log_reset_before(s):
    """A log that already begins after an earlier snapshot (7, 2), with 25 entries after it."""
    s.reset_to(7, 2)
    s.append_batch_raw([_body("again", i) for i in range(25)], 3)
    s.set_committed_index(20)


LOGS = {"empty": _log_empty, "short": _log_short, "long": _log_long, "trimmed": _log_trimmed,
        "reset-before": _log_reset_before}


def _targets(s) -> dict[str, int]:
    """Snapshot positions relative to the log: below its begin, inside, at its end, past it."""
    begin, end = max(s.ledger_begin_index, 0), s.ledger_end_index
    return {"below-begin": max(begin - 1, 0), "inside": max((begin + end) // 2, 0),
            "at-end": max(end, 0), "past-end": end + 100}


# ---- reset, restart, append, restart -------------------------------------------------------

@pytest.mark.parametrize("where", ["below-begin", "inside", "at-end", "past-end"])
@pytest.mark.parametrize("log", LOGS)
def test_reset_leaves_an_empty_log_after_the_snapshot_across_restarts(tmp_path, log, where):
    s = _open(tmp_path)
    try:
        LOGS[log](s)
        S = _targets(s)[where]
        T = max(s.ledger_end_term, 0) + 1
        g = s.generation
        s.reset_to(S, T)
        assert s.generation > g and s.generation % 2 == 0  # fenced (readers must refresh)
        for _ in range(2):  # before and after a restart
            assert _state(s) == _empty_at(S, T)
            assert s.term_at(S) == T  # what a COMPARE at (S, T) needs
            assert s.log_base is not None and (s.log_base.index, s.log_base.term) == (S, T)
            assert not s.data.files and not s.index.files  # nothing of the old log is left
            for bad in (S - 1, S, S + 1):
                with pytest.raises(IndexOutOfRange):
                    s.get(bad)
            s = _reopen(s)
    finally:
        s.close()


@pytest.mark.parametrize("log", LOGS)
def test_appends_after_a_reset_from_s_plus_1_survive_restarts(tmp_path, log):
    s = _open(tmp_path)
    try:
        LOGS[log](s)
        S, T = s.ledger_end_index + 10, max(s.ledger_end_term, 0) + 1
        s.reset_to(S, T)
        s = _reopen(s)
        want = []
        # a new leader's NOOP, then a client batch, then follower pushes (with and without the
        # leader's index records): entries S + 1 ... in order, across file rolls
        r = s.append_leader(b"", T + 1, magic=codec.MAGIC_NOOP)
        assert r.index == S + 1
        want.append((S + 1, T + 1, b""))
        s = _reopen(s)
        first, _ = s.append_batch_raw([_body("batch", i) for i in range(25)], T + 1)
        assert first == S + 2
        want += [(S + 2 + i, T + 1, _body("batch", i)) for i in range(25)]
        s = _reopen(s)
        blob, recs = _leader_run(S + 27, T + 1, [_body("push", i) for i in range(30)], T + 2)
        assert s.append_follower(blob, recs) == S + 56
        want += [(S + 27 + i, T + 2, _body("push", i)) for i in range(30)]
        blob, _ = _leader_run(S + 57, T + 2, [_body("bare", i) for i in range(5)], T + 2)
        assert s.append_follower(blob) == S + 61
        want += [(S + 57 + i, T + 2, _body("bare", i)) for i in range(5)]
        s.set_committed_index(S + 50)
        for _ in range(2):
            assert _state(s) == (S + 1, S + 61, T + 2, S + 50, tuple(want))
            assert s.term_at(S) == T and s.term_at(S + 1) == T + 1
            assert s.first_index_of_term(T + 1, S + 26) == S + 1
            s = _reopen(s)
    finally:
        s.close()


def test_the_base_answers_compare_and_first_index_of_term(tmp_path):
    for s in (_open(tmp_path), MemoryStore()):
        s.reset_to(9, 4)
        assert s.term_at(9) == 4
        assert s.first_index_of_term(4, 9) == 9
        with pytest.raises(StoreError):
            s.first_index_of_term(3, 9)
        with pytest.raises(IndexOutOfRange):
            s.term_at(8)  # below the base: as unknown as any compacted entry
        s.append_leader(b"a", 4)
        s.append_leader(b"b", 5)
        # entries of the base's term continue the base's run
        assert s.first_index_of_term(4, 10) == 9
        assert s.first_index_of_term(5, 11) == 11
        s.close()


def test_truncate_refuses_at_or_below_the_base_and_may_empty_back_to_it(tmp_path):
    s = _open(tmp_path)
    try:
        _log_long(s)
        s.reset_to(100, 3)
        for bad in (99, 100):
            with pytest.raises(StoreError):
                s.truncate(bad)  # committed: the snapshot
        s.append_batch_raw([_body("a", i) for i in range(30)], 4)  # 101..130, two data files
        for bad in (0, 99, 100):
            with pytest.raises(StoreError):
                s.truncate(bad)
        s.truncate(120)
        assert (s.ledger_begin_index, s.ledger_end_index, s.ledger_end_term) == (101, 119, 4)
        # the conflicting-suffix case after an install: cut back to the base, not below it
        g = s.generation
        s.truncate(101)
        assert s.generation > g
        for _ in range(2):
            assert _state(s) == _empty_at(100, 3)
            assert s.term_at(100) == 3
            s = _reopen(s)
        s.append_leader(_body("b", 0), 5)
        s = _reopen(s)
        assert _entries(s) == [(101, 5, _body("b", 0))]
    finally:
        s.close()


def test_a_retention_trimmed_log_still_refuses_to_empty_itself(tmp_path):
    """Without a base there is no snapshot to continue from: the old refusal stands."""
    s = _open(tmp_path)
    try:
        s.append_batch_raw([_body("long", i) for i in range(60)], 1)
        begin = s.data_file_ranges(8)[2][0]
        s.set_committed_index(begin - 1)  # so only the begin check can refuse
        assert s.delete_before(begin) == 2 and s.ledger_begin_index == begin
        with pytest.raises(IndexOutOfRange, match="ledger begin"):
            s.truncate(begin)
        assert s.log_base is None and s.ledger_end_index == 59
    finally:
        s.close()


def test_retention_after_a_reset(tmp_path):
    s = _open(tmp_path)
    try:
        _log_long(s)
        s.reset_to(500, 2)
        assert s.data_file_ranges(8) == []
        assert s.delete_before(1000) == 0  # nothing to delete in an empty log
        s.append_batch_raw([_body("r", i) for i in range(80)], 3)  # 501..580, 5 data files
        ranges = s.data_file_ranges(8)
        assert ranges[0][0] == 501 and ranges[-1][1] == 580
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        s.set_committed_index(560)
        assert s.delete_before(550) >= 2
        begin = s.ledger_begin_index
        assert 501 < begin <= 550 and begin == s.data_file_ranges(1)[0][0]
        assert s.log_base is None  # S + 1 is gone: S is no longer the entry before the log
        with pytest.raises(IndexOutOfRange):
            s.term_at(500)
        for _ in range(2):
            assert s.ledger_begin_index == begin and s.ledger_end_index == 580
            assert [e.index for e in s.get_range(begin, 1000)] == list(range(begin, 581))
            s = _reopen(s)
        # the base stays in the checkpoint (a later reset replaces it), harmless once passed
        assert read_checkpoint(tmp_path).base.index == 500
    finally:
        s.close()


def test_reset_arguments_are_checked(tmp_path):
    for s in (_open(tmp_path), MemoryStore()):
        for args in ((-1, 0), (0, -1)):
            with pytest.raises(StoreError, match="must be >= 0"):
                s.reset_to(*args)
        s.close()


def test_memory_store_has_the_same_semantics(tmp_path):
    mem, seg = MemoryStore(), _open(tmp_path)
    try:
        for s in (mem, seg):
            _log_long(s)
            g = s.generation
            s.reset_to(30, 2)  # S inside the log: everything goes anyway
            assert s.generation > g
            assert _state(s) == _empty_at(30, 2)
            assert s.term_at(30) == 2
            s.append_leader(b"x", 3)
            s.append_leader(b"y", 3)
            s.truncate(31)
            assert _state(s) == _empty_at(30, 2)
            blob, recs = _leader_run(31, 2, [b"p", b"q"], 4)
            assert s.append_follower(blob, recs) == 32
            with pytest.raises(StoreError):
                s.truncate(30)
        assert _state(mem) == _state(seg)
    finally:
        seg.close()


# ---- compatibility -------------------------------------------------------------------------

def test_a_store_never_reset_keeps_the_two_key_checkpoint(tmp_path):
    s = _open(tmp_path)
    _log_short(s)
    s.close()
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == b"committedIndex=1\nendIndex=2\n"
    assert read_checkpoint(tmp_path) == Checkpoint(1, 2)


def test_an_old_store_opens_unchanged(tmp_path):
    """A store written before log bases (DLedger's two-key checkpoint) opens as before."""
    s = _open(tmp_path)
    _log_trimmed(s)
    before = _state(s)
    s.close()
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"committedIndex=40\nendIndex=59\n")
    s = _open(tmp_path)
    try:
        assert _state(s) == before and s.log_base is None
    finally:
        s.close()


def test_checkpoint_round_trips_a_base_and_refuses_a_damaged_one(tmp_path):
    cp = Checkpoint(12, 15, LogBase(10, 3, 8192))
    write_checkpoint(tmp_path, cp)
    assert read_checkpoint(tmp_path) == cp
    text = (tmp_path / CHECKPOINT_FILE).read_text()
    assert "baseIndex=10\n" in text and "baseTerm=3\n" in text and "basePos=8192\n" in text
    for bad, match in ((text.replace("baseTerm=3\n", ""), "incomplete.*baseTerm"),
                       (text.replace("basePos=8192", "basePos=-1"), "basePos"),
                       (text.replace("baseIndex=10", "baseIndex=x"), "baseIndex")):
        (tmp_path / CHECKPOINT_FILE).write_text(bad)
        with pytest.raises(LayoutError, match=match):
            read_checkpoint(tmp_path)


# ---- crashes -------------------------------------------------------------------------------

def record_crash_images(monkeypatch, store_dir: Path, out: Path) -> list[Path]:
    """Copy ``store_dir`` just before every fsync, rename, replace and unlink of the calling
    thread: each copy is what a process killed at that point leaves (the page cache keeps what
    it wrote). As in test_snapshot_store.py. Only this thread's calls: with flush_mode=async the
    store's flush thread fsyncs when it likes, and its calls interleaved with the reset's made
    the order asserted below fail now and then."""
    images: list[Path] = []
    real = {n: getattr(os, n) for n in ("fsync", "rename", "replace", "unlink", "rmdir")}
    me = threading.get_ident()

    def hook(name):
        def call(*a, **k):
            if threading.get_ident() != me:
                return real[name](*a, **k)
            dst = out / f"img{len(images):03d}-{name}"
            shutil.copytree(store_dir, dst, symlinks=True)
            images.append(dst)
            return real[name](*a, **k)
        return call

    for n in real:
        monkeypatch.setattr(os, n, hook(n))
    return images


def _decoded(path: Path) -> tuple:
    """What `dledger dump` sees: (begin, end, rows)."""
    with StoreDecoder(path) as d:
        rows = tuple((e.index, e.term, bytes(e.body)) for e in d.iter_entries())
        assert all(e.error is None and e.crc_ok for e in d.iter_entries())
        return d.begin_index, d.end_index, rows


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("log", ["short", "long", "trimmed", "reset-before"])
def test_a_crash_at_any_step_of_a_reset_leaves_the_old_log_or_the_new_empty_one(
        tmp_path, monkeypatch, log, mode):
    path = tmp_path / "n"
    s = _open(path, flush_mode=mode)
    LOGS[log](s)
    s.checkpoint()  # the committed index too is what a restart finds
    old = _state(s)
    old_decoded = (old[0], old[1], old[4]) if old[4] else (-1, -1, ())
    S, T = s.ledger_end_index - 2, s.ledger_end_term + 1
    new = _empty_at(S, T)
    images = record_crash_images(monkeypatch, path, tmp_path / "crash")
    s.reset_to(S, T)
    monkeypatch.undo()
    s.close()
    # a killed writer leaves the generation odd: the decoder's bounded wait for it is 0.5 s
    monkeypatch.setattr(decoder_mod, "_ODD_WAIT_S", 0.0)
    # the checkpoint's temp file fsync, rename and directory fsync, and only then the unlinks
    # (at least a data and an index file) and directory fsyncs
    calls = [p.name.split("-", 1)[1] for p in images]
    assert calls[:3] == ["fsync", "replace", "fsync"] and calls[-2:] == ["fsync", "fsync"]
    assert set(calls[3:]) == {"unlink", "fsync"} and calls.count("unlink") >= 2
    seen = set()
    for img in images:
        # a dump of the crashed store before the node restarts: old or new, never a mix
        dumped = _decoded(img)
        assert dumped in (old_decoded, (S + 1, S, ())), img
        r = _open(img, flush_mode=mode)
        try:
            got = _state(r)
            assert got in (old, new), img
            assert (dumped == old_decoded) == (got == old), img  # dump and restart agree
            seen.add("old" if got == old else "new")
            if got == new:
                assert r.term_at(S) == T
                r.append_leader(b"next", T)  # and the log goes on from S + 1
                r = _reopen(r)
                assert _entries(r) == [(S + 1, T, b"next")]
                assert _decoded(img)[2] == ((S + 1, T, b"next"),)
        finally:
            r.close()
    assert seen == {"old", "new"}


def test_leftover_files_of_the_replaced_log_are_deleted_at_open(tmp_path):
    """A file of the old log that comes back (an unlink lost with the page cache on a file
    system that did not honour the directory fsync) is recognised by its position alone."""
    s = _open(tmp_path)
    _log_long(s)
    s.flush()
    saved = tmp_path.parent / "saved"
    shutil.copytree(tmp_path / "data", saved)
    s.reset_to(70, 3)
    s.append_batch_raw([_body("new", i) for i in range(30)], 3)
    want = _state(s)
    s.close()
    for f in saved.iterdir():
        shutil.copy(f, tmp_path / "data" / f.name)  # contiguous with the new files (P = old end)
    assert _decoded(tmp_path)[2] == want[4]  # dump ignores them already
    s = _open(tmp_path)
    try:
        assert _state(s) == want
        assert all(f.start >= s.log_base.pos for f in s.data.files)
        assert not any((tmp_path / "data" / f.name).exists() for f in saved.iterdir())
    finally:
        s.close()


def test_a_full_disk_writing_the_base_changes_nothing(tmp_path, monkeypatch):
    s = _open(tmp_path)
    try:
        _log_long(s)
        before = _state(s)
        real = os.write

        def full(fd, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(os, "write", full)
        with pytest.raises(DiskFull, match="checkpoint"):
            s.reset_to(100, 3)
        monkeypatch.setattr(os, "write", real)
        assert _state(s) == before and s.generation % 2 == 0 and s.write_error is None
        s = _reopen(s)
        assert _state(s) == before
    finally:
        s.close()


def test_a_failure_deleting_the_old_files_stops_writes_and_reopen_finishes(tmp_path, monkeypatch):
    s = _open(tmp_path)
    _log_long(s)
    real = os.unlink
    monkeypatch.setattr(os, "unlink", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    with pytest.raises(DiskError, match="deleting the replaced log"):
        s.reset_to(100, 3)
    monkeypatch.setattr(os, "unlink", real)
    assert _state(s) == _empty_at(100, 3)  # the commit point passed: the new log it is
    assert s.generation % 2 == 0
    with pytest.raises(DiskError, match="refuses writes"):
        s.append_leader(b"x", 3)
    s.close()
    assert len(list((tmp_path / "data").iterdir())) == 4  # the old files are still there
    s = _open(tmp_path)
    try:
        assert _state(s) == _empty_at(100, 3)
        assert not list((tmp_path / "data").iterdir())
        s.append_leader(b"x", 3)
        assert _entries(s) == [(101, 3, b"x")]
    finally:
        s.close()


def test_a_checkpoint_in_flight_never_undoes_a_reset(tmp_path, monkeypatch):
    """The flush service reads (committed, end), flushes, then writes the checkpoint. A reset
    in between must not be followed by a checkpoint of the values read before it: committed 40
    over a log that now ends at 5 would make the store refuse to open after a crash."""
    written: list[Checkpoint] = []
    by_flusher = threading.Event()
    real_write = segment_store_mod.write_checkpoint

    def record(d, cp):
        real_write(d, cp)
        written.append(cp)
        if threading.current_thread().name == "dledger-flush":
            by_flusher.set()
    monkeypatch.setattr(segment_store_mod, "write_checkpoint", record)
    s = SegmentStore(_cfg(tmp_path, checkpoint_interval_ms=1, flush_interval_ms=1))
    s.open()
    try:
        _log_long(s)  # committed 40, end 59
        flushing, go = threading.Event(), threading.Event()
        real_flush = s.flush

        def slow_flush():
            if threading.current_thread().name == "dledger-flush" and not go.is_set():
                flushing.set()
                go.wait(5)  # a checkpoint in flight: (40, 59) read, not yet written
            real_flush()
        monkeypatch.setattr(s, "flush", slow_flush)
        assert flushing.wait(5)
        t = threading.Thread(target=s.reset_to, args=(5, 1))
        t.start()
        t.join(0.2)  # the reset runs now (or waits for the checkpoint in flight)
        by_flusher.clear()
        go.set()
        t.join(5)
        assert not t.is_alive()
        assert by_flusher.wait(5)  # the checkpoint in flight has been written
    finally:
        s.close()
    after = written[next(i for i, cp in enumerate(written) if cp.base is not None):]
    assert after and all(cp.committed_index == 5 and cp.end_index == 5 for cp in after), written
    s = _open(tmp_path)  # and the store opens
    try:
        assert _state(s) == _empty_at(5, 1)
    finally:
        s.close()


# ---- the first push after a reset takes the leader's positions -------------------------------

def _leader(path, n=60) -> SegmentStore:
    lead = _open(path)
    lead.append_batch_raw([_body("lead", i) for i in range(n)], 2)
    return lead


def _records(store, first: int, n: int) -> bytes:
    """Index records first .. first + n - 1 (they may straddle index files)."""
    return b"".join(bytes(store.index.read(k * 32, 32)) for k in range(first, first + n))


def _push(lead, fol, first, last, run=7) -> None:
    """Push [first, last] as the dispatcher does: raw runs with the leader's index records."""
    i = first
    while i <= last:
        blob, n = lead.get_raw(i, run, 1 << 20)
        assert fol.append_follower(blob, _records(lead, i, n)) == i + n - 1
        i += n


def _spy_spans(monkeypatch, store) -> list:
    """Calls of the re-stamping (per-entry) path of append_follower."""
    calls: list = []
    real = store._write_spans
    monkeypatch.setattr(store, "_write_spans", lambda *a: calls.append(a) or real(*a))
    return calls


def test_an_installed_follower_takes_the_leaders_positions(tmp_path, monkeypatch):
    lead, fol = _leader(tmp_path / "lead"), _open(tmp_path / "fol")
    try:
        _log_short(fol)  # old log in one data file: the reset puts the base at 4096
        S = 30
        fol.reset_to(S, lead.term_at(S))
        assert fol.log_base.pos == 4096
        first_pos = lead.index_record(S + 1).pos
        assert first_pos > 4096 and first_pos % 4096 != 0  # mid-file in the leader
        spans = _spy_spans(monkeypatch, fol)
        _push(lead, fol, S + 1, 59)
        assert spans == []  # every push took the one-copy path
        assert fol.log_base.pos == first_pos == read_checkpoint(tmp_path / "fol").base.pos
        for _ in range(2):
            assert _records(fol, S + 1, 29) == _records(lead, S + 1, 29)
            assert _entries(fol) == [(i, 2, _body("lead", i)) for i in range(S + 1, 60)]
            fol = _reopen(fol)  # recovery starts reading the first data file at the base position
        assert _decoded(tmp_path / "fol")[2] == tuple(_entries(fol))
        r = StoreReader(tmp_path / "fol")
        r.begin(fol.generation)
        assert r.get(S + 1, 59).body == _body("lead", S + 1) and r.term_at(S) == 2
        r.close()
        lead.append_batch_raw([_body("more", i) for i in range(10)], 3)
        spans.clear()
        _push(lead, fol, 60, 69)
        assert spans == [] and fol.ledger_end_index == 69
    finally:
        lead.close()
        fol.close()


def test_a_leader_position_below_the_base_is_not_taken(tmp_path, monkeypatch):
    """Positions only move forward: files of the replaced log must all end at or before the
    base position (that is how recovery tells them from the new log's)."""
    lead, fol = _leader(tmp_path / "lead"), _open(tmp_path / "fol")
    try:
        _log_long(fol)  # old log in 4 data files: base position 16384
        S = 30
        fol.reset_to(S, lead.term_at(S))
        base = fol.log_base
        assert lead.index_record(S + 1).pos < base.pos
        spans = _spy_spans(monkeypatch, fol)
        _push(lead, fol, S + 1, 59)
        assert spans and fol.log_base == base  # re-stamped at our own positions
        assert fol.index_record(S + 1).pos == base.pos
        fol = _reopen(fol)
        assert _entries(fol) == [(i, 2, _body("lead", i)) for i in range(S + 1, 60)]
    finally:
        lead.close()
        fol.close()


def test_a_crash_during_the_first_push_after_a_reset(tmp_path, monkeypatch):
    lead, fol = _leader(tmp_path / "lead"), _open(tmp_path / "fol", flush_mode="sync")
    _log_short(fol)
    S = 30
    fol.reset_to(S, 2)
    empty = _empty_at(S, 2)
    images = record_crash_images(monkeypatch, tmp_path / "fol", tmp_path / "crash")
    _push(lead, fol, S + 1, S + 7)
    monkeypatch.undo()
    full = (S + 1, S + 7, 2, S, tuple((i, 2, _body("lead", i)) for i in range(S + 1, S + 8)))
    assert _state(fol) == full
    first_pos = lead.index_record(S + 1).pos
    fol.close()
    lead.close()
    monkeypatch.setattr(decoder_mod, "_ODD_WAIT_S", 0.0)
    calls = [p.name.split("-", 1)[1] for p in images]
    assert calls[:3] == ["fsync", "replace", "fsync"]  # the new base position, before any data
    seen = set()
    for img in images:
        r = _open(img)
        try:
            got = _state(r)
            assert got in (empty, full), img
            seen.add(got == full)
            assert r.log_base.pos == first_pos or (got == empty and r.log_base.pos == 4096), img
            if got == empty:  # and the push can be made again
                blob, n = _leader_run(S + 1, 2, [_body("lead", i) for i in range(S + 1, S + 8)], 2)
                assert r.append_follower(blob, n) == S + 7
        finally:
            r.close()
    assert seen == {False, True}


# ---- readers in other processes ------------------------------------------------------------

def test_a_reader_that_mapped_the_old_log_gets_stale_reads_then_the_new_log(tmp_path):
    s = _open(tmp_path)
    try:
        _log_long(s)
        r = StoreReader(tmp_path)
        g0 = s.generation
        r.begin(g0)
        blob, _n, _recs = r.get_run(45, 59, 8, 1 << 20)  # maps the old last files
        assert codec.decode_entry(blob).index == 45
        s.reset_to(44, 2)
        with pytest.raises(StaleRead):
            r.validate(g0)  # what was read above may be a replaced file's bytes
        with pytest.raises(StaleRead):
            r.begin(g0)
        g1 = s.generation
        r.begin(g1)
        assert r.term_at(44) == 2  # the dispatcher's COMPARE at the base
        with pytest.raises(StaleRead):
            r.get_run(45, 44, 8, 1 << 20)  # the published end is S: nothing to read
        s.append_batch_raw([_body("new", i) for i in range(30)], 3)  # 45..74, new files
        r.begin(s.generation)
        got, i = [], 45
        while i <= 74:
            blob, n, recs = r.get_run(i, 74, 7, 1 << 20)
            got += [(e.index, e.term, bytes(e.body)) for _o, e in codec.iter_entries(blob)]
            assert len(recs) == 32 * n
            i += n
        r.validate(s.generation)
        assert got == [(45 + i, 3, _body("new", i)) for i in range(30)]
        assert r.term_at(44) == 2 and r.term_at(45) == 3
        r.close()
    finally:
        s.close()


def test_a_reader_created_on_an_empty_reset_store(tmp_path):
    s = _open(tmp_path)
    try:
        s.reset_to(1000, 7)
        r = StoreReader(tmp_path)
        r.begin(s.generation)
        assert r.log_base.index == 1000 and r.term_at(1000) == 7
        with pytest.raises(StaleRead):
            r.term_at(1001)
        blob, recs = _leader_run(1001, 7, [b"a", b"b"], 7)
        s.append_follower(blob, recs)
        r.begin(s.generation)
        assert r.get(1002, 1002).body == b"b"
        r.close()
    finally:
        s.close()


def test_decoder_on_a_reset_store(tmp_path):
    s = _open(tmp_path)
    try:
        _log_long(s)
        s.reset_to(77, 2)
        with StoreDecoder(tmp_path) as d:
            assert (d.begin_index, d.end_index, d.count, d.is_empty) == (78, 77, 0, True)
            assert d.committed_index == 77 and (d.base.index, d.base.term) == (77, 2)
            assert list(d.iter_entries()) == []
            assert list(d.decode_columns()) == []
        s.append_batch_raw([_body("n", i) for i in range(25)], 3)
        s.checkpoint()
        with StoreDecoder(tmp_path) as d:
            assert (d.begin_index, d.end_index) == (78, 102)
            rows = list(d.iter_entries())
            assert [(e.index, e.term, e.body) for e in rows] == [(78 + i, 3, _body("n", i)) for i in range(25)]
            assert all(e.crc_ok and e.error is None for e in rows)
    finally:
        s.close()


def test_a_decoder_opened_before_the_reset_never_hands_out_the_old_log(tmp_path):
    s = _open(tmp_path)
    try:
        _log_long(s)
        d = StoreDecoder(tmp_path)
        assert (d.begin_index, d.end_index) == (0, 59)
        s.reset_to(10, 2)
        s.append_batch_raw([_body("n", i) for i in range(5)], 3)  # 11..15 at new positions
        rows = [(e.index, e.term, e.body, e.error) for e in d.iter_entries()]
        # the generation moved: the decoder re-mapped the store and shows the new log only
        assert rows == [(11 + i, 3, _body("n", i), None) for i in range(5)]
        d.close()
    finally:
        s.close()


# ---- the model -----------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.binary(max_size=600)),
        st.tuples(st.just("batch"), st.lists(st.binary(max_size=300), min_size=1, max_size=12)),
        st.tuples(st.just("follower"), st.lists(st.binary(max_size=300), min_size=1, max_size=8)),
        st.tuples(st.just("truncate"), st.integers(0, 10_000)),
        st.tuples(st.just("commit"), st.integers(0, 10_000)),
        st.tuples(st.just("term"), st.integers(1, 2)),
        st.tuples(st.just("reset"), st.tuples(st.integers(0, 10_000), st.integers(0, 1))),
        st.tuples(st.just("reopen"), st.none()),
    ),
    max_size=50,
)


class _Model:
    def __init__(self) -> None:
        self.begin, self.entries, self.base, self.committed = 0, [], None, -1

    @property
    def end(self) -> int:
        return self.begin + len(self.entries) - 1

    @property
    def end_term(self) -> int:
        return self.entries[-1][0] if self.entries else (self.base[1] if self.base else -1)

    def state(self) -> tuple:
        if self.base is None and not self.entries:
            return (-1, -1, -1, self.committed, ())
        return (self.begin, self.end, self.end_term, self.committed,
                tuple((self.begin + k, t, b) for k, (t, b) in enumerate(self.entries)))


def _check_reader(r: StoreReader, s: SegmentStore, m: _Model) -> None:
    g = s.generation
    r.begin(g)
    if m.base is not None:
        assert r.term_at(m.base[0]) == m.base[1]
    seen, i = [], m.begin
    while i <= m.end:
        blob, n, _recs = r.get_run(i, m.end, 16, 1 << 20)
        seen += [(e.index, e.term, bytes(e.body)) for _o, e in codec.iter_entries(blob)]
        i += n
    r.validate(g)
    assert tuple(seen) == m.state()[4]


@given(seq=ops)
@settings(max_examples=120, deadline=None)
def test_segment_and_memory_store_match_a_model_with_resets(tmp_path_factory, seq):
    path = tmp_path_factory.mktemp("store")
    seg = _open(path)
    mem = MemoryStore()
    reader = StoreReader(path)
    m = _Model()
    term = 1
    try:
        for k, (op, arg) in enumerate(seq):
            if op == "append":
                body = b"@%d:" % k + arg
                for s in (seg, mem):
                    assert s.append_leader(body, term).index == m.end + 1
                m.entries.append((term, body))
            elif op == "batch":
                bodies = [b"@%d.%d:" % (k, j) + b for j, b in enumerate(arg)]
                for s in (seg, mem):
                    assert s.append_batch_raw(bodies, term)[0] == m.end + 1
                m.entries += [(term, b) for b in bodies]
            elif op == "follower":
                bodies = [b"@%d.%d:" % (k, j) + b for j, b in enumerate(arg)]
                blob, recs = _leader_run(m.end + 1, m.end_term, bodies, term)
                for s in (seg, mem):
                    assert s.append_follower(blob, recs if k % 2 else b"") == m.end + len(bodies)
                m.entries += [(term, b) for b in bodies]
            elif op == "truncate":
                i = m.begin + arg % (len(m.entries) + 2) - 1  # begin - 1 .. end + 1
                if i <= m.committed:
                    for s in (seg, mem):
                        with pytest.raises(StoreError):
                            s.truncate(i)
                elif i > m.end:
                    for s in (seg, mem):
                        s.truncate(i)
                elif i < m.begin or (i == m.begin and i > 0 and m.base is None):
                    for s in (seg, mem):
                        with pytest.raises(IndexOutOfRange):
                            s.truncate(i)
                else:
                    for s in (seg, mem):
                        s.truncate(i)
                    del m.entries[i - m.begin:]
                    if not m.entries and m.base is None:
                        m.begin = 0
            elif op == "commit":
                if m.end >= 0:
                    c = arg % (m.end + 1)
                    for s in (seg, mem):
                        s.set_committed_index(c)
                    m.committed = max(m.committed, c)
            elif op == "term":
                term += arg
            elif op == "reset":
                S, T = arg[0] % (m.end + 40), max(term - 1 + arg[1], 0)
                for s in (seg, mem):
                    s.reset_to(S, T)
                m.begin, m.entries, m.base, m.committed = S + 1, [], (S, T), S
                term = max(term, T)
            elif op == "reopen":
                seg = _reopen(seg)
            assert _state(seg) == m.state(), op
            assert _state(mem) == m.state(), op
            _check_reader(reader, seg, m)
        seg = _reopen(seg)
        assert _state(seg) == m.state()
        seg.checkpoint()
        with StoreDecoder(path) as d:
            rows = tuple((e.index, e.term, bytes(e.body)) for e in d.iter_entries())
            assert rows == m.state()[4]
            if m.base is not None:
                assert (d.begin_index, d.end_index) == (m.begin, m.end)
    finally:
        reader.close()
        seg.close()
