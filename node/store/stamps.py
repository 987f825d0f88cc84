"""Reading client-session stamps back from a log tail (node/core/sessions.py).

A leader rebuilds its session table from the newest entries of its own log when it starts
leading: each entry's (session, seq) sits in the header's reserved fields (channel,
chainCrc; docs/store.md). Entries are read as raw runs (`get_raw`, one zero-copy slice of a
data file per call, both stores offer it) and only their headers are unpacked: no body is
decoded or CRC-checked, since the leader's own committed log is what it serves anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Protocol

from node.store.codec import HEADER_SIZE

# size at 4, index at 8, channel (session) at 32, chainCrc (seq) at 36
_STAMP = struct.Struct(">4xi q 16x II")
RUN_BYTES = 4 << 20


class _RawReader(Protocol):
    ledger_begin_index: int
    ledger_end_index: int

    def get_raw(self, index: int, max_count: int, max_bytes: int) -> tuple[bytes | memoryview, int]: ...


def session_stamps(store: _RawReader, max_entries: int) -> Iterator[tuple[int, int, int]]:
    """(index, session, seq) of the last `max_entries` entries of `store`, in index order
    (entries without a session give session 0)."""
    end = store.ledger_end_index
    first = max(store.ledger_begin_index, end - max_entries + 1, 0)
    index = first
    unpack = _STAMP.unpack_from
    while index <= end:
        blob, n = store.get_raw(index, end - index + 1, RUN_BYTES)
        off = 0
        for _ in range(n):
            size, idx, session, seq = unpack(blob, off)
            yield idx, session, seq
            off += size if size >= HEADER_SIZE else HEADER_SIZE
        index += n
