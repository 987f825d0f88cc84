"""What a snapshot is called and what its ``meta.json`` says; the snapshot error types.

A snapshot directory is named ``<last index>-<last term>``, both 20-digit zero-padded decimals
(like the log's segment names), so a plain sort of the names is a sort by position and an
operator reading ``ls`` sees which log prefix each one covers. ``meta.json`` repeats both
numbers; a meta that disagrees with its directory's name is damaged (a bit flip in either one
would otherwise make us restore the wrong position).

Every refusal is a ``SnapshotError`` subclass with a one-line message naming the file or the
field, so the applier and the handler can log or answer it without a traceback.
docs/snapshots.md has the layout and the field table.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from node.core.membership import Configuration, decode_configuration

SNAPSHOTS_DIR = "snapshots"  # under the node's store dir
DATA_FILE = "data"
META_FILE = "meta.json"
LOCK_FILE = ".lock"
INSTALL_DIR = ".install"
FORMAT_VERSION = 1
MAX_POSITION = (1 << 63) - 1  # index and term are Java longs in DLedger; 20 digits hold them
MAX_STATE_MACHINE_NAME = 512
_DIR_NAME = re.compile(r"^(\d{20})-(\d{20})$")


class SnapshotError(Exception):
    """Base of every snapshot refusal. ``code_name`` is the response code to answer with."""

    code_name = "INTERNAL_ERROR"


class SnapshotMetaError(SnapshotError):
    """A meta (from a file or from a leader) has a missing, mistyped or out-of-range field."""


class SnapshotDamaged(SnapshotError):
    """A snapshot on disk fails its checks (meta unreadable, data size or checksum wrong)."""


class SnapshotNotFound(SnapshotError):
    """The snapshot is gone (pruned after a newer one was taken): start over with the newest."""


class SnapshotExists(SnapshotError):
    """A valid snapshot of the same last index and term is already in the store."""


class SnapshotChunkError(SnapshotError):
    """An install chunk that is not the next one (gap, overlap, resend) or runs past the size.

    ``expected_offset`` is where the receiver wants the next chunk: a sender resumes there
    (None for a bad read request on the sending side)."""

    def __init__(self, message: str, expected_offset: int | None = None) -> None:
        super().__init__(message)
        self.expected_offset = expected_offset


class SnapshotChecksumMismatch(SnapshotError):
    """A completely received snapshot is not the bytes its meta describes; nothing replaced."""


class SnapshotIncomplete(SnapshotError):
    """``install()`` before every byte arrived."""


class SnapshotStoreBusy(SnapshotError):
    """Another process holds the snapshot directory's writer lock."""


class SnapshotIOError(SnapshotError):
    """The file system failed us (ENOSPC, EIO...); the message names the file."""

    code_name = "DISK_ERROR"


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def io_error(e: OSError, action: str) -> SnapshotIOError:
    """A one-line SnapshotIOError for an OSError met while doing ``action``, naming the file
    (the same DISK_FULL / DISK_ERROR split as node.store.base.store_error_from_os)."""
    where = f"{e.filename}: " if e.filename else ""
    err = SnapshotIOError(f"{action}: {where}{e.strerror or e}")
    if e.errno in _FULL_ERRNOS:
        err.code_name = "DISK_FULL"
    return err


def check_position(last_index: object, last_term: object) -> tuple[int, int]:
    """(last_index, last_term) as ints, or SnapshotMetaError. A snapshot covers at least entry
    0, so both are >= 0; bools are refused (``True`` is an int to Python, not to a reader)."""
    for name, v in (("last_index", last_index), ("last_term", last_term)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise SnapshotMetaError(f"{name} must be an integer, not {type(v).__name__}")
        if not 0 <= v <= MAX_POSITION:
            raise SnapshotMetaError(f"{name}={v} is out of range 0..{MAX_POSITION}")
    return last_index, last_term  # type: ignore[return-value]


def dir_name(last_index: int, last_term: int) -> str:
    """The directory name of the snapshot at (last_index, last_term)."""
    return f"{last_index:020d}-{last_term:020d}"


def parse_dir_name(name: str) -> tuple[int, int] | None:
    """(last_index, last_term) of a snapshot directory name, None for any other name."""
    m = _DIR_NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def utc_iso(epoch_s: float) -> str:
    """A creation time (seconds since the epoch) as ISO 8601 UTC: for operators only, nothing
    decides by it."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """The contents of ``meta.json``; also what a leader sends ahead of an install's chunks.

    Validated on construction, so a SnapshotMeta in hand is always well-formed (a bad one from
    a file or from the wire fails where it enters, with the field named)."""

    last_index: int  # the last log index the state covers (entries <= it were applied)
    last_term: int  # that entry's term: Raft's log-matching check after a restore
    size: int  # bytes in ``data``
    crc32c: int  # CRC-32C (Castagnoli) of ``data``, unsigned 32-bit
    state_machine: str  # what wrote ``data`` (e.g. "kv"), so the wrong class is not fed it
    created: str  # ISO 8601 UTC, informational
    format: int = FORMAT_VERSION  # of this layout; a newer number is refused, not guessed
    # The configuration in force at last_index (docs/membership.md): its entry's body in
    # base64 and its index; "" / -1: none (the group never changed members up to there).
    # In meta.json one optional object, {"configuration": {"entry": ..., "index": ...}}.
    configuration: str = ""
    configuration_index: int = -1

    def __post_init__(self) -> None:
        check_position(self.last_index, self.last_term)
        self._check_configuration()
        for name in ("size", "crc32c", "format"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise SnapshotMetaError(f"{name} must be an integer, not {type(v).__name__}")
        if self.size < 0:
            raise SnapshotMetaError(f"size={self.size} is negative")
        if not 0 <= self.crc32c <= 0xFFFFFFFF:
            raise SnapshotMetaError(f"crc32c={self.crc32c} is not an unsigned 32-bit value")
        if self.format != FORMAT_VERSION:
            raise SnapshotMetaError(f"format {self.format} is not supported (this version reads "
                                    f"format {FORMAT_VERSION})")
        for name in ("state_machine", "created"):
            v = getattr(self, name)
            if not isinstance(v, str):
                raise SnapshotMetaError(f"{name} must be a string, not {type(v).__name__}")
            if len(v) > MAX_STATE_MACHINE_NAME or not v.isprintable():
                raise SnapshotMetaError(f"{name} is longer than {MAX_STATE_MACHINE_NAME} "
                                        "characters or not printable")
        if not self.state_machine:
            raise SnapshotMetaError("state_machine is empty (name the class that wrote data)")

    def _check_configuration(self) -> None:
        """A configuration must decode and lie within the snapshot: a node that installs one
        counts its voters, so a bad one is refused where it enters, with the field named."""
        c, i = self.configuration, self.configuration_index
        if not isinstance(c, str) or not isinstance(i, int) or isinstance(i, bool):
            raise SnapshotMetaError("configuration must hold a string entry and an integer index")
        if not c:
            if i != -1:
                raise SnapshotMetaError(f"configuration index {i} without an entry")
            return
        if not 0 <= i <= self.last_index:
            raise SnapshotMetaError(f"configuration index {i} is outside 0..{self.last_index}")
        self.config()

    def config(self) -> Configuration | None:
        """The configuration in force at last_index; None: none recorded (the bootstrap one)."""
        if not self.configuration:
            return None
        try:
            body = base64.b64decode(self.configuration, validate=True)
            return decode_configuration(body, self.configuration_index)
        except (ValueError, binascii.Error) as e:  # ConfigurationError is a ValueError
            raise SnapshotMetaError(f"configuration: {e}") from None

    @property
    def name(self) -> str:
        return dir_name(self.last_index, self.last_term)

    def to_json(self) -> bytes:
        """meta.json's bytes (sorted keys, one line: small, diffable, stable for tests). No
        configuration: no key, so such a meta is byte for byte what it was before the field."""
        d = asdict(self)
        entry, index = d.pop("configuration"), d.pop("configuration_index")
        if entry:
            d["configuration"] = {"entry": entry, "index": index}
        return json.dumps(d, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_dict(cls, d: object) -> SnapshotMeta:
        """A meta from decoded JSON. Unknown keys are ignored (optional fields may be added
        without a format change); missing or bad ones raise SnapshotMetaError."""
        if not isinstance(d, dict):
            raise SnapshotMetaError(f"meta must be a JSON object, not {type(d).__name__}")
        fields = ("last_index", "last_term", "size", "crc32c", "state_machine", "created",
                  "format")
        missing = [f for f in fields if f not in d]
        if missing:
            raise SnapshotMetaError(f"meta lacks {', '.join(missing)}")
        extra: dict[str, object] = {}
        if "configuration" in d:
            c = d["configuration"]
            if not isinstance(c, dict) or set(c) != {"entry", "index"}:
                raise SnapshotMetaError("configuration must be an object of entry and index")
            extra = {"configuration": c["entry"], "configuration_index": c["index"]}
        return cls(**{f: d[f] for f in fields}, **extra)

    @classmethod
    def from_json(cls, raw: bytes, source: str = "meta") -> SnapshotMeta:
        """Parse meta.json bytes; any problem is a SnapshotMetaError naming ``source``."""
        try:
            d = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an absurd integer
            raise SnapshotMetaError(f"{source}: not valid JSON ({e})") from None
        except RecursionError:
            raise SnapshotMetaError(f"{source}: not valid JSON (nested too deeply)") from None
        try:
            return cls.from_dict(d)
        except SnapshotMetaError as e:
            raise SnapshotMetaError(f"{source}: {e}") from None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot directory whose meta parsed (``SnapshotStore.verify`` checks its data)."""

    meta: SnapshotMeta
    path: Path

    @property
    def data_path(self) -> Path:
        return self.path / DATA_FILE

    @property
    def last_index(self) -> int:
        return self.meta.last_index

    @property
    def last_term(self) -> int:
        return self.meta.last_term

    @property
    def size(self) -> int:
        return self.meta.size
