"""A follower checks every pushed entry before storing it, on the fast path too.

The fast path (`append_follower` with the leader's index records, positions equal) used to
check only the first and last headers: a body with a bad CRC in the middle of a run was stored,
later committed, and the replica then refused to start (StoreCorruptError at recovery).
"""

from __future__ import annotations

import struct

import pytest

from node.store import codec
from node.store.base import StoreError
from node.store.codec import HEADER_SIZE, INDEX_SIZE
from node.store.segment_store import SegmentStore, StoreConfig


def _cfg(path, **kw):
    return StoreConfig(store_dir=str(path), data_file_size=1 << 16, index_file_size=1 << 12, **kw)


def _run(tmp_path, n=5):
    """A leader's run of `n` entries: (blob, index records, positions)."""
    lead = SegmentStore(_cfg(tmp_path / "leader"))
    lead.open()
    for i in range(n):
        lead.append_leader(b"body-%d" % i * 10, 1 + i // 3)
    blob, k = lead.get_raw(0, n, 1 << 20)
    assert k == n
    recs = bytes(lead.index.read(0, n * INDEX_SIZE))
    pos = [lead.index_record(i).pos for i in range(n)]
    blob = bytearray(blob)
    lead.close()
    return blob, recs, pos


def _follower(tmp_path, name="follower", **kw):
    f = SegmentStore(_cfg(tmp_path / name, **kw))
    f.open()
    return f


@pytest.mark.parametrize("victim", [1, 2, 3])
def test_fast_path_refuses_a_run_with_a_bad_body_crc_in_the_middle(tmp_path, victim):
    blob, recs, pos = _run(tmp_path)
    blob[pos[victim] + HEADER_SIZE + 2] ^= 0xFF
    f = _follower(tmp_path)
    try:
        with pytest.raises(StoreError, match=f"entry {victim}: body CRC") as ei:
            f.append_follower(bytes(blob), recs)
        assert ei.value.code_name == "UNEXPECTED_ARGUMENT"
        assert f.ledger_end_index == -1 and f.data.wrote_position == 0  # nothing stored
    finally:
        f.close()
    with SegmentStore(_cfg(tmp_path / "follower")) as again:  # and the replica still opens
        assert again.ledger_end_index == -1


@pytest.mark.parametrize("field,value", [
    ("term", 7),        # a header of another term than its record
    ("index", 9),       # a header naming another index
    ("magic", 2),       # NOOP header under a NORMAL record
])
def test_fast_path_refuses_a_middle_header_that_disagrees_with_its_index_record(tmp_path, field, value):
    blob, recs, pos = _run(tmp_path)
    off = {"term": codec.TERM_OFFSET, "index": codec.INDEX_OFFSET, "magic": 0}[field]
    fmt = ">i" if field == "magic" else ">q"
    struct.pack_into(fmt, blob, pos[2] + off, value)
    f = _follower(tmp_path)
    try:
        with pytest.raises(StoreError):
            f.append_follower(bytes(blob), recs)
        assert f.ledger_end_index == -1
    finally:
        f.close()


def test_fast_path_refuses_records_that_skip_or_go_back_in_term(tmp_path):
    blob, recs, pos = _run(tmp_path)
    recs = bytearray(recs)
    rec = list(codec.INDEX.unpack_from(recs, 3 * INDEX_SIZE))
    rec[4] = 0  # term going backwards in the records (and the header disagrees anyway)
    codec.INDEX.pack_into(recs, 3 * INDEX_SIZE, *rec)
    f = _follower(tmp_path)
    try:
        with pytest.raises(StoreError):
            f.append_follower(bytes(blob), bytes(recs))
        assert f.ledger_end_index == -1
    finally:
        f.close()


def test_fast_path_stores_a_good_run_and_skips_crc_only_when_configured(tmp_path):
    blob, recs, pos = _run(tmp_path)
    f = _follower(tmp_path)
    try:
        assert f.append_follower(bytes(blob), recs) == 4
        assert [bytes(f.get(i).body) for i in range(5)] == [b"body-%d" % i * 10 for i in range(5)]
    finally:
        f.close()
    blob[pos[2] + HEADER_SIZE] ^= 0x01
    g = _follower(tmp_path, "nocrc", verify_push_crc=False)
    try:
        assert g.append_follower(bytes(blob), recs) == 4  # the operator turned the check off
    finally:
        g.close()


def test_any_flipped_byte_of_a_pushed_run_is_refused_before_anything_is_stored(tmp_path):
    """Exhaustive over one run: whatever byte of the entries or of their index records is
    damaged (except the two reserved header fields, channel and chainCrc, which carry nothing),
    the fast path refuses the push and the follower's log does not change."""
    blob, recs, pos = _run(tmp_path, n=4)
    reserved = {p - pos[0] + k for p in pos for k in range(32, 40)}
    f = _follower(tmp_path)
    try:
        for where, buf in (("entries", blob), ("records", bytearray(recs))):
            for i in range(len(buf)):
                if where == "entries" and i in reserved:
                    continue
                buf[i] ^= 0x40
                try:
                    with pytest.raises(StoreError):
                        f.append_follower(bytes(blob), recs if where == "entries" else bytes(buf))
                finally:
                    buf[i] ^= 0x40
                assert f.ledger_end_index == -1, (where, i)
        assert f.append_follower(bytes(blob), recs) == 3  # the undamaged run is stored
    finally:
        f.close()
