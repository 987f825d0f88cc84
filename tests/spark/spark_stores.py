"""Replica stores for the Spark tests: written by the real SegmentStore (4 KiB data files,
64-record index files), damaged afterwards by editing bytes located through the decoder."""

from __future__ import annotations

from pathlib import Path

from node.store.codec import HEADER_SIZE, INDEX_SIZE
from node.store.decoder import StoreDecoder
from node.store.segment_store import SegmentStore, StoreConfig

N_ENTRIES = 200
COMMITTED = 179
WIDTH = 32  # partitionEntries used by the tests: 200 entries → 7 ranges


def body_of(i: int) -> bytes:
    return (f"e{i}:".encode() * 60)[: 20 + (i * 53) % 250]


def term_of(i: int) -> int:
    return 1 + i // 70


def write_store(path: Path, n: int = N_ENTRIES, committed: int = COMMITTED,
                overrides: dict[int, bytes] | None = None) -> None:
    """Entries 0..n-1 with `body_of`/`term_of`, except bodies in `overrides`."""
    st = SegmentStore(StoreConfig(store_dir=str(path), data_file_size=4096,
                                  index_file_size=32 * 64, flush_mode="async"))
    st.open()
    try:
        for i in range(n):
            st.append_leader((overrides or {}).get(i, body_of(i)), term_of(i))
        st.set_committed_index(committed)
    finally:
        st.close()


def flip_body_byte(store: Path, index: int) -> None:
    with StoreDecoder(store) as r:
        e = next(r.iter_entries(index, index))
        f, off = r.data_file_of(e.pos)
    with open(f, "r+b") as fh:
        fh.seek(off + HEADER_SIZE)
        b = fh.read(1)
        fh.seek(off + HEADER_SIZE)
        fh.write(bytes([b[0] ^ 0x5A]))


def zero_index_record(store: Path, index: int) -> None:
    with StoreDecoder(store) as r:
        f, off = r.index_file_of(index)
    with open(f, "r+b") as fh:
        fh.seek(off)
        fh.write(bytes(INDEX_SIZE))
