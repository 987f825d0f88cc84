"""A store with the segment store's interface and no files (DLedgerMemoryStore's role):
for unit tests of the handler logic, scenario tests, and embedding that needs no durability.
Entries are kept encoded exactly as on disk, so raw reads and follower appends behave alike.
"""

from __future__ import annotations

from collections.abc import Callable

from node.core.sessions import entry_seqs
from node.store import codec, push_check
from node.store.base import (
    AppendResult,
    CorruptEntry,
    InconsistentAppend,
    IndexOutOfRange,
    StoreError,
)
from node.store.codec import MAGIC_NORMAL, Entry
from node.store.layout import LogBase


class MemoryStore:
    def __init__(self, max_body_size: int = 4 << 20) -> None:
        self.max_body_size = max_body_size
        self._entries: list[bytes] = []  # encoded, index = begin + position
        self._pos = 0
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.flush_observer: Callable[[int], None] | None = None  # never called: nothing to fsync
        # Same contract as SegmentStore.generation: even, and moved (by 2) whenever a
        # truncation drops entries or a reset replaces the log, so code that publishes/checks
        # it runs unchanged here.
        self.generation = 0
        self._base: LogBase | None = None  # set by reset_to, as SegmentStore's

    def open(self) -> None:
        pass

    unchecked_end = -1  # SegmentStore's scrub: memory holds nothing unchecked

    def scrub_step(self, max_bytes: int = 1 << 20) -> bool:
        """Nothing to check (SegmentStore.scrub_step checks what recovery left)."""
        return False

    def fix_index_records(self, index: int) -> int:
        """Nothing derived to rewrite (SegmentStore.fix_index_records rebuilds index records)."""
        return 0

    def has_room(self) -> bool:
        """Memory never reports DiskFull by itself."""
        return True

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def _push(self, encoded: bytes, index: int, term: int) -> None:
        if self.ledger_begin_index < 0:
            self.ledger_begin_index = index
        self._entries.append(encoded)
        self._pos += len(encoded)
        self.ledger_end_index, self.ledger_end_term = index, term

    def append_leader(self, body: bytes, term: int, magic: int = MAGIC_NORMAL, session: int = 0,
                      seq: int = 0) -> AppendResult:
        if term < self.ledger_end_term:
            raise InconsistentAppend(f"term {term} below ledger end term {self.ledger_end_term}")
        if len(body) > self.max_body_size:
            raise StoreError(f"body of {len(body)} bytes too large", "UNEXPECTED_ARGUMENT")
        idx, pos = self.ledger_end_index + 1, self._pos
        self._push(codec.encode_entry(idx, term, pos, bytes(body), magic, session, seq), idx, term)
        return AppendResult(idx, term, pos)

    def append_leader_batch(self, bodies: list[bytes], term: int) -> list[AppendResult]:
        if not bodies:
            raise StoreError("empty batch", "REQUEST_WITH_EMPTY_BODYS")
        if any(len(b) > self.max_body_size for b in bodies):
            raise StoreError("body too large", "UNEXPECTED_ARGUMENT")
        return [self.append_leader(b, term) for b in bodies]

    def append_batch_raw(self, bodies: list[bytes], term: int, session: int = 0,
                         first_seq: int | list[int] = 0) -> tuple[int, list[int]]:
        """Same contract as SegmentStore.append_batch_raw: (first index, positions). The
        handler's batch path calls this, so a memory-store node (tests, the simulator) must
        offer it too."""
        if not bodies:
            raise StoreError("empty batch", "REQUEST_WITH_EMPTY_BODYS")
        if any(len(b) > self.max_body_size for b in bodies):
            raise StoreError("body too large", "UNEXPECTED_ARGUMENT")
        seqs = entry_seqs(session, first_seq, len(bodies))
        rs = [self.append_leader(b, term, session=session, seq=s) for b, s in zip(bodies, seqs, strict=True)]
        return rs[0].index, [r.pos for r in rs]

    def append_follower(self, blob: bytes | memoryview, index_records: bytes | memoryview = b"",
                        run_crc: int | None = None) -> int:
        """Same contract as SegmentStore.append_follower: every entry is checked (index
        continuity, term order, its bytes) and, when the leader's index records come with the
        run, against its record (magic, size, index, term), before anything is stored. Its
        bytes: one CRC over records and entries against `run_crc` when given (then no body CRC
        per entry), else every body CRC. Positions are always re-stamped."""
        if run_crc is not None:
            push_check.check_run_crc(blob, index_records, run_crc)
        expected, prev = self.ledger_end_index + 1, self.ledger_end_term
        staged = []
        recs = list(codec.INDEX.iter_unpack(index_records[:len(index_records) // codec.INDEX_SIZE
                                                          * codec.INDEX_SIZE])) if index_records else None
        try:
            for k, (off, e) in enumerate(codec.iter_entries(blob, verify_crc=run_crc is None)):
                if e.index != expected or e.term < prev:
                    raise InconsistentAppend(f"push entry {e.index}/{e.term}, expected index {expected}")
                if recs is not None:
                    if k >= len(recs):
                        raise StoreError(f"push entry {e.index} has no index record", "UNEXPECTED_ARGUMENT")
                    magic, _pos, size, index, term = recs[k]
                    if (magic, size, index, term) != (e.magic, codec.HEADER_SIZE + len(e.body), e.index, e.term):
                        raise StoreError(f"push entry {e.index}: header disagrees with its index record",
                                         "UNEXPECTED_ARGUMENT")
                staged.append((off, e))
                expected, prev = e.index + 1, e.term
        except codec.CodecError as ex:
            raise StoreError(str(ex), "UNEXPECTED_ARGUMENT") from ex
        if recs is not None and len(recs) != len(staged):
            raise StoreError(f"push of {len(staged)} entries carries {len(recs)} index records",
                             "UNEXPECTED_ARGUMENT")
        for off, e in staged:  # the leader's bytes as they are (session stamp too), pos re-stamped
            raw = bytearray(blob[off:off + codec.HEADER_SIZE + len(e.body)])
            codec.restamp_pos(raw, 0, self._pos)
            self._push(bytes(raw), e.index, e.term)
        return self.ledger_end_index

    def _check_range(self, index: int) -> None:
        if self.ledger_begin_index < 0 or not self.ledger_begin_index <= index <= self.ledger_end_index:
            raise IndexOutOfRange(f"index {index} outside [{self.ledger_begin_index}, {self.ledger_end_index}]")

    def get(self, index: int, verify_crc: bool = True) -> Entry:
        self._check_range(index)
        try:
            return codec.decode_entry(self._entries[index - self.ledger_begin_index], 0, verify_crc)
        except codec.CodecError as e:
            raise CorruptEntry(str(e)) from e

    def get_range(self, index: int, count: int) -> list[Entry]:
        self._check_range(index)
        last = min(self.ledger_end_index, index + max(count, 0) - 1)
        return [self.get(i) for i in range(index, last + 1)]

    def get_raw(self, index: int, max_count: int, max_bytes: int) -> tuple[bytes, int]:
        self._check_range(index)
        out, size = [], 0
        for i in range(index, min(self.ledger_end_index, index + max(max_count, 1) - 1) + 1):
            b = self._entries[i - self.ledger_begin_index]
            if out and size + len(b) > max_bytes:
                break
            out.append(b)
            size += len(b)
        return b"".join(out), len(out)

    def get_checked(self, index: int, max_count: int, max_bytes: int) -> tuple[bytes, int]:
        """`get_raw`, every entry decoded and checked (index, CRC): SegmentStore.get_checked."""
        blob, n = self.get_raw(index, max_count, max_bytes)
        try:
            for k, (_off, e) in enumerate(codec.iter_entries(blob)):
                if e.index != index + k:
                    raise CorruptEntry(f"entry {index + k}: the log holds index {e.index} there")
        except codec.CodecError as e:
            raise CorruptEntry(f"entries from {index}: {e}") from e
        return blob, n

    def term_at(self, index: int) -> int:
        b = self.log_base
        if b is not None and index == b.index:
            return b.term
        self._check_range(index)
        return codec.HEADER.unpack_from(self._entries[index - self.ledger_begin_index])[3]

    def first_index_of_term(self, term: int, from_index: int) -> int:
        if self.term_at(from_index) != term:
            raise StoreError(f"entry {from_index} is not of term {term}", "UNEXPECTED_ARGUMENT")
        b = self.log_base
        lowest = b.index if b is not None else self.ledger_begin_index
        i = from_index
        while i > lowest and self.term_at(i - 1) == term:
            i -= 1
        return i

    @property
    def log_base(self) -> LogBase | None:
        """Same contract as SegmentStore.log_base: the snapshot this log begins after, while
        the log begins right after it."""
        b = self._base
        if b is not None and self.ledger_begin_index == b.index + 1:
            return b
        return None

    def reset_to(self, snapshot_index: int, snapshot_term: int) -> None:
        """Same contract as SegmentStore.reset_to: every entry goes; the log is empty and
        begins at S + 1 (end S, end term T, committed S, term_at(S) = T); the generation moves.
        Positions keep growing (the next entry's position is past every earlier one), as the
        segment store's do."""
        if snapshot_index < 0 or snapshot_term < 0:
            raise StoreError(f"reset_to({snapshot_index}, {snapshot_term}): index and term must be "
                             ">= 0", "UNEXPECTED_ARGUMENT")
        self.generation += 2
        self._entries.clear()
        self._base = LogBase(snapshot_index, snapshot_term, self._pos)
        self.ledger_begin_index = snapshot_index + 1
        self.ledger_end_index = snapshot_index
        self.ledger_end_term = snapshot_term
        self.committed_index = snapshot_index

    def truncate(self, index: int) -> None:
        if index <= self.committed_index:
            raise StoreError(f"truncate({index}) would drop committed entries", "UNEXPECTED_ARGUMENT")
        if index > self.ledger_end_index:
            return
        base = self.log_base
        if index < self.ledger_begin_index or (index == self.ledger_begin_index and index > 0
                                                and base is None):
            raise IndexOutOfRange(f"truncate({index}) at or below ledger begin {self.ledger_begin_index}")
        self.generation += 2
        keep = index - self.ledger_begin_index
        dropped = self._entries[keep:]
        del self._entries[keep:]
        self._pos -= sum(map(len, dropped))
        if not self._entries and base is not None:
            self.ledger_end_index, self.ledger_end_term = base.index, base.term  # empty at its base
        elif not self._entries:
            self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
        else:
            self.ledger_end_index = index - 1
            self.ledger_end_term = self.term_at(index - 1)

    def set_committed_index(self, index: int) -> None:
        index = min(index, self.ledger_end_index)
        if index > self.committed_index:
            self.committed_index = index

    @property
    def size_bytes(self) -> int:
        return self._pos

    @property
    def data_end_pos(self) -> int:
        """The encoded bytes held, as a data file's write position would count them."""
        return self._pos
