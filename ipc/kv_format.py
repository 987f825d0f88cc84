"""The KV store's byte formats, as the client sends and reads them: commands (log entry
bodies), per-entry results, read queries and their replies, and the limits they obey.

Both ends need one definition: the client (ipc/kv_client.py) encodes commands and queries and
decodes results and replies; the state machine (node/statemachine/kv.py, whose docstring
documents every layout, the revision model and the snapshot stream) decodes commands and
encodes the answers. It lives on the wire side so the client needs nothing from node/;
node/statemachine/kv.py re-exports every name. Pure: bytes in, values out. Big-endian.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAX_KEY_SIZE: Final = 4 * 1024
MAX_VALUE_SIZE: Final = 1024 * 1024
MAX_SCAN_LIMIT: Final = 10_000
MAX_REPLY_BYTES: Final = 4 * 1024 * 1024  # a scan reply stops at ~this size (at least one item)


class Op(enum.IntEnum):
    PUT = 0x01
    DELETE = 0x02
    CAS = 0x03
    GET = 0x41  # queries: never in the log
    SCAN = 0x42


class Expect(enum.IntEnum):
    """What a CAS compares against."""

    ABSENT = 0
    VALUE = 1
    REVISION = 2


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    CAS_FAILED = 2
    # refused: no state change
    MALFORMED = 16
    UNKNOWN_OP = 17
    EMPTY_KEY = 18
    KEY_TOO_LARGE = 19
    VALUE_TOO_LARGE = 20


KEY_HDR = struct.Struct(">BH")  # PUT, DELETE, GET
CAS_HDR = struct.Struct(">BBHI")
SCAN_HDR = struct.Struct(">BHHI")
U64 = struct.Struct(">Q")
RESULT = struct.Struct(">BQ")
REPLY = struct.Struct(">BQBI")
ITEM = struct.Struct(">HIQQQ")


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


@dataclass(frozen=True, slots=True)
class Cas:
    key: bytes
    expect: Expect
    value: bytes
    expected_value: bytes = b""  # Expect.VALUE
    expected_revision: int = 0  # Expect.REVISION


@dataclass(frozen=True, slots=True)
class Invalid:
    """A body or an argument that cannot be applied: the status and message of its result."""

    status: Status
    message: str


Command = Put | Delete | Cas

Record = tuple[bytes, int, int, int]
"""One key's state: value, create_revision, mod_revision, version."""


def cas_matches(cmd: Cas, old: Record | None) -> bool:
    """Whether a CAS swaps, given the key's record before it (None: absent). The one rule the
    state machine applies and a watcher replays (ipc/kv_watch.py): they must never differ."""
    if cmd.expect == Expect.ABSENT:
        return old is None
    if old is None:
        return False
    if cmd.expect == Expect.VALUE:
        return old[0] == cmd.expected_value
    return old[2] == cmd.expected_revision


def next_record(old: Record | None, value: bytes, index: int) -> Record:
    """The key's record after a put (or a CAS that swapped) at revision `index`: a new key
    starts at version 1 and is created there; an existing one keeps its create_revision."""
    if old is None:
        return (value, index, index, 1)
    return (value, old[1], index, old[3] + 1)


class KVInputError(ValueError):
    """Client side: an argument the store would refuse (``.status`` says which rule)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_key(key: bytes) -> Invalid | None:
    """The key rules, shared by the client's pre-check and ``apply``."""
    if not key:
        return Invalid(Status.EMPTY_KEY, "empty key")
    if len(key) > MAX_KEY_SIZE:
        return Invalid(Status.KEY_TOO_LARGE, f"key of {len(key)} bytes exceeds the limit of {MAX_KEY_SIZE}")
    return None


def check_value(value: bytes, what: str = "value") -> Invalid | None:
    if len(value) > MAX_VALUE_SIZE:
        return Invalid(Status.VALUE_TOO_LARGE,
                       f"{what} of {len(value)} bytes exceeds the limit of {MAX_VALUE_SIZE}")
    return None


def _as_bytes(x: object, what: str) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, bytearray | memoryview):
        return bytes(x)
    raise TypeError(f"{what} must be bytes, not {type(x).__name__}")


def _checked(key: object, *values: tuple[object, str]) -> tuple[bytes, ...]:
    k = _as_bytes(key, "key")
    out = [k]
    bad = check_key(k)
    for v, what in values:
        b = _as_bytes(v, what)
        bad = bad or check_value(b, what)
        out.append(b)
    if bad:
        raise KVInputError(bad.status, bad.message)
    return tuple(out)


def encode_put(key: bytes, value: bytes) -> bytes:
    """The body of a PUT entry. Raises TypeError / KVInputError for what apply would refuse."""
    k, v = _checked(key, (value, "value"))
    return b"".join((KEY_HDR.pack(Op.PUT, len(k)), k, v))


def encode_delete(key: bytes) -> bytes:
    (k,) = _checked(key)
    return KEY_HDR.pack(Op.DELETE, len(k)) + k


def encode_cas(key: bytes, expected: bytes | None, value: bytes) -> bytes:
    """Set `key` to `value` if its current value is `expected` (None: if it is absent)."""
    if expected is None:
        k, v = _checked(key, (value, "value"))
        return b"".join((CAS_HDR.pack(Op.CAS, Expect.ABSENT, len(k), 0), k, v))
    k, v, e = _checked(key, (value, "value"), (expected, "expected value"))
    return b"".join((CAS_HDR.pack(Op.CAS, Expect.VALUE, len(k), len(e)), k, e, v))


def encode_cas_revision(key: bytes, mod_revision: int, value: bytes) -> bytes:
    """Set `key` to `value` if its mod_revision is `mod_revision` (no ABA, unlike by value)."""
    k, v = _checked(key, (value, "value"))
    if not isinstance(mod_revision, int) or not 1 <= mod_revision < 1 << 64:
        raise KVInputError(Status.MALFORMED, f"expected revision {mod_revision!r} outside 1..2**64-1")
    return b"".join((CAS_HDR.pack(Op.CAS, Expect.REVISION, len(k), 8), k, U64.pack(mod_revision), v))


def decode_command(body: bytes) -> Command | Invalid:
    """The command in an entry body, or why it cannot be applied. Never raises: a malformed
    entry in the log must become an error result, the same on every replica."""
    n = len(body)
    if n == 0:
        return Invalid(Status.MALFORMED, "empty command")
    op = body[0]
    if op == Op.PUT or op == Op.DELETE:
        if n < 3:
            return Invalid(Status.MALFORMED, f"command of {n} bytes is shorter than its header")
        klen = (body[1] << 8) | body[2]
        end = 3 + klen
        if end > n:
            return Invalid(Status.MALFORMED, f"key length {klen} runs past the command's {n} bytes")
        key = body[3:end]
        bad = check_key(key)
        if op == Op.PUT:
            value = body[end:]
            return bad or check_value(value) or Put(key, value)
        if end != n:
            return Invalid(Status.MALFORMED, f"DELETE with {n - end} bytes after the key")
        return bad or Delete(key)
    if op == Op.CAS:
        if n < CAS_HDR.size:
            return Invalid(Status.MALFORMED, f"command of {n} bytes is shorter than its header")
        _, expect, klen, olen = CAS_HDR.unpack_from(body)
        kend = CAS_HDR.size + klen
        oend = kend + olen
        if oend > n:
            return Invalid(Status.MALFORMED, f"CAS lengths {klen}+{olen} run past the command's {n} bytes")
        key, operand, value = body[CAS_HDR.size:kend], body[kend:oend], body[oend:]
        bad = check_key(key) or check_value(value)
        if expect == Expect.ABSENT:
            if olen:
                return Invalid(Status.MALFORMED, "CAS expecting absence carries an operand")
            return bad or Cas(key, Expect.ABSENT, value)
        if expect == Expect.VALUE:
            return bad or check_value(operand, "expected value") or Cas(key, Expect.VALUE, value, operand)
        if expect == Expect.REVISION:
            if olen != 8:
                return Invalid(Status.MALFORMED, f"CAS revision operand of {olen} bytes, not 8")
            return bad or Cas(key, Expect.REVISION, value, expected_revision=U64.unpack(operand)[0])
        return Invalid(Status.MALFORMED, f"unknown CAS expectation {expect}")
    if op == Op.GET or op == Op.SCAN:
        return Invalid(Status.UNKNOWN_OP, f"op 0x{op:02x} is a query, not a command")
    return Invalid(Status.UNKNOWN_OP, f"unknown op 0x{op:02x}")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class KVResult:
    """A decoded entry result (see the module docstring for what `revision` means per status)."""

    status: Status
    revision: int
    message: str = ""

    @property
    def ok(self) -> bool:
        """The command was valid (it may still have found nothing or lost its CAS)."""
        return self.status < Status.MALFORMED

    @property
    def changed(self) -> bool:
        """The state changed: a put, a delete of a present key, a CAS that swapped."""
        return self.status == Status.OK


def encode_result(status: Status, revision: int, message: str = "") -> bytes:
    head = RESULT.pack(status, revision)
    return head + message.encode() if message else head


def decode_result(data: bytes) -> KVResult:
    """Client side. Raises ValueError on bytes that are not a KV result (a node not running
    the KV state machine answered)."""
    if len(data) < RESULT.size:
        raise ValueError(f"KV result of {len(data)} bytes is shorter than {RESULT.size}")
    status, revision = RESULT.unpack_from(data)
    try:
        st = Status(status)
    except ValueError:
        raise ValueError(f"unknown KV result status {status}") from None
    return KVResult(st, revision, bytes(data[RESULT.size:]).decode(errors="replace"))


# --------------------------------------------------------------------------- queries


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key's state. ``revision`` is its mod_revision (what KVClient.get reports)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int

    @property
    def revision(self) -> int:
        return self.mod_revision


@dataclass(frozen=True, slots=True)
class QueryReply:
    status: Status
    revision: int  # the store's revision when the read was served
    items: list[KeyValue]
    more: bool = False  # SCAN: stopped at the limit or the reply size; continue after items[-1]
    message: str = ""


def encode_get(key: bytes) -> bytes:
    (k,) = _checked(key)
    return KEY_HDR.pack(Op.GET, len(k)) + k


def encode_scan(prefix: bytes = b"", limit: int = MAX_SCAN_LIMIT, start: bytes = b"") -> bytes:
    """Keys starting with `prefix` (empty: all), from `start` on. To page, pass the last key
    returned + b"\\0" as the next `start`."""
    p, s = _as_bytes(prefix, "prefix"), _as_bytes(start, "start")
    for b, what in ((p, "prefix"), (s, "start")):
        if len(b) > MAX_KEY_SIZE:
            raise KVInputError(Status.KEY_TOO_LARGE, f"{what} of {len(b)} bytes exceeds the limit of {MAX_KEY_SIZE}")
    if not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise KVInputError(Status.MALFORMED, f"scan limit {limit!r} outside 1..{MAX_SCAN_LIMIT}")
    return b"".join((SCAN_HDR.pack(Op.SCAN, len(p), len(s), limit), p, s))


def _item(kv: KeyValue) -> bytes:
    return b"".join((ITEM.pack(len(kv.key), len(kv.value), kv.create_revision, kv.mod_revision,
                                kv.version), kv.key, kv.value))


def encode_query_reply(status: Status, revision: int, items: Sequence[KeyValue] = (),
                       more: bool = False, message: str = "") -> bytes:
    parts = [REPLY.pack(status, revision, more, len(items))]
    parts.extend(_item(kv) for kv in items)
    parts.append(message.encode())
    return b"".join(parts)


def decode_query_reply(data: bytes) -> QueryReply:
    """Client side; raises ValueError on a reply that does not parse."""
    mv = memoryview(data)
    if len(mv) < REPLY.size:
        raise ValueError(f"KV reply of {len(mv)} bytes is shorter than {REPLY.size}")
    status, revision, more, count = REPLY.unpack_from(mv)
    off, items = REPLY.size, []
    for _ in range(count):
        if off + ITEM.size > len(mv):
            raise ValueError("KV reply truncated inside an item header")
        klen, vlen, crev, mrev, ver = ITEM.unpack_from(mv, off)
        off += ITEM.size
        if off + klen + vlen > len(mv):
            raise ValueError("KV reply truncated inside an item")
        items.append(KeyValue(bytes(mv[off:off + klen]), bytes(mv[off + klen:off + klen + vlen]),
                              crev, mrev, ver))
        off += klen + vlen
    try:
        st = Status(status)
    except ValueError:
        raise ValueError(f"unknown KV reply status {status}") from None
    return QueryReply(st, revision, items, bool(more), bytes(mv[off:]).decode(errors="replace"))
