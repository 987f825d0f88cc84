"""The on-disk layout of one node's store directory, readable without opening the store.

    DIR/data/00000000000000000000     data segment files, named by their first byte's global
    DIR/data/00000000001073741824     offset (20 digits); all the same size, preallocated
    DIR/index/00000000000000000000    index segment files, 32-byte records, entry i at i*32
    DIR/checkpoint                    committedIndex / endIndex (Java-properties text), repairIndex
                                      while a repair is under way, and
                                      baseIndex / baseTerm / basePos once the log was reset
                                      to begin after a snapshot (`LogBase`)
    DIR/currterm                      currTerm / voteLeader (see node.store.term_vote)
    DIR/segments                      dataFileSize / indexFileSize the store was created with
                                      (`read_segment_sizes`)
    DIR/begin                         beginIndex / beginPos: where the log begins once
                                      retention deleted its front (`read_log_begin`)

Pure file-system reading (no mmap writes, no locks): `dledger dump`, the Spark decoder and the
dispatchers' read-only readers all start here, so there is one definition of "the layout".
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = "data"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
TERM_FILE = "currterm"
LOCK_FILE = "member.lock"
SEGMENTS_FILE = "segments"
BEGIN_FILE = "begin"
SEGMENT_NAME = re.compile(r"^\d{20}$")


class LayoutError(ValueError):
    """The directory is not a store this version can read (foreign files, holes, bad sizes)."""


@dataclass(frozen=True, slots=True)
class Segment:
    start: int  # global offset of the file's first byte
    path: Path
    size: int  # file length on disk

    @property
    def end(self) -> int:
        return self.start + self.size


def longest_fitting_run(n: int, fits: Callable[[int], bool]) -> int:
    """The largest j in 1..n with fits(j), for a `fits` that holds for every j up to some bound
    and for none past it (index positions grow with the index): n when it fits, else bisected.
    1 is assumed to fit (the caller checked the first entry)."""
    if n <= 1 or fits(n):
        return n
    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def segment_name(start: int) -> str:
    return f"{start:020d}"


def list_segments(directory: str | os.PathLike[str]) -> list[Segment]:
    """The segment files of one list, in order. Temp files (`.tmp`) and others are ignored.

    Raises LayoutError when files overlap, leave a hole, or differ in size — a store we wrote
    never looks like that, so guessing would risk serving the wrong bytes.
    """
    d = Path(directory)
    if not d.is_dir():
        return []
    segs = sorted(
        (Segment(int(p.name), p, p.stat().st_size) for p in d.iterdir() if SEGMENT_NAME.match(p.name)),
        key=lambda s: s.start,
    )
    for prev, cur in zip(segs, segs[1:], strict=False):
        if prev.size != cur.size:
            raise LayoutError(f"{cur.path}: size {cur.size} differs from {prev.path.name} ({prev.size})")
        if prev.end != cur.start:
            raise LayoutError(f"{cur.path}: expected start offset {prev.end}, found {cur.start}")
    return segs


@dataclass(frozen=True, slots=True)
class LogBase:
    """Where a log that begins after a snapshot begins (`SegmentStore.reset_to`).

    `index`/`term`: the snapshot's last included entry, which the log no longer holds; the
    log's first entry is `index + 1`. `pos`: the data position entry `index + 1` is (or will
    be) written at. Every data file that ends at or before `pos` belongs to the log the reset
    replaced (recovery deletes such leftovers): that is what makes the reset crash-safe.
    """

    index: int
    term: int
    pos: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The checkpoint file. `base` is None for a log that begins at its first entry ever
    written (every store written before a log could begin after a snapshot): such a checkpoint is
    written exactly as before."""

    committed_index: int = -1
    end_index: int = -1
    base: LogBase | None = None
    repair_index: int = -1
    """-1, or: this replica lost (damaged) entries it may have acknowledged, up to this index,
    and must not vote until its committed index reaches it again (docs/store.md "Repair from
    peers"). Written only while set, so a healthy store keeps DLedger's two-key file."""


def parse_properties(path: str | os.PathLike[str], raw: bytes) -> dict[str, str]:
    """Parse `key=value` lines (DLedger writes Java properties). Bytes that are not UTF-8
    raise LayoutError naming `path`: a file we cannot read is damaged, never "empty"."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LayoutError(f"{path}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          "the file is damaged") from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a tiny `key=value` file. Missing file → {}; not UTF-8 → LayoutError."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return {}
    return parse_properties(path, raw)


def write_properties_atomically(path: str | os.PathLike[str], values: dict[str, object]) -> None:
    """Write `key=value` lines durably: temp file, fsync, rename, fsync the directory.

    A crash leaves either the old file or the new one, never a half-written one. An OSError
    (ENOSPC, EIO) names `path` and leaves no temp file behind.
    """
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    data = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:  # os.write may be short
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(p)) from e


_BASE_KEYS = ("baseIndex", "baseTerm", "basePos")
_REPAIR_KEY = "repairIndex"


def read_checkpoint(store_dir: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint; Checkpoint() when there is none. A log base is all three `base*` keys,
    each a non-negative integer: anything else is a LayoutError naming the file (guessing the
    base wrong would serve a replaced log's bytes, or forget where the log begins)."""
    path = Path(store_dir) / CHECKPOINT_FILE
    props = read_properties(path)
    try:
        committed, end = int(props.get("committedIndex", -1)), int(props.get("endIndex", -1))
    except ValueError as e:
        raise LayoutError(f"{path}: {e}") from e
    try:
        repair = int(props.get(_REPAIR_KEY, -1))
    except ValueError as e:
        raise LayoutError(f"{path}: {e}") from e
    present = [k for k in _BASE_KEYS if k in props]
    if not present:
        return Checkpoint(committed, end, None, repair)
    if len(present) != len(_BASE_KEYS):
        missing = ", ".join(k for k in _BASE_KEYS if k not in props)
        raise LayoutError(f"{path}: log base incomplete (no {missing}); the file is damaged")
    values = []
    for k in _BASE_KEYS:
        v = props[k]
        if not v.isdigit():
            raise LayoutError(f"{path}: {k}={v!r} is not a non-negative integer")
        values.append(int(v))
    return Checkpoint(committed, end, LogBase(*values), repair)


def write_checkpoint(store_dir: str | os.PathLike[str], cp: Checkpoint) -> None:
    """Write the checkpoint atomically and durably (`write_properties_atomically`). The base
    keys are written only when there is a base, so a store that was never reset keeps
    DLedger's two-key file."""
    values: dict[str, object] = {"committedIndex": cp.committed_index, "endIndex": cp.end_index}
    if cp.base is not None:
        values.update(zip(_BASE_KEYS, (cp.base.index, cp.base.term, cp.base.pos), strict=True))
    if cp.repair_index >= 0:
        values[_REPAIR_KEY] = cp.repair_index
    write_properties_atomically(Path(store_dir) / CHECKPOINT_FILE, values)


_SIZE_KEYS = {"data_file_size": "dataFileSize", "index_file_size": "indexFileSize"}


def _read_checked_ints(path: Path, keys: tuple[str, ...]) -> tuple[int, ...] | None:
    """Non-negative integers `keys` of a small `key=value` file that also carries `crc=`, the
    CRC-32 of its `key=value` lines: None when the file is absent, LayoutError naming it when
    it is present but not whole. The CRC is what tells a flipped digit (which would read as
    another valid number: a store "made with other sizes", a log "beginning elsewhere") from
    the value written."""
    props = read_properties(path)
    if not props:
        return None
    try:
        values = tuple(int(props[k]) for k in keys)
        crc = int(props["crc"])
    except (KeyError, ValueError) as e:
        raise LayoutError(f"{path}: damaged ({e!r} missing or not a number)") from e
    if crc != _lines_crc(keys, values) or any(v < 0 for v in values):
        raise LayoutError(f"{path}: damaged (its crc does not match its values)")
    return values


def _lines_crc(keys: tuple[str, ...], values: tuple[int, ...]) -> int:
    return zlib.crc32("".join(f"{k}={v}\n" for k, v in zip(keys, values, strict=True)).encode())


def _write_checked_ints(path: Path, keys: tuple[str, ...], values: tuple[int, ...]) -> None:
    write_properties_atomically(path, {**dict(zip(keys, values, strict=True)), "crc": _lines_crc(keys, values)})


def read_segment_sizes(store_dir: str | os.PathLike[str]) -> dict[str, int] | None:
    """The segment file sizes the store was created with (`data_file_size`,
    `index_file_size`), from `DIR/segments`; None when the file is absent (a store from before
    it), LayoutError when it is damaged (the store then knows its sizes only from its files,
    as before, and writes the file again).

    Why it exists: with the default 1 GiB data files a store has one data file, and a file
    truncated or extended by damage is then indistinguishable, by its length alone, from a
    store created with another size -- a node would refuse to start instead of repairing."""
    values = _read_checked_ints(Path(store_dir) / SEGMENTS_FILE, tuple(_SIZE_KEYS.values()))
    if values is None:
        return None
    if not all(values):
        raise LayoutError(f"{Path(store_dir) / SEGMENTS_FILE}: a size of 0")
    return dict(zip(_SIZE_KEYS, values, strict=True))


def write_segment_sizes(store_dir: str | os.PathLike[str], data_file_size: int, index_file_size: int) -> None:
    """Record the sizes a store's segment files have, durably (once, at its first open)."""
    _write_checked_ints(Path(store_dir) / SEGMENTS_FILE, tuple(_SIZE_KEYS.values()),
                        (data_file_size, index_file_size))


_BEGIN_KEYS = ("beginIndex", "beginPos")


def read_log_begin(store_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(first index, its data position) of a log whose front retention deleted, from
    `DIR/begin`; None when absent (the log begins where it always did: entry 0 at position 0,
    or right after its base). Written durably by retention *before* it deletes a file, so a
    first data file that starts later than this was lost, not deleted (docs/store.md
    "Recovery"). LayoutError when present but damaged."""
    values = _read_checked_ints(Path(store_dir) / BEGIN_FILE, _BEGIN_KEYS)
    return None if values is None else (values[0], values[1])


def write_log_begin(store_dir: str | os.PathLike[str], index: int, pos: int) -> None:
    _write_checked_ints(Path(store_dir) / BEGIN_FILE, _BEGIN_KEYS, (index, pos))


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """What a reader needs to locate any entry: both segment lists and the checkpoint."""

    store_dir: Path
    data: list[Segment]
    index: list[Segment]
    checkpoint: Checkpoint

    @property
    def data_file_size(self) -> int | None:
        return self.data[0].size if self.data else None

    @property
    def index_file_size(self) -> int | None:
        return self.index[0].size if self.index else None


def read_layout(store_dir: str | os.PathLike[str]) -> StoreLayout:
    d = Path(store_dir)
    if not d.is_dir():
        raise LayoutError(f"{d}: not a directory")
    return StoreLayout(d, list_segments(d / DATA_DIR), list_segments(d / INDEX_DIR), read_checkpoint(d))


def existing_file_sizes(store_dir: str | os.PathLike[str], configured: dict[str, int] | None = None
                        ) -> dict[str, int]:
    """The segment file size a store was created with, per list (`data_file_size`,
    `index_file_size`), where its files say so unambiguously; {} for a store with no files. A
    store's sizes are fixed at creation: a node opened with others cannot map its files.

    Damage (a truncated file, a deleted one: the store's open reports and repairs it) must not
    pass for another size. With two or more files: the most common length (the larger one on a
    tie: truncation only shrinks), if every file's name (its start offset) is a multiple of it;
    else nothing is said. One file gives only its length: it counts when it is larger than
    `configured` (truncation never grows a file) or a power of two (the sizes operators and
    tools choose; a torn length hardly ever is one), and is left out otherwise. A store that
    records its sizes (`read_segment_sizes`) is taken at its word, whatever its files' lengths."""
    try:
        recorded = read_segment_sizes(store_dir)
    except LayoutError:
        recorded = None
    if recorded is not None:
        return recorded
    out: dict[str, int] = {}
    for option, sub in (("data_file_size", DATA_DIR), ("index_file_size", INDEX_DIR)):
        d = Path(store_dir) / sub
        if not d.is_dir():
            continue
        files = sorted((int(p.name), p.stat().st_size) for p in d.iterdir() if SEGMENT_NAME.match(p.name))
        if len(files) >= 2:
            lengths = [n for _s, n in files]
            common = max(set(lengths), key=lambda n: (lengths.count(n), n))
            if common > 0 and all(start % common == 0 for start, _n in files):
                out[option] = common
        elif files:
            size = files[0][1]
            bigger = configured is not None and size > configured.get(option, size)
            if size > 0 and (bigger or size & (size - 1) == 0):
                out[option] = size
    return out
