"""The replicated KV store's state machine (docs/statemachine.md "The KV state machine"): a map of
bytes to bytes with etcd-like revisions, built by applying the committed log. Pure: bytes in, bytes
out.

Everything that crosses a process boundary is documented here, once, so KVClient, the applier
and the read path agree: the command encoding (log entry bodies), the per-entry result, the
read queries and their replies, and the snapshot stream. The first three are implemented in
ipc/kv_format.py (the client encodes and decodes them too; their names are re-exported here),
the snapshot stream here. Big-endian, like the rest of the wire (ipc/protocol.py) and the store
(node/store/codec.py).

Commands (a log entry's body). The first byte is the op; ops 0x01-0x3F are log commands of
format 1. An op's layout never changes: a new layout takes a new op byte, and every replica
must be upgraded before a client sends it (an old replica would answer UNKNOWN_OP where a new
one applies it: the replicas would diverge)::

    PUT     0x01  u16 key_len | key | value (the rest of the body)
    DELETE  0x02  u16 key_len | key                         (nothing after the key)
    CAS     0x03  u8 expect | u16 key_len | u32 operand_len | key | operand | value (the rest)
                  expect: 0 ABSENT (operand empty), 1 VALUE (operand = the expected value),
                          2 REVISION (operand = u64 expected mod_revision)

Result of an entry (``apply`` returns one per entry)::

    u8 status | u64 revision | message (UTF-8, errors only)

    OK          the mutation happened; revision = its revision (the entry's log index)
    NOT_FOUND   DELETE of an absent key: no change; revision = the store's revision
    CAS_FAILED  no change; revision = the key's mod_revision, 0 if absent (retry by revision)
    16 and up   the entry is refused (malformed, unknown op, empty/oversized key or value): no
                change, on every replica alike; revision = the store's revision

Revisions. The revision of a mutation is the log index of its entry. Like etcd's store-wide
revision it is a single counter that strictly increases with every successful mutation and
orders all of them; unlike etcd's it is sparse (NOOPs, refused commands, failed CAS and other
state machines' bookkeeping take indices too). Chosen because it needs no state to be
deterministic, a revision *is* a log position (``dledger dump`` shows the entry that wrote a
value; a read served at applied index i sees exactly the revisions <= i, which is what the
read-index path reasons in), and the client learns it from the append result. Index 0 is the
first leader's NOOP, so revisions start at 1 and 0 means "none". Per key, as in etcd:
create_revision, mod_revision and version (1 at creation, +1 per change; a delete forgets the
key, so a later put starts again at version 1).

Limits (``MAX_KEY_SIZE``, ``MAX_VALUE_SIZE``) are part of the format, equal on every replica:
keys 1 B .. 4 KiB (short keys keep scans and snapshots cheap; etcd has only its 1.5 MiB request
limit), values 0 .. 1 MiB, so a CAS carrying two values (2 MiB + key + 8) still fits DLedger's
4 MiB default ``max_body_size``. The client pre-checks with the same ``check_key`` /
``check_value``.

Queries (read-only, answered by ``query`` after the read index is applied, never in the log)::

    GET   0x41  u16 key_len | key
    SCAN  0x42  u16 prefix_len | u16 start_len | u32 limit | prefix | start
                keys starting with prefix, from max(prefix, start) on, in byte order
    reply: u8 status | u64 store revision | u8 more | u32 count | count x item | message
    item:  u16 key_len | u32 value_len | u64 create_rev | u64 mod_rev | u64 version | key | value

Snapshot stream (canonical: keys in byte order, so equal states give equal bytes)::

    header   "DLKV" | u16 format 1 | u16 flags 0 | i64 last_index | u64 revision | u64 count
    count x  item (as above), keys strictly increasing
    trailer  "DLKE" | u32 CRC-32C of every byte before the trailer
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import BinaryIO, Final

from crc32c import crc32c

# The formats the client shares (commands, results, queries) live in ipc/kv_format.py; every
# public name is re-exported here, so the node's modules and tools keep importing them from here.
from ipc.kv_format import ITEM as _ITEM
from ipc.kv_format import KEY_HDR as _KEY_HDR
from ipc.kv_format import (  # noqa: F401
    MAX_KEY_SIZE,
    MAX_REPLY_BYTES,
    MAX_SCAN_LIMIT,
    MAX_VALUE_SIZE,
    Cas,
    Command,
    Delete,
    Expect,
    Invalid,
    KeyValue,
    KVInputError,
    KVResult,
    Op,
    Put,
    QueryReply,
    Record,
    Status,
    cas_matches,
    check_key,
    check_value,
    decode_command,
    decode_query_reply,
    decode_result,
    encode_cas,
    encode_cas_revision,
    encode_delete,
    encode_get,
    encode_put,
    encode_query_reply,
    encode_result,
    encode_scan,
    next_record,
)
from ipc.kv_format import RESULT as _RESULT
from ipc.kv_format import SCAN_HDR as _SCAN_HDR
from node.statemachine.api import CommittedEntry, Result, StateMachine, StateMachineError

SNAPSHOT_MAGIC: Final = b"DLKV"
SNAPSHOT_END: Final = b"DLKE"
SNAPSHOT_FORMAT: Final = 1
_CHUNK: Final = 1 << 20  # snapshot streams are written and read in ~1 MiB pieces

_SNAP_HDR = struct.Struct(">4sHHqQQ")
_SNAP_END = struct.Struct(">4sI")


# --------------------------------------------------------------------------- the key order


class _KeyOrder:
    """The live keys in byte order, for scans and canonical snapshots, maintained lazily.

    A sorted list with O(n) inserts would make every put of a new key cost a memmove of the
    whole list; sorting on every scan costs O(n log n). Instead: new keys collect in a set,
    deleted ones stay in the list as stale entries (a scan skips them), and the next scan
    merges — ``list.sort`` on two sorted runs is a linear merge. So a scan costs
    O(log n + k) when no key was created since the last one, and O(n + m log m) after m
    creations (~20 ms per million keys here); apply never pays more than a set insert."""

    __slots__ = ("_sorted", "_added", "_stale")

    def __init__(self, sorted_keys: list[bytes] | None = None) -> None:
        self._sorted: list[bytes] = sorted_keys if sorted_keys is not None else []
        self._added: set[bytes] = set()
        self._stale = 0

    def created(self, key: bytes) -> None:
        if self._stale:
            i = bisect_left(self._sorted, key)
            if i < len(self._sorted) and self._sorted[i] == key:  # deleted earlier, back again
                self._stale -= 1
                return
        self._added.add(key)

    def deleted(self, key: bytes) -> None:
        if key in self._added:
            self._added.remove(key)
        else:
            self._stale += 1

    def keys(self, live: Mapping[bytes, object], compact: bool = False) -> list[bytes]:
        """The sorted list; it may hold stale keys (absent from `live`) unless `compact`."""
        if self._stale and (compact or self._stale * 4 > len(self._sorted)):
            self._sorted = [k for k in self._sorted if k in live]
            self._stale = 0
        if self._added:
            self._sorted.extend(sorted(self._added))
            self._sorted.sort()
            self._added.clear()
        return self._sorted


# --------------------------------------------------------------------------- snapshot streams


class SnapshotFormatError(ValueError):
    """A KV snapshot stream that is damaged, truncated or of an unknown format."""


class _Sink:
    """Buffers small writes into ~1 MiB pieces and keeps the running CRC-32C."""

    def __init__(self, writer: BinaryIO) -> None:
        self.writer, self.buf, self.crc = writer, bytearray(), 0

    def write(self, *parts: bytes) -> None:
        for p in parts:
            self.buf += p
        if len(self.buf) >= _CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.crc = crc32c(self.buf, self.crc)
            self.writer.write(bytes(self.buf))  # a copy: a streaming writer may keep the object
            self.buf.clear()


class _Source:
    """Reads exact sizes from a stream in ~1 MiB pieces and keeps the CRC-32C of what was
    consumed (short reads, as from a pipe or socket, are fine)."""

    def __init__(self, reader: BinaryIO) -> None:
        self.reader, self.buf, self.pos, self.crc, self.crc_pos = reader, b"", 0, 0, 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            self._fill(n)
            end = n
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def _fill(self, n: int) -> None:
        self.checksum()
        parts, need = [self.buf[self.pos:]], n - (len(self.buf) - self.pos)
        while need > 0:
            chunk = self.reader.read(max(_CHUNK, need))
            if not chunk:
                raise SnapshotFormatError("KV snapshot truncated")
            parts.append(chunk)
            need -= len(chunk)
        self.buf, self.pos, self.crc_pos = b"".join(parts), 0, 0

    def checksum(self) -> int:
        """The CRC of every byte consumed so far."""
        if self.pos > self.crc_pos:
            self.crc = crc32c(memoryview(self.buf)[self.crc_pos:self.pos], self.crc)
            self.crc_pos = self.pos
        return self.crc

    def at_end(self) -> bool:
        return self.pos == len(self.buf) and not self.reader.read(1)


# --------------------------------------------------------------------------- the state machine

_Rec = Record  # value, create_revision, mod_revision, version


class KVStateMachine(StateMachine):
    """The built-in KV store (``--state-machine kv``). Takes no options."""

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        if self.options:
            raise ValueError(f"the kv state machine takes no options, got {', '.join(sorted(self.options))}")
        self._data: dict[bytes, _Rec] = {}
        self._order = _KeyOrder()
        self._revision = 0  # the revision of the last mutation, 0 before any
        self._last_index = -1  # the last index applied: the applier's order is checked

    # -- state
    @property
    def revision(self) -> int:
        """The store's revision: that of its last mutation (0: none yet)."""
        return self._revision

    @property
    def last_index(self) -> int:
        """The index of the last entry applied (-1: none)."""
        return self._last_index

    def __len__(self) -> int:
        return len(self._data)

    # -- apply
    def apply(self, entries: Sequence[CommittedEntry]) -> list[Result]:
        out: list[Result] = []
        for e in entries:
            if e.index <= self._last_index:
                raise StateMachineError(f"kv: entry {e.index} applied after {self._last_index}")
            self._last_index = e.index
            body = e.body if type(e.body) is bytes else bytes(e.body)
            out.append(self._apply_one(e.index, body))
        return out

    def _apply_one(self, index: int, body: bytes) -> bytes:
        cmd = decode_command(body)
        data = self._data
        if type(cmd) is Put:
            return self._set(cmd.key, cmd.value, index, data.get(cmd.key))
        if type(cmd) is Delete:
            if data.pop(cmd.key, None) is None:
                return _RESULT.pack(Status.NOT_FOUND, self._revision)
            self._order.deleted(cmd.key)
            self._revision = index
            return _RESULT.pack(Status.OK, index)
        if type(cmd) is Cas:
            old = data.get(cmd.key)
            if not cas_matches(cmd, old):
                return _RESULT.pack(Status.CAS_FAILED, 0 if old is None else old[2])
            return self._set(cmd.key, cmd.value, index, old)
        assert type(cmd) is Invalid
        return encode_result(cmd.status, self._revision, cmd.message)

    def _set(self, key: bytes, value: bytes, index: int, old: _Rec | None) -> bytes:
        """A put, or a CAS that swapped: the key's new record at revision `index`."""
        if old is None:
            self._order.created(key)
        self._data[key] = next_record(old, value, index)
        self._revision = index
        return _RESULT.pack(Status.OK, index)

    # -- reads
    def get(self, key: bytes) -> KeyValue | None:
        """The key's value and revisions, or None (local state: linearizable only when called
        after the read index was applied)."""
        rec = self._data.get(key)
        return None if rec is None else KeyValue(key, *rec)

    def scan(self, prefix: bytes = b"", limit: int | None = None, *, start: bytes = b"") -> list[KeyValue]:
        """Keys starting with `prefix`, from max(prefix, start) on, in byte order; at most
        `limit` (None: all)."""
        return self._scan(prefix, start, limit, None)[0]

    def _scan(self, prefix: bytes, start: bytes, limit: int | None,
              max_bytes: int | None) -> tuple[list[KeyValue], bool]:
        data = self._data
        keys = self._order.keys(data)
        out: list[KeyValue] = []
        size = 0
        i = bisect_left(keys, max(prefix, start))
        while i < len(keys):
            k = keys[i]
            i += 1
            if not k.startswith(prefix):
                break
            rec = data.get(k)
            if rec is None:
                continue  # stale: deleted since the order was last compacted
            if (limit is not None and len(out) >= limit) or (max_bytes is not None and out and size >= max_bytes):
                return out, True
            out.append(KeyValue(k, *rec))
            size += _ITEM.size + len(k) + len(rec[0])
        return out, False

    def query(self, request: bytes) -> bytes:
        """GET or SCAN (module docstring); a malformed request gets an error reply, never an
        exception (it comes from a client)."""
        req = bytes(request)
        n = len(req)
        op = req[0] if n else None
        if op == Op.GET and n >= _KEY_HDR.size and _KEY_HDR.size + _KEY_HDR.unpack_from(req)[1] == n:
            key = req[_KEY_HDR.size:]
            bad = check_key(key)
            if bad:
                return encode_query_reply(bad.status, self._revision, message=bad.message)
            kv = self.get(key)
            if kv is None:
                return encode_query_reply(Status.NOT_FOUND, self._revision)
            return encode_query_reply(Status.OK, self._revision, [kv])
        if op == Op.SCAN and n >= _SCAN_HDR.size:
            _, plen, slen, limit = _SCAN_HDR.unpack_from(req)
            if _SCAN_HDR.size + plen + slen == n and 1 <= limit <= MAX_SCAN_LIMIT:
                prefix = req[_SCAN_HDR.size:_SCAN_HDR.size + plen]
                start = req[_SCAN_HDR.size + plen:]
                items, more = self._scan(prefix, start, limit, MAX_REPLY_BYTES)
                return encode_query_reply(Status.OK, self._revision, items, more)
        if op is not None and op not in (Op.GET, Op.SCAN):
            return encode_query_reply(Status.UNKNOWN_OP, self._revision, message=f"unknown query op 0x{op:02x}")
        return encode_query_reply(Status.MALFORMED, self._revision, message="malformed query")

    # -- snapshots
    def snapshot(self, writer: BinaryIO) -> None:
        """Stream the state in key order (module docstring), ~1 MiB per write."""
        data = self._data
        keys = self._order.keys(data, compact=True)
        sink = _Sink(writer)
        sink.write(_SNAP_HDR.pack(SNAPSHOT_MAGIC, SNAPSHOT_FORMAT, 0, self._last_index,
                                  self._revision, len(keys)))
        pack = _ITEM.pack
        for k in keys:
            v, crev, mrev, ver = data[k]
            sink.write(pack(len(k), len(v), crev, mrev, ver), k, v)
        sink.flush()
        writer.write(_SNAP_END.pack(SNAPSHOT_END, sink.crc))

    def restore(self, reader: BinaryIO) -> None:
        """Replace the state with the stream's. Every record is checked as it is read (limits,
        key order, revisions) and the CRC at the end; the new map is built aside and swapped in
        only when all of it is good, so a damaged stream leaves the current state as it was."""
        src = _Source(reader)
        magic, fmt, flags, last_index, revision, count = _SNAP_HDR.unpack(src.take(_SNAP_HDR.size))
        if magic != SNAPSHOT_MAGIC:
            raise SnapshotFormatError(f"not a KV snapshot (magic {magic!r})")
        if fmt != SNAPSHOT_FORMAT or flags:
            raise SnapshotFormatError(f"KV snapshot format {fmt} flags {flags} not supported")
        if last_index < -1 or revision > max(last_index, 0):
            raise SnapshotFormatError(f"KV snapshot revision {revision} after its last index {last_index}")
        data: dict[bytes, _Rec] = {}
        keys: list[bytes] = []
        prev = b""
        unpack, item_size = _ITEM.unpack, _ITEM.size
        for _ in range(count):
            klen, vlen, crev, mrev, ver = unpack(src.take(item_size))
            if not 0 < klen <= MAX_KEY_SIZE or vlen > MAX_VALUE_SIZE:
                raise SnapshotFormatError(f"KV snapshot record {len(keys)}: sizes {klen}/{vlen} out of range")
            if not (0 < crev <= mrev <= revision and ver >= 1):
                raise SnapshotFormatError(f"KV snapshot record {len(keys)}: revisions out of range")
            k = src.take(klen)
            if k <= prev:
                raise SnapshotFormatError(f"KV snapshot record {len(keys)}: keys out of order")
            data[k] = (src.take(vlen), crev, mrev, ver)
            keys.append(k)
            prev = k
        crc = src.checksum()
        end, stored = _SNAP_END.unpack(src.take(_SNAP_END.size))
        if end != SNAPSHOT_END:
            raise SnapshotFormatError("KV snapshot damaged: no end marker after its records")
        if stored != crc:
            raise SnapshotFormatError(f"KV snapshot damaged: CRC-32C {crc:#010x}, trailer says {stored:#010x}")
        if not src.at_end():
            raise SnapshotFormatError("KV snapshot damaged: bytes after its end marker")
        self._data, self._order = data, _KeyOrder(keys)
        self._revision, self._last_index = revision, last_index
