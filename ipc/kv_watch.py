"""KV watch: every change of a key (or of the keys under a prefix), in revision order, built on
following the log (docs/statemachine.md "Watch").

A revision is the log index of the entry that made the change, so the changes are the KV
commands of the committed log, replayed: a PUT always changes its key; a DELETE only a key that
exists; a CAS only when it matches (`kv_format.cas_matches`, the rule the state machine itself
applies). To tell whether a DELETE or a CAS changed anything, and to give the previous value,
the watcher keeps the state of the watched keys. It gets it one of two ways:

* **from now** (no start revision): a linearizable scan of the keys, then the log from the
  scan's applied index + 1. A scan in several pages is made consistent by replaying, for each
  page's key range, the entries between that page's read and the last page's;
* **from a past revision r**: the log from its first entry, replayed silently up to r - 1.
  That needs the first entry: when retention has removed the start of the log from every
  member, the history is gone and the watch raises `KVCompactedError` (etcd's ErrCompacted):
  re-read the state (`scan`) and watch from now.

Either way the events then come from `DLedgerClient.follow`: in index order, with no gap and
no repeat, across leader changes and restarts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import kv_format as K
from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC

if TYPE_CHECKING:
    from ipc.client import Entry


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. ``kv`` is the key after a PUT (value, create_revision, mod_revision ==
    ``revision``, version); None after a DELETE. ``prev_kv`` is the key before the change when
    the watch asked for it (None: it did not exist, or was not asked for)."""

    type: str  # "PUT" or "DELETE"
    key: bytes
    revision: int
    kv: K.KeyValue | None
    prev_kv: K.KeyValue | None = None

    @property
    def value(self) -> bytes | None:
        return None if self.kv is None else self.kv.value


class KVCompactedError(DLedgerError):
    """The watch's start revision is older than the history the group still keeps (its code is
    INDEX_LESS_THAN_LOCAL_BEGIN): re-read the state with a scan and watch from now."""

    def __init__(self, message: str) -> None:
        super().__init__(RC.INDEX_LESS_THAN_LOCAL_BEGIN, message)


class KeyFilter:
    def __init__(self, key: bytes, prefix: bool) -> None:
        self.key = key
        self.prefix = prefix

    def __call__(self, k: bytes) -> bool:
        return k.startswith(self.key) if self.prefix else k == self.key


class WatchedState:
    """The records of the watched keys, advanced by committed entries."""

    def __init__(self, match: KeyFilter) -> None:
        self.match = match
        self.records: dict[bytes, K.Record] = {}

    def apply(self, index: int, body: bytes) -> tuple[str, bytes, K.Record | None, K.Record | None] | None:
        """Apply one NORMAL entry; the change it made to a watched key, as (type, key, before,
        after), or None when it changed no watched key."""
        cmd = K.decode_command(body)
        if isinstance(cmd, K.Invalid) or not self.match(cmd.key):
            return None
        key = cmd.key
        old = self.records.get(key)
        if type(cmd) is K.Delete:
            if old is None:
                return None
            del self.records[key]
            return ("DELETE", key, old, None)
        if type(cmd) is K.Cas and not K.cas_matches(cmd, old):
            return None
        new = K.next_record(old, cmd.value, index)
        self.records[key] = new
        return ("PUT", key, old, new)


def _kv(key: bytes, rec: K.Record | None) -> K.KeyValue | None:
    return None if rec is None else K.KeyValue(key, *rec)


def _scan_pages(c: DLedgerClient, match: KeyFilter, timeout: float | None
                ) -> list[tuple[int, bytes, bytes | None, list[K.KeyValue]]]:
    """Linearizable scan pages: (applied index, first key of the range, first key after it or
    None for the end, items)."""
    pages = []
    start = b""
    while True:
        q = c.query(K.encode_scan(match.key, K.MAX_SCAN_LIMIT, start), timeout)
        reply = K.decode_query_reply(bytes(q.answer))
        if reply.status != K.Status.OK:
            raise DLedgerError(RC.STATE_MACHINE_ERROR, f"scan refused: {reply.message}")
        items = [kv for kv in reply.items if match(kv.key)]
        nxt = reply.items[-1].key + b"\x00" if reply.more and reply.items else None
        pages.append((q.applied_index, start, nxt, items))
        if nxt is None or not match.prefix:
            return pages
        start = nxt


def seed_from_scan(c: DLedgerClient, match: KeyFilter, timeout: float | None) -> tuple[WatchedState, int]:
    """The watched keys' state at one applied index A (returned), from a paged scan."""
    pages = _scan_pages(c, match, timeout)
    state = WatchedState(match)
    last = max(p[0] for p in pages)
    first = min(p[0] for p in pages)
    for _a, _lo, _hi, items in pages:
        for kv in items:
            state.records[kv.key] = (kv.value, kv.create_revision, kv.mod_revision, kv.version)
    if last > first:
        # Bring each page from its own read up to the last one's: replay the entries in
        # between, each on the pages read before it (a page's key range is complete there).
        entries = c.get_range(first + 1, last - first, timeout)
        for e in entries:
            if e.type != "NORMAL":
                continue
            cmd = K.decode_command(e.body)
            if isinstance(cmd, K.Invalid) or not match(cmd.key):
                continue
            for a, lo, hi, _items in pages:
                if a < e.index and cmd.key >= lo and (hi is None or cmd.key < hi):
                    state.apply(e.index, e.body)
    return state, last


def watch(c: DLedgerClient, key: bytes, prefix: bool, start_revision: int | None, prev_kv: bool,
          timeout: float | None = None) -> Iterator[WatchEvent]:
    """See `KVClient.watch`. Arguments are checked here; the group is first asked when the
    iteration starts (the seeding scan, or the log's first entry)."""
    if not isinstance(key, bytes | bytearray):
        raise TypeError(f"watch key must be bytes, not {type(key).__name__}")
    if not prefix and not key:
        raise K.KVInputError(K.Status.EMPTY_KEY, "watch needs a key (or prefix=True)")
    if len(key) > K.MAX_KEY_SIZE:
        raise K.KVInputError(K.Status.KEY_TOO_LARGE, f"key of {len(key)} bytes exceeds {K.MAX_KEY_SIZE}")
    if start_revision is not None and (not isinstance(start_revision, int) or start_revision < 1):
        raise K.KVInputError(K.Status.MALFORMED, "start_revision must be an int >= 1 (revisions start at 1)")
    return _run(c, KeyFilter(bytes(key), prefix), start_revision, prev_kv, timeout)


def _run(c: DLedgerClient, match: KeyFilter, start_revision: int | None, prev_kv: bool,
         timeout: float | None) -> Iterator[WatchEvent]:
    if start_revision is None:
        state, applied = seed_from_scan(c, match, timeout)
        first_event = follow_from = applied + 1
    else:
        state = WatchedState(match)
        first_event, follow_from = start_revision, 0
    entries = iter(c.follow(follow_from, include_noop=True))
    try:
        first = next(entries)
    except DLedgerError as e:
        if e.code == RC.INDEX_LESS_THAN_LOCAL_BEGIN and start_revision is not None:
            raise KVCompactedError(
                f"revision {start_revision} is compacted: retention removed the start of the log "
                "from every member, so past changes cannot be replayed; read the state (scan) "
                "and watch from now") from None
        raise
    for e in _chain(first, entries):
        if e.type != "NORMAL":
            continue
        change = state.apply(e.index, e.body)
        if change is None or e.index < first_event:
            continue
        kind, key, before, after = change
        yield WatchEvent(kind, key, e.index, _kv(key, after), _kv(key, before) if prev_kv else None)


def _chain(first: Entry, rest: Iterator[Entry]) -> Iterator[Entry]:
    yield first
    yield from rest
