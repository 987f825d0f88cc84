"""node.store.decoder: exact decoding of tiny stores, and every kind of damage as data.

Stores are written by the real SegmentStore with 4 KiB data files and 64-record index files,
so a few dozen entries roll files and leave BLANK padding; faults are injected by editing
bytes afterwards, located through the reader itself. docs/store.md is the format being checked.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import crcmod.predefined
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.store import codec
from node.store.codec import BLANK_SIZE, HEADER_SIZE, INDEX_SIZE, MAGIC_BLANK, MAGIC_NOOP
from node.store.decoder import COLUMNS, DecodedEntry, StoreDecoder, rows_to_columns
from node.store.segment_store import SegmentStore, StoreConfig

REPO = Path(__file__).resolve().parents[2]
DATA_FILE = 4096
INDEX_FILE = 32 * 64


def body_of(i: int) -> bytes:
    """Deterministic bodies of varied length (0..299 bytes), so files fill unevenly."""
    return (f"entry-{i}-".encode() * 40)[: (i * 37) % 300]


def make_store(path: Path, n: int = 100, committed: int | None = 79,
               terms: tuple[int, ...] = (1, 2, 3), noop_at: int | None = None) -> list:
    """Write entries 0..n-1 (terms in equal thirds) through SegmentStore; returns AppendResults."""
    store = SegmentStore(StoreConfig(store_dir=str(path), data_file_size=DATA_FILE,
                                     index_file_size=INDEX_FILE, flush_mode="async"))
    store.open()
    out = []
    try:
        for i in range(n):
            term = terms[min(len(terms) - 1, i * len(terms) // max(n, 1))]
            if i == noop_at:
                out.append(store.append_leader(b"", term, magic=MAGIC_NOOP))
            else:
                out.append(store.append_leader(body_of(i), term))
        if committed is not None:
            store.set_committed_index(committed)
    finally:
        store.close()
    return out


def rows(path: Path, **kw) -> list[DecodedEntry]:
    with StoreDecoder(path) as r:
        return list(r.iter_entries(**kw))


def entry_location(path: Path, index: int) -> tuple[Path, int, int]:
    """(data file, offset of entry `index` in it, entry size)."""
    with StoreDecoder(path) as r:
        e = next(r.iter_entries(index, index))
        f, off = r.data_file_of(e.pos)
    return f, off, e.size


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_body_byte(store: Path, index: int, at: int = 0) -> None:
    f, off, _ = entry_location(store, index)
    with open(f, "r+b") as fh:
        fh.seek(off + HEADER_SIZE + at)
        b = fh.read(1)
        fh.seek(off + HEADER_SIZE + at)
        fh.write(bytes([b[0] ^ 0xFF]))


def zero_index_record(store: Path, index: int) -> None:
    with StoreDecoder(store) as r:
        f, off = r.index_file_of(index)
    patch(f, off, bytes(INDEX_SIZE))


# ---------------------------------------------------------------------- healthy stores

def test_healthy_store_decodes_exactly(tmp_path: Path) -> None:
    results = make_store(tmp_path / "n0", n=100, committed=79, noop_at=50)
    with StoreDecoder(tmp_path / "n0") as r:
        assert (r.begin_index, r.end_index, r.committed_index) == (0, 99, 79)
        assert r.count == 100 and not r.tail_dropped
        got = list(r.iter_entries())
    assert [e.index for e in got] == list(range(100))
    for e, a in zip(got, results, strict=True):
        body = b"" if e.index == 50 else body_of(e.index)
        assert (e.index, e.term, e.pos) == (a.index, a.term, a.pos)
        assert e.size == HEADER_SIZE + len(body)
        assert e.body == body
        assert e.body_crc == codec.crc32(body)
        assert e.crc_ok is True and e.error is None
        assert e.type == ("NOOP" if e.index == 50 else "NORMAL")
    assert [e.term for e in got] == [1] * 34 + [2] * 33 + [3] * 33


def test_rollover_and_blank_padding_are_skipped(tmp_path: Path) -> None:
    """Entries never span files: when one did not fit, the file tail holds [-1][remaining]."""
    make_store(tmp_path / "n0", n=100)
    got = rows(tmp_path / "n0")
    data_files = sorted((tmp_path / "n0" / "data").iterdir())
    assert len(data_files) >= 4 and len(sorted((tmp_path / "n0" / "index").iterdir())) == 2
    starts = [e for e in got if e.pos % DATA_FILE == 0 and e.index > 0]
    assert starts, "some entry must start a new data file"
    for e in got:
        assert e.pos // DATA_FILE == (e.pos + e.size - 1) // DATA_FILE  # never spans
    for e in starts:
        prev = got[e.index - 1]
        end = prev.pos + prev.size
        blank = data_files[end // DATA_FILE].read_bytes()[end % DATA_FILE:][:BLANK_SIZE]
        assert struct.unpack(">ii", blank) == (MAGIC_BLANK, DATA_FILE - end % DATA_FILE)


def test_ranges_are_inclusive_and_clamped(tmp_path: Path) -> None:
    make_store(tmp_path / "n0", n=30)
    assert [e.index for e in rows(tmp_path / "n0", from_index=10, to_index=12)] == [10, 11, 12]
    assert [e.index for e in rows(tmp_path / "n0", from_index=-5, to_index=2)] == [0, 1, 2]
    assert [e.index for e in rows(tmp_path / "n0", from_index=28, to_index=1000)] == [28, 29]
    assert rows(tmp_path / "n0", from_index=12, to_index=11) == []
    assert rows(tmp_path / "n0", from_index=40) == []


def test_decode_columns_chunks_are_bounded_and_complete(tmp_path: Path) -> None:
    make_store(tmp_path / "n0", n=100)
    with StoreDecoder(tmp_path / "n0") as r:
        all_rows = list(r.iter_rows())
        chunks = list(r.decode_columns(chunk_entries=7))
        by_bytes = list(r.decode_columns(chunk_entries=1000, chunk_bytes=1000))
        no_body = list(r.decode_columns(body=False))
    assert [len(c["index"]) for c in chunks] == [7] * 14 + [2]
    assert all(list(c) == list(COLUMNS) for c in chunks)
    merged = {k: sum((c[k] for c in chunks), []) for k in COLUMNS}
    assert merged == rows_to_columns(all_rows)
    assert all(sum(c["size"][:-1]) < 1000 for c in by_bytes)
    assert sum(len(c["index"]) for c in by_bytes) == 100
    assert all(b is None for c in no_body for b in c["body"])
    assert sum(no_body[0]["crc_ok"]) == 100


def test_empty_and_invalid_directories(tmp_path: Path) -> None:
    SegmentStore(StoreConfig(store_dir=str(tmp_path / "empty"), data_file_size=DATA_FILE,
                             index_file_size=INDEX_FILE)).open()
    with StoreDecoder(tmp_path / "empty") as r:
        assert (r.begin_index, r.end_index, r.committed_index, r.count) == (-1, -1, -1, 0)
        assert list(r.iter_entries()) == []
    with pytest.raises(NotADirectoryError):
        StoreDecoder(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError):
        StoreDecoder(tmp_path / "plain")


def test_truncate_and_retention_move_the_bounds(tmp_path: Path) -> None:
    d = tmp_path / "n0"
    make_store(d, n=100, committed=60)
    store = SegmentStore(StoreConfig(store_dir=str(d), data_file_size=DATA_FILE,
                                     index_file_size=INDEX_FILE))
    store.open()
    try:
        store.truncate(90)
        store.scrub()  # retention deletes only what was checked since open
        store.delete_before(40)
        begin = store.ledger_begin_index
    finally:
        store.close()
    assert begin > 0
    with StoreDecoder(d) as r:
        assert (r.begin_index, r.end_index) == (begin, 89)
        got = list(r.iter_entries())
    assert [e.index for e in got] == list(range(begin, 90))
    assert all(e.crc_ok and e.error is None and e.body == body_of(e.index) for e in got)


# ---------------------------------------------------------------------- damage is data

def test_corrupt_body_is_crc_false_not_an_error(tmp_path: Path) -> None:
    make_store(tmp_path / "n0", n=40)
    flip_body_byte(tmp_path / "n0", 17, at=3)
    got = rows(tmp_path / "n0")
    bad = got[17]
    assert bad.crc_ok is False and bad.error is None
    assert bad.body_crc == codec.crc32(body_of(17)) and bad.body != body_of(17)
    assert all(e.crc_ok for e in got if e.index != 17)


def test_zero_index_record_is_a_gap_row(tmp_path: Path) -> None:
    make_store(tmp_path / "n0", n=40)
    zero_index_record(tmp_path / "n0", 21)
    with StoreDecoder(tmp_path / "n0") as r:
        assert r.end_index == 39  # a one-record hole does not hide the rest of the log
        got = list(r.iter_entries())
    assert got[21] == DecodedEntry(21, None, None, None, None, None, None,
                                   "gap: index record is zero", None)
    assert [e.index for e in got] == list(range(40))
    assert all(e.error is None for e in got if e.index != 21)


@pytest.mark.parametrize(("field_offset", "value", "kind"), [
    (8, struct.pack(">q", 1234), "index:"),        # data header index
    (16, struct.pack(">q", 9), "term:"),           # data header term
    (24, struct.pack(">q", 7), "pos:"),            # data header pos
    (0, struct.pack(">i", 77), "magic:"),          # data header magic
    (44, struct.pack(">i", 5), "size:"),           # body size vs size
])
def test_header_disagreements_are_errors(tmp_path: Path, field_offset: int, value: bytes,
                                         kind: str) -> None:
    make_store(tmp_path / "n0", n=20)
    f, off, _ = entry_location(tmp_path / "n0", 9)
    patch(f, off + field_offset, value)
    got = rows(tmp_path / "n0")
    assert got[9].error is not None and got[9].error.startswith(kind), got[9].error
    assert got[9].index == 9
    assert all(e.error is None and e.crc_ok for e in got if e.index != 9)


def test_index_record_disagreements_are_errors(tmp_path: Path) -> None:
    d = tmp_path / "n0"
    make_store(d, n=20)
    with StoreDecoder(d) as r:
        f5, o5 = r.index_file_of(5)
        f6, o6 = r.index_file_of(6)
        f7, o7 = r.index_file_of(7)
    patch(f5, o5 + 4, struct.pack(">q", 10**12))  # pos outside every data file
    patch(f6, o6 + 24, struct.pack(">q", 99))      # term disagrees with the header
    patch(f7, o7 + 16, struct.pack(">q", 3))       # index field names another entry
    got = rows(d)
    assert got[5].error == f"pos: {10**12} is outside the data files" and got[5].crc_ok is None
    assert got[6].error == "term: data header term 1, index record term 99" and got[6].term == 1
    assert got[7].error.startswith("index: index record holds index 3")
    assert got[7].body == body_of(7) and got[7].crc_ok is True


def test_torn_last_index_record_is_left_out(tmp_path: Path) -> None:
    """The record the node is writing right now may be half there: not part of the log."""
    d = tmp_path / "n0"
    make_store(d, n=20)
    with StoreDecoder(d) as r:
        f, off = r.index_file_of(20)
    patch(f, off, struct.pack(">iq", 1, 99999))  # magic + pos written, index/term not yet
    with StoreDecoder(d) as r:
        assert r.end_index == 19 and r.tail_dropped
        assert len(list(r.iter_entries())) == 20


def test_last_record_without_its_term_yet_is_left_out(tmp_path: Path) -> None:
    """struct.pack_into writes field by field: a reader can see index set and term still 0."""
    d = tmp_path / "n0"
    make_store(d, n=21)
    with StoreDecoder(d) as r:
        f, off = r.index_file_of(20)
    patch(f, off + 24, bytes(8))
    with StoreDecoder(d) as r:
        assert (r.end_index, r.tail_dropped) == (19, True)
    patch(f, off + 24, struct.pack(">q", 3))  # the term arrives
    flip_body_byte(d, 20)  # a CRC failure is damage, not a record being written: kept
    with StoreDecoder(d) as r:
        assert (r.end_index, r.tail_dropped) == (20, False)
        assert next(r.iter_entries(20, 20)).crc_ok is False


def test_unmatched_magic_in_index_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "n0"
    make_store(d, n=20)
    with StoreDecoder(d) as r:
        f, off = r.index_file_of(4)
    patch(f, off, struct.pack(">i", 42))
    e = rows(d)[4]
    assert e.error == "magic: index record magic 42"
    assert (e.term, e.type, e.crc_ok, e.body) == (1, "NORMAL", True, body_of(4))


# ---------------------------------------------------------------------- live store

_WRITER = textwrap.dedent("""
    # A node's handler, reduced: appends one batch per stdin line, reports its end, and so
    # lets the test read DURING each batch without sleeps (and without unbounded files).
    import sys
    sys.path.insert(0, sys.argv[2])
    from node.store.segment_store import SegmentStore, StoreConfig
    from test_decoder import body_of
    st = SegmentStore(StoreConfig(store_dir=sys.argv[1], data_file_size=4096,
                                  index_file_size=2048, flush_mode="async"))
    st.open()
    i = 0
    print("ready", flush=True)
    for line in sys.stdin:
        for _ in range(int(line)):
            st.append_leader(body_of(i), 1 + i // 500)
            i += 1
        st.set_committed_index(i - 1)
        print(i, flush=True)
    st.close()
""")


class LiveWriter:
    """The writer process: `start_batch(n)` returns at once, `wait_batch()` -> entries so far."""

    def __init__(self, store_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store_dir), str(Path(__file__).parent)],
            env=dict(os.environ, PYTHONPATH=str(REPO)), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline().strip()
        assert line, f"writer died: {self.proc.stderr.read()}"
        return line

    def start_batch(self, n: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()

    def wait_batch(self) -> int:
        return int(self._line())

    def stop(self) -> None:
        self.proc.kill()  # by PID; the store needs no clean close for this test
        self.proc.wait(timeout=10)


def check_prefix(d: Path) -> int:
    """Decode everything visible now: a clean contiguous prefix 0..end. Returns end."""
    with StoreDecoder(d) as r:
        got = list(r.iter_entries())
        end = r.end_index
    assert [e.index for e in got] == list(range(end + 1))
    bad = [e for e in got if e.error or not e.crc_ok or e.body != body_of(e.index)]
    assert not bad, bad[:3]
    return end


def test_reading_while_another_process_appends(tmp_path: Path) -> None:
    """Never raises, always a clean contiguous prefix, while the writer rolls files."""
    d = tmp_path / "live"
    writer = LiveWriter(d)
    try:
        ends = []
        for _ in range(12):
            writer.start_batch(100)
            ends.append(check_prefix(d))  # while the batch is being written
            written = writer.wait_batch()
            assert check_prefix(d) == written - 1  # everything, once the batch is done
        assert ends == sorted(ends) and ends[-1] >= 1000
        assert len(list((d / "data").iterdir())) > 40  # rolled many files meanwhile
    finally:
        writer.stop()


# ---------------------------------------------------------------------- CRC fast path evidence

_CRCMOD_CRC32 = crcmod.predefined.mkCrcFun("crc-32")


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=4096))
def test_zlib_crc32_equals_crcmod_crc32(data: bytes) -> None:
    """crcmod's predefined "crc-32" IS zlib's CRC-32 (same polynomial, reflection, init and
    xor-out): zlib computes it ~5x faster, so the decoder's CRC (codec.crc32) may be zlib's
    while the stored values stay crcmod's, as docs/store.md "CRC" defines them."""
    assert zlib.crc32(data) == _CRCMOD_CRC32(data)
    assert codec.crc32(memoryview(data)) == _CRCMOD_CRC32(data)


def test_unreadable_checkpoint_is_reported_not_raised(tmp_path: Path) -> None:
    d = tmp_path / "n0"
    make_store(d, n=10, committed=5)
    (d / "checkpoint").write_text("committedIndex=five\nendIndex=9\n")
    with StoreDecoder(d) as r:
        assert r.committed_index == -1 and "checkpoint" in (r.checkpoint_error or "")
        assert len(list(r.iter_entries())) == 10
