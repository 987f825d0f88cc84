"""A follower checks every pushed entry before storing it, on the fast path too.

The fast path (`append_follower` with the leader's index records, positions equal) used to
check only the first and last headers: a body with a bad CRC in the middle of a run was stored,
later committed, and the replica then refused to start (StoreCorruptError at recovery).
"""

from __future__ import annotations

import re
import struct

import crc32c
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from node.store import codec, push_check
from node.store.base import StoreError
from node.store.codec import HEADER_SIZE, INDEX_SIZE
from node.store.memory_store import MemoryStore
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


# ---- the two implementations of the record/header check (node/store/push_check.py) ---------

DEFECTS = ["record-magic", "header-magic", "record-pos", "header-pos", "record-size",
           "record-index", "header-index", "term-decrease", "body-size", "trailing-bytes"]


def _synthetic_run(first: int, pos0: int, bodies: list[bytes], terms: list[int]):
    """A leader's run built with the codec alone (no store): (blob, records, offsets)."""
    blob, recs, offs = bytearray(), bytearray(), []
    for k, (body, term) in enumerate(zip(bodies, terms, strict=True)):
        offs.append(len(blob))
        pos = pos0 + len(blob)
        blob += codec.encode_entry(first + k, term, pos, body)
        recs += codec.encode_index(codec.MAGIC_NORMAL, pos, HEADER_SIZE + len(body), first + k, term)
    return blob, recs, offs


def _damage(blob: bytearray, recs: bytearray, offs: list[int], row: int, defect: str) -> bytearray:
    """One defect at `row`; returns the (possibly longer) blob."""
    rec = list(codec.INDEX.unpack_from(recs, row * INDEX_SIZE))
    h = offs[row]
    if defect == "record-magic":
        rec[0] = 7
    elif defect == "header-magic":
        struct.pack_into(">i", blob, h, codec.MAGIC_NOOP)
    elif defect == "record-pos":
        rec[1] += 8
    elif defect == "header-pos":
        struct.pack_into(">q", blob, h + codec.POS_OFFSET, rec[1] + 1)
    elif defect == "record-size":
        rec[2] += 1
    elif defect == "record-index":
        rec[3] += 1
    elif defect == "header-index":
        struct.pack_into(">q", blob, h + codec.INDEX_OFFSET, rec[3] + 2)
    elif defect == "term-decrease":  # record and header agree, but the term goes backwards
        rec[4] = codec.INDEX.unpack_from(recs, (row - 1) * INDEX_SIZE)[4] - 1
        struct.pack_into(">q", blob, h + codec.TERM_OFFSET, rec[4])
    elif defect == "body-size":
        struct.pack_into(">i", blob, h + 44, struct.unpack_from(">i", blob, h + 44)[0] + 1)
    elif defect == "trailing-bytes":
        return blob + b"\x00" * (1 + row % 60)
    codec.INDEX.pack_into(recs, row * INDEX_SIZE, *rec)
    return blob


def _refusal(check, blob, recs, n, verify) -> str | None:
    try:
        check(memoryview(bytes(blob)), memoryview(bytes(recs)), n, verify)
    except StoreError as e:
        assert e.code_name == "UNEXPECTED_ARGUMENT"
        return str(e)
    return None


def _named_index(message: str) -> int:
    m = re.match(r"push index record \d+ \((\d+)\)|push entry (\d+):", message)
    assert m, message
    return int(m.group(1) or m.group(2))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 2 * push_check.NUMPY_MIN_RUN + 5),
       first=st.integers(0, 10**12), pos0=st.integers(0, 10**15),
       defect=st.sampled_from([None, *DEFECTS]), verify=st.booleans())
def test_loop_and_numpy_agree_on_random_runs_with_one_defect(data, n, first, pos0, defect, verify):
    """Both implementations accept a clean run and refuse a damaged one with the same message,
    which names the damaged entry; on every run length (both sides of the threshold). The
    plain-run accept (`plain_run_ok`) accepts every clean one-term run and nothing that the
    full check refuses, and `check_run` answers as the loop does."""
    sizes = data.draw(st.lists(st.integers(0, 90), min_size=n, max_size=n))
    one_term = data.draw(st.booleans())  # plain runs (one term) reach `plain_run_ok`'s accept
    steps = data.draw(st.lists(st.integers(0, 0 if one_term else 1), min_size=n, max_size=n))
    terms = [1 + sum(steps[:k + 1]) for k in range(n)]
    bodies = [bytes([k % 251]) * s for k, s in enumerate(sizes)]
    blob, recs, offs = _synthetic_run(first, pos0, bodies, terms)
    assume(n > 1 or defect != "term-decrease")
    lo = 1 if defect == "term-decrease" else 0
    row = data.draw(st.one_of(st.sampled_from([lo, n - 1]), st.integers(lo, n - 1)))  # ends often
    if defect is not None:
        blob = _damage(blob, recs, offs, row, defect)
    loop = _refusal(push_check.check_run_loop, blob, recs, n, verify)
    vec = _refusal(push_check.check_run_numpy, blob, recs, n, verify)
    assert loop == vec
    assert _refusal(push_check.check_run, blob, recs, n, verify) == loop
    plain = push_check.plain_run_ok(memoryview(bytes(blob)), memoryview(bytes(recs)), n)
    if plain:  # never accepts what the full check refuses
        assert loop is None
    if defect is None and one_term:  # and accepts every clean plain run
        assert plain
    if defect is None:
        assert loop is None
    elif defect == "trailing-bytes":
        assert loop is not None and "bytes of entries" in loop
    else:  # the damaged row, by the index the (possibly damaged) records give it
        assert loop is not None and _named_index(loop) == codec.INDEX.unpack_from(recs, 0)[3] + row


@pytest.mark.parametrize("n", [3, push_check.PLAIN_MIN_RUN + 3, push_check.NUMPY_MIN_RUN + 3])
def test_loop_and_numpy_agree_on_a_bad_body_crc_only_when_asked(n):
    blob, recs, offs = _synthetic_run(5, 0, [b"abc" * 7] * n, [2] * n)
    blob[offs[n // 2] + HEADER_SIZE + 1] ^= 0x10
    for check in (push_check.check_run_loop, push_check.check_run_numpy, push_check.check_run):
        assert _refusal(check, blob, recs, n, True) == f"push entry {5 + n // 2}: body CRC mismatch"
        assert _refusal(check, blob, recs, n, False) is None  # bodies are the run CRC's job then


def test_check_run_picks_the_loop_below_the_threshold(monkeypatch):
    used = []
    monkeypatch.setattr(push_check, "check_run_loop", lambda *a: used.append("loop"))
    monkeypatch.setattr(push_check, "check_run_numpy", lambda *a: used.append("numpy"))
    for n in (1, push_check.NUMPY_MIN_RUN - 1, push_check.NUMPY_MIN_RUN, 4096):
        push_check.check_run(memoryview(b""), memoryview(b""), n, False)
    assert used == ["loop", "loop", "numpy", "numpy"]


# ---- the run CRC ----------------------------------------------------------------------------

def test_run_crc_definition_covers_records_then_entries():
    """CRC-32C (Castagnoli, its check value pinned) over the records, then the entries."""
    assert codec.push_run_crc(b"12345", b"6789") == 0xE3069283
    blob, recs, _offs = _synthetic_run(0, 0, [b"x", b"yy"], [1, 1])
    assert codec.push_run_crc(recs, blob) == crc32c.crc32c(bytes(recs) + bytes(blob))
    assert codec.push_run_crc(b"", blob) == crc32c.crc32c(bytes(blob))


@pytest.mark.parametrize("kind", ["segment", "memory"])
def test_any_flipped_byte_is_refused_by_the_run_crc_and_nothing_is_stored(tmp_path, kind):
    """With the leader's run CRC, every byte counts, the reserved header fields too: a flipped
    byte anywhere in the entries or the records is refused as a run CRC mismatch (or earlier),
    and the follower's log does not change."""
    blob, recs, pos = _run(tmp_path, n=4)
    crc = codec.push_run_crc(recs, blob)
    f = _follower(tmp_path) if kind == "segment" else MemoryStore()
    try:
        for where, buf in (("entries", blob), ("records", bytearray(recs))):
            for i in range(len(buf)):
                buf[i] ^= 0x40
                try:
                    with pytest.raises(StoreError, match="push run CRC mismatch") as ei:
                        f.append_follower(bytes(blob), recs if where == "entries" else bytes(buf), crc)
                    assert ei.value.code_name == "UNEXPECTED_ARGUMENT"
                finally:
                    buf[i] ^= 0x40
                assert f.ledger_end_index == -1, (where, i)
        with pytest.raises(StoreError, match="push run CRC mismatch"):
            f.append_follower(bytes(blob), recs, crc ^ 1)  # the CRC itself damaged
        assert f.ledger_end_index == -1
        assert f.append_follower(bytes(blob), recs, crc) == 3  # the undamaged run is stored
        assert [bytes(f.get(i).body) for i in range(4)] == [b"body-%d" % i * 10 for i in range(4)]
    finally:
        f.close()


@pytest.mark.parametrize("kind", ["segment", "memory"])
def test_a_push_without_run_crc_still_checks_every_body_crc(tmp_path, kind):
    """The t1-ends-only shape (docs/contracts.md C12): direct callers and pushes
    without a run CRC get the per-entry body CRC check, on the fast path too."""
    blob, recs, pos = _run(tmp_path)
    blob[pos[2] + HEADER_SIZE + 2] ^= 0xFF
    f = _follower(tmp_path) if kind == "segment" else MemoryStore()
    try:
        with pytest.raises(StoreError, match="body CRC"):
            f.append_follower(bytes(blob), recs)
        with pytest.raises(StoreError, match="body CRC"):
            f.append_follower(bytes(blob), recs, None)
        assert f.ledger_end_index == -1
    finally:
        f.close()


def test_run_crc_on_the_per_entry_path_too(tmp_path):
    """A push without index records takes the per-entry (re-stamping) path: the run CRC, then
    over the entries alone, is checked there too and stands for the body CRCs."""
    blob, _recs, pos = _run(tmp_path)
    crc = codec.push_run_crc(b"", blob)
    g = _follower(tmp_path)
    try:
        bad = bytearray(blob)
        bad[pos[1] + 40] ^= 1  # entry 1's body CRC field
        with pytest.raises(StoreError, match="push run CRC mismatch"):
            g.append_follower(bytes(bad), b"", crc)
        with pytest.raises(StoreError, match="entry 1: body CRC"):
            g.append_follower(bytes(bad), b"")
        assert g.ledger_end_index == -1
        assert g.append_follower(bytes(blob), b"", crc) == 4
    finally:
        g.close()


def test_run_crc_is_not_checked_when_the_operator_turned_push_checks_off(tmp_path):
    blob, recs, pos = _run(tmp_path)
    g = _follower(tmp_path, "nocrc", verify_push_crc=False)
    try:
        assert g.append_follower(bytes(blob), recs, 12345) == 4
    finally:
        g.close()
