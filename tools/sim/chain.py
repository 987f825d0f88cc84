"""A hash-chain state machine for the simulator (`--state-machine chain`).

The sharpest state a log can have: after applying an entry its state is
`digest = sha256(previous digest | index | term | body)`, plus how many entries it applied and
the last index. Any entry skipped, applied twice, applied out of order or under the wrong
index changes every later digest, so comparing one replica's state with the reference at the
same index shows the first mistake wherever it happened (the KV store forgives some: a
failed CAS or a delete of an absent key changes nothing but its last index). Its result for
an entry is the new digest's first 16 bytes; `query` answers with the whole state.

Deliberately without the KV store's own guard (an index not above the last one raises):
the simulator's checks, not the state machine, must catch an applier that replays an entry.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from node.statemachine.api import CommittedEntry, StateMachine

MAGIC = b"SIMC"
_STATE = struct.Struct(">4sqq32s")  # magic, applied count, last index, digest
_ENTRY = struct.Struct(">qq")  # index, term


class ChainStateMachine(StateMachine):
    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self.count = 0
        self.last_index = -1
        self.digest = bytes(32)

    def apply(self, entries: Sequence[CommittedEntry]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for e in entries:
            h = hashlib.sha256(self.digest)
            h.update(_ENTRY.pack(e.index, e.term))
            h.update(e.body)
            self.digest = h.digest()
            self.count += 1
            self.last_index = e.index
            out.append(self.digest[:16])
        return out

    def state(self) -> bytes:
        return _STATE.pack(MAGIC, self.count, self.last_index, self.digest)

    def snapshot(self, writer: BinaryIO) -> None:
        writer.write(self.state())

    def restore(self, reader: BinaryIO) -> None:
        raw = reader.read()
        if len(raw) != _STATE.size:
            raise ValueError(f"chain snapshot of {len(raw)} bytes, expected {_STATE.size}")
        magic, count, last, digest = _STATE.unpack(raw)
        if magic != MAGIC or count < 0 or last < -1:
            raise ValueError("not a chain snapshot")
        self.count, self.last_index, self.digest = count, last, digest

    def query(self, request: bytes) -> bytes:
        return self.state()
