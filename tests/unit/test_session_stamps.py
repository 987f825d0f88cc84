"""Session stamps in the entry header's reserved fields, written by both stores and read back."""

from __future__ import annotations

import pytest

from node.core.sessions import SEQ_MASK, SessionTable, Verdict
from node.store import codec
from node.store.memory_store import MemoryStore
from node.store.segment_store import SegmentStore, StoreConfig
from node.store.stamps import session_stamps


@pytest.fixture(params=["segment", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        s = MemoryStore()
    else:
        s = SegmentStore(StoreConfig(store_dir=str(tmp_path), data_file_size=4096, index_file_size=32 * 64))
        s.open()
    yield s
    s.close()


def test_stamps_are_written_per_entry_and_read_back_in_index_order(store):
    store.append_leader(b"plain", 1)  # no session
    store.append_leader(b"one", 1, session=7, seq=1)
    store.append_batch_raw([b"a" * 900, b"b" * 900, b"c" * 900, b"d" * 900], 1, session=7, first_seq=2)
    store.append_batch_raw([b"x", b"y"], 1, session=9, first_seq=[SEQ_MASK, 0])  # coalesced singles, wrapping
    got = list(session_stamps(store, 100))
    assert got == [(0, 0, 0), (1, 7, 1), (2, 7, 2), (3, 7, 3), (4, 7, 4), (5, 7, 5), (6, 9, SEQ_MASK), (7, 9, 0)]
    assert list(session_stamps(store, 3)) == got[-3:]
    e = store.get(3)
    assert bytes(e.body) == b"b" * 900  # the body and its CRC are untouched by the stamp
    h = codec.HEADER.unpack_from(bytes(store.get_raw(3, 1, 1 << 20)[0]), 0)
    assert (h[5], h[6]) == (7, 3)


def test_a_table_rebuilt_from_the_log_answers_a_retry_with_the_original_index(store):
    store.append_batch_raw([b"a", b"b", b"c"], 1, session=7, first_seq=1)
    store.append_leader(b"other", 1, session=8, seq=1)
    store.append_leader(b"d", 1, session=7, seq=4)
    t = SessionTable()
    t.rebuild(session_stamps(store, 1000))
    d = t.decide(7, 1, 3)
    assert (d.verdict, d.index) == (Verdict.DUPLICATE, 0)
    assert t.decide(7, 4).index == 4
    assert t.decide(8, 1).index == 3
    assert t.decide(7, 5).verdict is Verdict.APPEND
