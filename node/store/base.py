"""What every log store offers (the segment store and the memory store), and how it fails.

Kept apart from both implementations so the handler, the tests and embedding code program
against one interface (hashicorp/raft's LogStore idea) and can swap the memory store in.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from node.store.codec import BLANK_SIZE, HEADER_SIZE, Entry

DEFAULT_DATA_FILE_SIZE = 1 << 30  # DLedger: 1 GiB
DEFAULT_INDEX_FILE_SIZE = 5_242_880 * 32  # DLedger: 160 MiB = 5,242,880 index records
FLUSH_MODES = ("async", "sync")


class StoreError(Exception):
    """A request the store refuses. `code_name` is the DLedgerResponseCode name to answer with."""

    code_name = "INTERNAL_ERROR"

    def __init__(self, message: str, code_name: str | None = None) -> None:
        super().__init__(message)
        if code_name:
            self.code_name = code_name


class DiskFull(StoreError):
    """The file system refused space (ENOSPC, EDQUOT): the write did not happen."""

    code_name = "DISK_FULL"


class DiskError(StoreError):
    """Any other I/O failure of the store's files (EIO, EROFS, ...)."""

    code_name = "DISK_ERROR"


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def store_error_from_os(e: OSError, action: str) -> StoreError:
    """The store error for an OSError met while doing `action` ("append", "truncate", ...).

    Why: callers (the handler) answer and decide on StoreError alone; a bare OSError escaping
    a write path crash-looped the handler (ENOSPC on a file roll) while its elector kept
    leading. The message names the file, which fd-based calls do not do by themselves
    (node.store.mmap_file attaches it).
    """
    where = f"{e.filename}: " if e.filename else ""
    reason = e.strerror or str(e)
    cls = DiskFull if e.errno in _FULL_ERRNOS else DiskError
    return cls(f"{action}: {where}{reason}")


class IndexOutOfRange(StoreError):
    code_name = "INDEX_OUT_OF_RANGE"


class InconsistentAppend(StoreError):
    """A follower append that is not exactly ledgerEnd + 1, or whose term goes backwards."""

    code_name = "INCONSISTENT_INDEX"


class CorruptEntry(StoreError):
    """A stored entry failed its checks on read (magic, index, CRC)."""

    code_name = "DISK_ERROR"


class StoreCorruptError(StoreError):
    """Recovery found a *committed* entry damaged or missing: refuse to start, loudly.

    Serving it or silently cutting it would break the promise that committed entries are
    forever; an operator must decide (restore the replica from a healthy peer).
    """

    code_name = "DISK_ERROR"


_ENTRY_NAMED = re.compile(r"\bentry (\d+)")


def committed_damage(store_dir: object, index: int, committed: int, problem: str) -> StoreCorruptError:
    """The one error for a damaged committed entry, wherever it is found (recovery at open,
    the scrub, a read): it names the store, the entry and what is wrong. Whoever gets it hands
    it to the node's damage path (node.roles.store_damage) and never serves the entry.

    `index` is where the check started (a run's first entry); when `problem` names an entry
    (every check of a run does: "push entry 7: body CRC mismatch"), that one is named."""
    m = _ENTRY_NAMED.search(problem)
    if m and index <= int(m.group(1)) <= max(committed, index):
        index = int(m.group(1))
    err = StoreCorruptError(
        f"{store_dir}: committed entry {index} (committed index {committed}) is damaged: "
        f"{problem}. Refusing to serve it; it is fetched again from a peer (repair).")
    err.index = index  # the first bad entry, for the handler's damage path (mark_damaged)
    return err


class AppendResult(NamedTuple):
    index: int
    term: int
    pos: int


@dataclass(frozen=True)
class StoreConfig:
    store_dir: str
    data_file_size: int = DEFAULT_DATA_FILE_SIZE
    index_file_size: int = DEFAULT_INDEX_FILE_SIZE
    flush_mode: str = "async"  # "async": flushed by a background service; "sync": per append
    flush_interval_ms: int = 100
    checkpoint_interval_ms: int = 1000
    recover_verify_files: int = 3  # data files at the tail whose entries get CRC-checked at open
    verify_push_crc: bool = True  # a follower checks the bytes it receives (run CRC or body CRCs)

    def validate(self) -> list[str]:
        """One message per bad field, so the launcher can report them all at once."""
        errs = []
        if self.data_file_size < 4096:
            errs.append(f"data_file_size must be >= 4096 (got {self.data_file_size})")
        if self.index_file_size < 32 or self.index_file_size % 32:
            errs.append(f"index_file_size must be a positive multiple of 32 (got {self.index_file_size})")
        if self.flush_mode not in FLUSH_MODES:
            errs.append(f"flush_mode must be one of {FLUSH_MODES} (got {self.flush_mode!r})")
        if self.flush_interval_ms < 1:
            errs.append("flush_interval_ms must be >= 1")
        if self.checkpoint_interval_ms < 1:
            errs.append("checkpoint_interval_ms must be >= 1")
        return errs

    @property
    def max_body_size(self) -> int:
        """The largest body that fits in one data file with its header and a BLANK marker."""
        return self.data_file_size - HEADER_SIZE - BLANK_SIZE


class LogStore(Protocol):
    """The store interface the handler and dispatchers use."""

    ledger_begin_index: int
    ledger_end_index: int
    ledger_end_term: int
    committed_index: int

    @property
    def generation(self) -> int:
        """The reader fence (docs/store.md "The generation fence"): even between operations,
        moved by every destructive change. Published with the ledger end."""
        ...

    def open(self) -> None: ...
    def close(self) -> None: ...
    def append_leader(self, body: bytes, term: int, magic: int = ..., session: int = ...,
                      seq: int = ...) -> AppendResult: ...
    def append_leader_batch(self, bodies: list[bytes], term: int) -> list[AppendResult]: ...
    def append_batch_raw(self, bodies: list[bytes], term: int, session: int = ...,
                         first_seq: int | list[int] = ...) -> tuple[int, list[int]]: ...
    def append_follower(self, blob: bytes | memoryview, index_records: bytes | memoryview = b"",
                        run_crc: int | None = None) -> int: ...
    def get(self, index: int) -> Entry: ...
    def get_range(self, index: int, count: int) -> list[Entry]: ...
    def get_raw(self, index: int, max_count: int, max_bytes: int) -> tuple[memoryview | bytes, int]: ...
    def get_checked(self, index: int, max_count: int, max_bytes: int) -> tuple[memoryview | bytes, int]: ...
    def term_at(self, index: int) -> int: ...
    def first_index_of_term(self, term: int, from_index: int) -> int: ...
    def truncate(self, index: int) -> None: ...
    def reset_to(self, snapshot_index: int, snapshot_term: int) -> None:
        """Replace the whole log by an empty one that begins after a snapshot (index S, term
        T): begin S + 1, end S, end term T, committed S (docs/store.md "A log that begins
        after a snapshot"). For installing a snapshot on a follower."""
        ...

    @property
    def log_base(self) -> Any:
        """(index, term, data position) of the snapshot the log begins after, while it still
        begins right after it (`node.store.layout.LogBase`); None otherwise."""
        ...

    @property
    def data_end_pos(self) -> int:
        """Bytes ever written to the data files, minus truncations: the ledger end's data
        position (/metrics: a follower's lag in bytes, bytes appended)."""
        ...

    # Called with each fdatasync's duration in µs (/metrics `fsync_us`); None: not timed.
    flush_observer: Callable[[int], None] | None

    def set_committed_index(self, index: int) -> None: ...
    def flush(self) -> None: ...
    def has_room(self) -> bool:
        """Whether a write that failed with DiskFull could succeed now (free space for one more
        data file): a node that stepped down for a full disk asks this to stand again."""
        ...
