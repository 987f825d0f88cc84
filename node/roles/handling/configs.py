"""The configurations in this node's log: which one is the newest (committed or not), kept
through every change of the log, published for the roles that count votes and acks
(docs/membership.md "Which configuration is in force").

The handler is the log's only writer, so it is the one process that sees every append, every
truncation and every reset; it keeps a `ConfigHistory` through them and publishes the newest
configuration in the block's ledger group (`config_index`, `config_voters`,
`config_learners`: slot bit masks, `SlotTable.masks`), in the same seqlocked write as the ledger end
it belongs to. The elector and the ack checker read both in one snapshot.

**Open without a scan.** A 1 GiB log must not be read at start (docs/performance.md
"Restart"). The configuration entries are few, so their list is kept in `DIR/configuration`
(`key=value` lines: `entry.INDEX=base64 body`, written atomically: temporary file, fsync,
rename, fsync of the directory) and the log is not scanned at all. The invariant that makes
the file enough: **every configuration entry the log holds is in the file**. It holds because

* the file is written BEFORE a configuration entry is stored (a push that carries one, a
  change the leader appends); a crash in between leaves the file with an entry the log lacks;
* a truncation or a reset rewrites the file AFTER the log was cut; a crash in between also
  leaves only entries the log lacks;
* so the file may hold too much, never too little, and `open` checks each entry the file names
  against the log (an index past the end, or a different entry at that index, is dropped: at
  most a few entry reads). An entry below the log's begin was committed (retention deletes
  committed files only) and is kept as it is.

The file keeps the newest committed configuration and everything after it: only the entries
after the committed index can be truncated, and older ones can never be in force again.

**Installs.** A leader's snapshot replaces the log up to its last index S, and its meta carries
the configuration in force at S (none: the bootstrap one). The handler writes it to the file
as the base (`base.INDEX=base64 body`, `covers=S`) BEFORE the log reset, next to the entries the
log still holds. `open` uses the base only once the log begins after S (the reset happened, or
retention deleted past S since): then every entry at or below S is replaced by it (they were
the log's before the reset, maybe another leader's, uncommitted). Until then the log is the
old one and the base is ignored: the leader's next probe finds the snapshot installed and the
reset is done again.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from typing import TYPE_CHECKING

from ipc.entry_codec import HEADER, HEADER_SIZE, MAGIC_NOOP
from node.core.membership import (
    CONFIG_TAG,
    ConfigHistory,
    Configuration,
    ConfigurationError,
    bootstrap_configuration,
    decode_configuration,
    encode_configuration,
    is_configuration_body,
)
from node.core.slots import SlotTable, assign, bootstrap_slots
from node.store import codec
from node.store.base import StoreError
from node.store.codec import INDEX_SIZE
from node.store.layout import LayoutError, read_properties, write_properties_atomically
from node.wiring.slot_file import SlotFileError, slot_store

if TYPE_CHECKING:
    from node.roles.handler import Handler

CONFIG_FILE = "configuration"
_NOTHING: dict[str, int] = {}
_TAG = re.compile(re.escape(CONFIG_TAG))
_MAGIC_LOW = 3  # an index record begins with its entry's magic, a big-endian int32
_NOOP_LOW = bytes([MAGIC_NOOP])
_KEY = "entry."
_BASE = "base."
_COVERS = "covers"


def find_configurations(blob: bytes | memoryview, first_index: int,
                        recs: bytes | memoryview = b"") -> list[tuple[int, bytes]]:
    """(index, body) of every configuration entry in a run of encoded entries (a push) that
    starts at `first_index`, with the leader's index records for it (`recs`, may be empty).

    Only a run that may hold one has its headers walked. A configuration is a NOOP entry, so
    with records a run whose records name no NOOP holds none: one strided copy of the
    records' low magic bytes (n bytes) decides, whatever the bodies' size. That relies on
    the store refusing a run whose headers disagree with its records (node/store/push_check.py)
    -- such a run is not stored, so no configuration of it goes unseen. Without records, a run
    without the tag's bytes holds none (one search over the whole run: ~80 µs for 256 KiB here,
    which is why the records are read first)."""
    mv = memoryview(blob)
    if len(recs) >= INDEX_SIZE and len(recs) % INDEX_SIZE == 0:
        low_magics = memoryview(recs).cast("B")[_MAGIC_LOW::INDEX_SIZE]  # big-endian int32: last byte
        if _NOOP_LOW not in bytes(low_magics):
            return []
    elif _TAG.search(mv) is None:  # re reads any buffer in place: no copy of the run
        return []
    out: list[tuple[int, bytes]] = []
    off, index = 0, first_index
    while off + HEADER_SIZE <= len(mv):
        magic, size = HEADER.unpack_from(mv, off)[:2]
        if size < HEADER_SIZE or off + size > len(mv):
            break  # the store's own checks refuse the push
        body = mv[off + HEADER_SIZE:off + size]
        if is_configuration_body(magic, body):
            out.append((index, bytes(body)))
        off += size
        index += 1
    return out


def check_configuration_run(blob: bytes | memoryview, recs: bytes | memoryview, run_crc: int | None) -> None:
    """Before a configuration found in a push is acted on (written to DIR/configuration,
    published), the push must be the bytes the leader sent: a configuration that does not
    decode is a reason for this node to stop, and a push damaged on the way (a flipped size
    making an empty NOOP's body non-empty) must not pass for one -- it is refused like any
    damaged push, and the leader sends it again. The same checks the store makes before it
    stores the run (`append_follower`): the run CRC when the leader sent one (it covers every
    byte), else every entry against its record and its body CRC. Only runs that hold a
    configuration candidate pay for it here. Raises StoreError."""
    from node.store import push_check  # numpy, on first use (as the store imports it)

    if run_crc is not None:
        push_check.check_run_crc(blob, recs, run_crc)
        return
    n = len(recs) // INDEX_SIZE
    try:
        if n:
            push_check.check_run(memoryview(blob), memoryview(recs), n, verify_bodies=True)
        else:
            for _off, _e in codec.iter_entries(blob, verify_crc=True):
                pass
    except codec.CodecError as e:
        raise StoreError(str(e), "UNEXPECTED_ARGUMENT") from e


class ConfigKeeper:
    """The handler's `ConfigHistory`, its file and what it publishes (see module docstring)."""

    def __init__(self, h: Handler) -> None:
        self.h = h
        self.base = bootstrap_configuration(h.cfg.bootstrap_members)
        self.history = ConfigHistory(self.base)
        self.covers = -1  # the log index the history's base covers (an installed snapshot's)
        self.path = os.path.join(h.cfg.store_dir, CONFIG_FILE)
        # Each member's peer slot (node.core.slots), shared with the other roles through
        # RUN_DIR/slots.json (node.wiring.slot_file): the `--peers` members hold their
        # `--peers` positions from the start; a member added later takes a free slot.
        self.slot_file = slot_store(getattr(h.rc, "run_dir", None))
        self.slots: SlotTable = self._table_on_file() or bootstrap_slots(h.peer_map)
        # What `published` gives the block; `opened` assigns and computes them (the table on
        # file may have released a bootstrap member's slot: a restarted handler).
        self.masks = (0, 0)
        self._unpublished = True  # the block's words are not these yet (a new process: maybe stale)

    def _table_on_file(self) -> SlotTable | None:
        """The run's slot table (a restarted handler keeps the slots the roles already use)."""
        try:
            return self.slot_file.read()
        except SlotFileError as e:
            self.h.rc.fatal(str(e))

    def refresh_slots(self) -> bool:
        """Adopt the table on file if it moved since this handler last read or wrote it (the
        elector added a guest leader, the supervisor released a slot): True if it changed.
        The masks stay as published: they name members, whose slots never move."""
        try:
            if not self.slot_file.changed():
                return False
            table = self.slot_file.read()
        except SlotFileError:
            return False
        if table is None or table == self.slots:
            return False
        self.slots = table
        self.h.slots_changed(table)
        return True

    def _check_slots(self, c: Configuration, what: str) -> None:
        """Stop the node if it could not give every member of `c` a slot (it could not count
        them): before such a configuration is stored, never after."""
        try:
            assign(self._table_on_file() or self.slots, c)
        except ConfigurationError as e:
            self.h.rc.fatal(f"{what}{e}; this node stops rather than count another majority")

    @property
    def latest(self) -> Configuration:
        return self.history.latest

    def published(self) -> dict[str, int]:
        """The ledger group's configuration words for the next ledger write, once after they
        changed, else {} (the group keeps them): the ledger is published on every append
        burst, and passing three unchanged words each time cost ~0.6 us a publish."""
        if not self._unpublished:
            return _NOTHING
        self._unpublished = False
        return {"config_index": self.history.latest.index, "config_voters": self.masks[0],
                "config_learners": self.masks[1]}

    # ------------------------------------------------------------------ the file
    def _entries(self) -> list[Configuration]:
        return list(self.history._entries)  # noqa: SLF001 - the history's own list, ascending

    def _save(self, extra: list[Configuration] = (), base: Configuration | None = None,
              covers: int | None = None) -> None:
        """Write the file: the newest committed configuration entry, everything after it, and
        `extra` (entries about to be stored). Raises OSError (the caller refuses the write)."""
        committed = self.h.store.committed_index
        keep = self._entries() + list(extra)
        old = [c for c in keep if c.index <= committed]
        if old:
            keep = [c for c in keep if c.index >= old[-1].index]
        props = {f"{_KEY}{c.index}": base64.b64encode(_body(c)).decode() for c in keep}
        base = self.history.base if base is None else base
        covers = self.covers if covers is None else covers
        if covers >= 0:
            props[_COVERS] = str(covers)
            if base.index >= 0:
                props[f"{_BASE}{base.index}"] = base64.b64encode(_body(base)).decode()
        write_properties_atomically(self.path, props)

    def _load(self) -> list[Configuration]:
        """The file's entries, checked against the log (module docstring)."""
        try:
            props = read_properties(self.path)
        except (LayoutError, OSError) as e:
            self.h.rc.fatal(f"{self.path}: cannot read the configuration file: {e}")
        s = self.h.store
        out: list[Configuration] = []
        covers, base = -1, None
        try:
            if _COVERS in props:
                covers = int(props[_COVERS])
                for key in (k for k in props if k.startswith(_BASE)):
                    base = decode_configuration(base64.b64decode(props[key], validate=True),
                                                int(key[len(_BASE):]))
        except (ValueError, binascii.Error) as e:  # ConfigurationError is a ValueError
            self.h.rc.fatal(f"{self.path}: damaged configuration file at its base: {e}")
        if covers >= 0 and s.ledger_begin_index > covers:  # the reset to that snapshot happened
            self.covers = covers
            self.history = ConfigHistory(self.base if base is None else base)
        else:
            covers = -1
        for key in sorted((k for k in props if k.startswith(_KEY)), key=lambda k: int(k[len(_KEY):])):
            try:
                index = int(key[len(_KEY):])
                body = base64.b64decode(props[key], validate=True)
                config = decode_configuration(body, index)
            except (ValueError, binascii.Error) as e:  # ConfigurationError is a ValueError
                self.h.rc.fatal(f"{self.path}: damaged configuration file at {key}: {e}")
            if index <= covers:
                continue  # replaced by the installed snapshot's base
            if index > s.ledger_end_index:
                continue  # written before a store that never happened, or cut since
            if index >= s.ledger_begin_index:
                try:
                    e = s.get(index)
                except Exception:  # noqa: BLE001 - a damaged entry: repair refetches it
                    e = None
                if e is not None and (e.magic != MAGIC_NOOP or bytes(e.body) != body):
                    continue  # another entry is at that index now
            out.append(config)
        return out

    # ------------------------------------------------------------------ inputs
    def opened(self) -> None:
        """After the store opened: rebuild the history from the file (no log scan)."""
        self.history = ConfigHistory(self.base)
        self.covers = -1
        for c in self._load():  # may set the base of an installed snapshot first
            self.history.appended(c.index, MAGIC_NOOP, _body(c))
        self._publishable()
        if self.history.latest.index >= 0:
            c = self.history.latest
            self.h.log.info("configuration of entry %d: voters %s, learners %s", c.index,
                            ",".join(c.voters), ",".join(c.learners) or "-")

    def before_store(self, found: list[tuple[int, bytes]]) -> list[Configuration]:
        """Configuration entries about to be stored: decode them and write the file first.
        A configuration this node cannot hold stops it (it could not count its majority);
        OSError propagates (the write is refused as a disk problem)."""
        configs = []
        for index, body in found:
            try:
                c = decode_configuration(body, index)
            except ConfigurationError as e:
                self.h.rc.fatal(f"{e}; this node stops rather than count another majority")
            self._check_slots(c, "")
            configs.append(c)
        if configs:
            self._save(configs)
        return configs

    def stored(self, configs: list[Configuration]) -> None:
        """The log now holds them (call before publishing the ledger)."""
        for c in configs:
            self.history.appended(c.index, MAGIC_NOOP, _body(c))
        if configs:
            self._publishable()

    def truncated(self, from_index: int) -> None:
        """Entries at `from_index` and after left the log (a cut, a reset): roll back, then
        rewrite the file (after the cut: module docstring)."""
        before = self.history.latest.index
        n = len(self.history._entries)  # noqa: SLF001
        self.history.truncated(from_index)
        if len(self.history._entries) != n:  # noqa: SLF001
            try:
                self._save()
            except OSError as e:  # the file holds too much, which open() drops: not fatal
                self.h.log.error("cannot rewrite %s after the cut at %d: %s", self.path, from_index, e)
        if self.history.latest.index != before:
            self.h.log.warning("configuration rolled back to entry %d by the cut at %d",
                               self.history.latest.index, from_index)
            self._publishable()

    def before_reset(self, last_index: int, base: Configuration | None) -> Configuration:
        """An installed snapshot covering the log up to `last_index` is about to replace it;
        `base` is the configuration its meta records (None: the bootstrap one). Write it to
        the file as the base BEFORE the reset (module docstring); the entries the log still
        holds stay listed. A configuration this node cannot count stops it, as a push's does.
        OSError propagates (the reset is not done; the leader retries)."""
        base = self.base if base is None else base
        self._check_slots(base, f"the installed snapshot {last_index}: ")
        self._save(base=base, covers=last_index)
        return base

    def after_reset(self, last_index: int, base: Configuration) -> None:
        """The log now begins after `last_index`: the snapshot's configuration is the base and
        no entry of the old log counts any more (those above the last committed index may have
        been another leader's). Rewrite the file to match; publish."""
        before = self.history.latest.index
        self.history = ConfigHistory(base)
        self.covers = last_index
        try:
            self._save()
        except OSError as e:  # it holds the base and entries the log lacks: open() drops those
            self.h.log.error("cannot rewrite %s after the reset to %d: %s", self.path, last_index, e)
        if self.history.latest.index != before:
            self.h.log.info("configuration of entry %d from the installed snapshot %d",
                            base.index, last_index)
        self._publishable()

    def _publishable(self) -> None:
        """Give the newest configuration's members their slots, on file BEFORE the masks that
        name them are published (node.wiring.slot_file), and mark the masks for the next
        ledger write."""
        c = self.history.latest
        before = self.slots
        try:
            self.slots = self.slot_file.update(lambda t: assign(t or self.slots, c))
        except (SlotFileError, ConfigurationError) as e:
            self.h.rc.fatal(f"configuration entry {c.index}: {e}")
        self.masks = self.slots.masks(c)
        self._unpublished = True
        if self.slots != before:
            self.h.slots_changed(self.slots)


def _body(c: Configuration) -> bytes:
    return encode_configuration(c)
