"""The segment store: DLedger's DLedgerMmapFileStore — a data list and an index list of
memory-mapped files, a checkpoint, and recovery.

Single writer: only the handler process opens a `SegmentStore`; other processes read the same
files through `node.store.reader.StoreReader`. Write order on every append is data, then index,
then the in-memory ledger end (which the handler publishes to the shared block afterwards), so
anything a reader can see published is already in the files.

Recovery (`open`) trusts the data list for the tail: it walks entries from the checkpoint's
committed entry C (from the first data file when the checkpoint cannot vouch: none, or index
records that disagree), checking magic, size, index continuity, term monotonicity, pos and the
body CRC. The first entry that fails ends the log: the torn tail is zeroed and later files
deleted, and the index list is rewritten wherever it disagrees. If that cut removes an entry at
or below the checkpoint's committed index (or a data file is missing or of the wrong size), the
store records a *repair index* in the checkpoint first and then cuts: the node rejoins, does
not vote, and fetches the range again from the leader (`mark_damaged`, the one path for damage
found at open or later; docs/store.md "Repair from peers"). The entries below C (flushed before
the checkpoint was written, and never moved since) are checked lazily: by `scrub_step`, which
the handler runs in the background, and by every reader before it uses them (`unchecked_end`;
docs/store.md "Recovery"), so open does not grow with the log.

A log can also begin after a snapshot (`reset_to`, docs/store.md "A log that begins after a
snapshot"): the checkpoint then carries a log base (index S, term T, data position P); the log is
empty from S + 1 until entries come, and every data file that ends at or before P is a leftover of
the log the reset replaced.

Destructive changes (truncate, reset, recovery, a deleted file whose name may come back) are
fenced by the store generation (`DIR/generation`, node.store.generation): readers in other processes
check it around what they read. I/O failures on every write path become store errors
(DISK_FULL for ENOSPC/EDQUOT, DISK_ERROR otherwise) naming the file, after rolling back a
half-done append; a failed fdatasync (or a failed rollback) leaves the store refusing writes
until it is reopened, because after it the page cache no longer tells what is on disk.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from node.core.sessions import entry_seqs
from node.store import codec
from node.store.base import (
    AppendResult,
    CorruptEntry,
    InconsistentAppend,
    IndexOutOfRange,
    StoreConfig,
    StoreCorruptError,
    StoreError,
    committed_damage,
    store_error_from_os,
)
from node.store.codec import (
    BLANK_SIZE,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    INDEX,
    INDEX_SIZE,
    MAGIC_BLANK,
    MAGIC_NORMAL,
    Entry,
)
from node.store.generation import GenerationCounter
from node.store.layout import (
    BEGIN_FILE,
    CHECKPOINT_FILE,
    DATA_DIR,
    INDEX_DIR,
    SEGMENTS_FILE,
    TERM_FILE,
    Checkpoint,
    LayoutError,
    LogBase,
    longest_fitting_run,
    read_checkpoint,
    read_log_begin,
    read_segment_sizes,
    write_checkpoint,
    write_log_begin,
    write_segment_sizes,
)
from node.store.mmap_file import (
    FileSizeMismatch,
    MappedFile,
    MappedFileList,
    StoreIOError,
    fsync_dir,
)
from node.store.term_vote import TermVoteFile

log = logging.getLogger("dledger.store")

_BLANK = codec.BLANK
_crc32 = codec.crc32


def _push_check():  # noqa: ANN202 - the module
    """node.store.push_check, imported on first use: it imports numpy (~0.1 s of CPU at start,
    a third of the handler's imports), which a handler needs for pushes and the scrub, not to
    start serving; `Handler.run` imports it in the background once it serves."""
    from node.store import push_check

    return push_check


def disk_usage_ratio(path: str | os.PathLike[str]) -> float:
    """How full the file system holding `path` is, as df's Use% reports it: used / (used +
    available to unprivileged writers). Not (total - available) / total: on a file system with
    a large root reserve that reads 70% on an almost empty disk (seen on this project's CI
    machines: 252 GB, 27 GB used, 75 GB available), and DISK_FULL or retention would start
    far too early. 1.0 means an unprivileged write fails now."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + st.f_bavail * st.f_frsize
    return used / usable if usable > 0 else 0.0



class SegmentStore:
    """A node's log on disk. Not thread-safe for writers: the handler is the one writer;
    the flush service thread only syncs and checkpoints (under `_lock`)."""

    def __init__(self, config: StoreConfig) -> None:
        errs = config.validate()
        if errs:
            raise ValueError("; ".join(errs))
        self.config = config
        self.dir = Path(config.store_dir)
        self._sync = config.flush_mode == "sync"
        self._gen: GenerationCounter | None = None
        self.data = MappedFileList(self.dir / DATA_DIR, config.data_file_size, fence=self,
                                   durable=self._sync)
        self.index = MappedFileList(self.dir / INDEX_DIR, config.index_file_size, fence=self,
                                    durable=self._sync)
        # The last error of the flush service thread (None once a flush succeeds again): the
        # thread has no caller to raise to, so this keeps the failure visible (stats, handler).
        self.last_flush_error: StoreError | None = None
        # Called with the µs each flush that had something to sync took (under `_lock`, so the
        # flush thread and a sync-mode append never observe at once): the handler's fsync
        # histogram (node/observe/role_metrics.py). None: not timed.
        self.flush_observer: Callable[[int], None] | None = None
        # Set when the files may no longer match what we believe (failed fdatasync or failed
        # rollback): every later write raises it until the store is reopened (recovery).
        self._broken: StoreError | None = None
        self._io_logged_at = -1.0  # rate limit of I/O error logs (a full disk fails every append)
        self._io_suppressed = 0
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        # Where the log begins when it begins after a snapshot (reset_to); None for a log that
        # begins at the first entry ever written. Persisted in the checkpoint.
        self._base: LogBase | None = None
        self._checkpointed = Checkpoint()
        # -1, or the index this replica must hold committed again before it may vote: it
        # found entries it may have acknowledged damaged or missing and cut them (mark_damaged;
        # docs/store.md "Repair from peers"). Persisted in the checkpoint while set.
        self.repair_index = -1
        self.damage: str | None = None  # what the last damage found was (one line), for the operator
        # Entries [_scrub_next, _unchecked_end] were not checked since open: recovery started at
        # the checkpoint's committed entry and left them to `scrub_step` (and every read).
        # _scrub_prev: (term, data position just past it) of the entry before _scrub_next.
        self._unchecked_end = -1
        self._scrub_next = -1
        self._scrub_prev: tuple[int, int] | None = None
        self._lock = threading.Lock()  # file-list changes vs. the flush service
        # Checkpoint writes vs. reset_to: a periodic checkpoint must never write values read
        # before a reset after the reset's own checkpoint (it would put back a committed index
        # the new log does not reach). Taken before `_lock`, never after it.
        self._cp_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._begin_recorded = False  # see open()
        self._stop = threading.Event()
        self._opened = False
        self._open_started = 0.0

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover the log from the files. Always moves the generation (recovery may cut the
        tail and delete files a reader of a previous incarnation still maps). I/O failures
        raise DiskFull/DiskError naming the file; damage to committed entries is cut and recorded
        (`repair_index`), a layout this version cannot read raises LayoutError."""
        self._broken = None  # recovery re-reads what is really on disk
        self._open_started = time.monotonic()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            # A store with a `segments` file (whole or damaged) was opened by a version that
            # also records where retention moved its begin (DIR/begin): only then is a late
            # first file a loss.
            self._begin_recorded = (self.dir / SEGMENTS_FILE).exists()
            sizes = self._recorded_sizes()
            self._gen = GenerationCounter(self.dir, durable=self._sync)
            with self._gen:
                # A damaged `segments` file still says this store records its sizes: the
                # configured ones are taken (a damaged file and a changed configuration at once
                # is two faults).
                lost = self._load_lists(size_known=self._begin_recorded)
                self._recover(lost)
            if sizes is None:  # every file now has the configured size (or there is none)
                self._record_trimmed_begin()  # what an older version trimmed, before the sizes
                write_segment_sizes(self.dir, self.config.data_file_size, self.config.index_file_size)
            if self._sync:
                self.flush()  # whatever recovery found (or zeroed) is durable before we serve it
        except StoreIOError:
            self._close_files()
            raise  # a layout problem (a file of the wrong size), not a failing disk
        except OSError as e:
            self._close_files()
            raise store_error_from_os(e, f"open of {self.dir}") from e
        except BaseException:
            self._close_files()
            raise
        self._stop.clear()
        self._opened = True
        # async: flush every flush_interval_ms, checkpoint every checkpoint_interval_ms.
        # sync: appends flush themselves; the thread keeps the checkpoint current.
        self._flusher = threading.Thread(target=self._flush_service, name="dledger-flush", daemon=True)
        self._flusher.start()

    def _close_files(self) -> None:
        self.data.close()
        self.index.close()
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    def has_room(self) -> bool:
        """Free space for one more data file (the largest single allocation the store makes).
        Asked by a handler that marked the store unwritable after DISK_FULL / DISK_ERROR, so
        the node can stand for election again once space is back; a store that still fails
        then is marked again by its next write."""
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= self.config.data_file_size + self.config.index_file_size

    def close(self) -> None:
        """Flush, checkpoint and unmap. A flush/checkpoint failure is raised (as a store
        error) after the files are closed anyway."""
        if not self._opened:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
            self._flusher = None
        try:
            if self._broken is None:
                self.checkpoint()
        finally:
            self._close_files()
            self._opened = False

    @property
    def data_end_pos(self) -> int:
        """Bytes ever written to the data files, minus truncations (LogStore.data_end_pos)."""
        return self.data.wrote_position

    # ------------------------------------------------------------------ generation fence
    @property
    def generation(self) -> int:
        """The store generation (even between operations): publish it with the ledger end so
        readers can tell whether the files they map are the ones that end describes."""
        return self._gen.value if self._gen is not None else 0

    def begin_change(self) -> None:
        """Fence for a destructive change (the file lists call it around deletions)."""
        if self._gen is not None:
            self._gen.begin_change()

    def end_change(self) -> None:
        if self._gen is not None:
            self._gen.end_change()

    @property
    def write_error(self) -> StoreError | None:
        """Why the store refuses writes until it is reopened (a failed fdatasync, rollback or
        truncate), or None. Lets the handler report an unwritable store without waiting for
        the next append to fail."""
        return self._broken

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise type(self._broken)(f"store refuses writes until it is reopened: {self._broken}")

    def _io_failed(self, e: OSError, action: str) -> StoreError:
        """The store error for `e`, logged at most once a second (with a count of the ones
        not logged): on a full disk every client append fails the same way."""
        err = store_error_from_os(e, action)
        now = time.monotonic()
        if now - self._io_logged_at >= 1.0:
            more = f" ({self._io_suppressed} similar errors not logged)" if self._io_suppressed else ""
            log.error("%s: %s%s", self.dir, err, more)
            self._io_logged_at, self._io_suppressed = now, 0
        else:
            self._io_suppressed += 1
        return err

    def __enter__(self) -> SegmentStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ recovery
    def _recorded_sizes(self) -> dict[str, int] | None:
        """The sizes the store was created with (`DIR/segments`), None for a store that does
        not record them (made before the file; it is written at the end of this open). Sizes
        other than the configured ones are a configuration mistake, said before anything is
        touched; with the sizes known, a data file of another length is damage, never a reason
        to refuse the store (docs/store.md "Recovery", step 1)."""
        try:
            sizes = read_segment_sizes(self.dir)
        except LayoutError as e:
            log.warning("%s: %s; the sizes are taken from the files and recorded again", self.dir, e)
            return None
        want = {"data_file_size": self.config.data_file_size, "index_file_size": self.config.index_file_size}
        if sizes is not None and sizes != want:
            raise FileSizeMismatch(
                f"{self.dir}: created with {sizes['data_file_size']}-byte data files and "
                f"{sizes['index_file_size']}-byte index files ({SEGMENTS_FILE}), but configured for "
                f"{want['data_file_size']} and {want['index_file_size']}; start with the file sizes "
                "the store was created with")
        return sizes

    def _load_lists(self, size_known: bool = False) -> tuple[str | None, list[Path]]:
        """Map both lists. The index list is derived data (recovery rewrites every record
        from the data list), so an index file that is missing, of the wrong size or after a
        hole is not damage: the whole list is rebuilt. A data list with a missing or
        wrong-sized file keeps the files before it; returns (what is wrong, the files after
        it) for `_recover`, which deletes them only once it has recorded what they held."""
        problem, rest = self.data.load_salvaging(size_known=size_known)
        idx_problem, idx_rest = self.index.load_salvaging(derived=True)
        if idx_problem is not None:
            log.warning("%s: index list damaged (%s): rebuilding it from the data", self.dir, idx_problem)
            self.index.delete_all()
            for p in idx_rest:
                p.unlink(missing_ok=True)
        return problem, rest

    def _recover(self, lost: tuple[str | None, list[Path]] = (None, [])) -> None:
        try:
            cp = read_checkpoint(self.dir)
        except LayoutError as e:
            cp = self._set_damaged_checkpoint_aside(e)
        base = cp.base
        cleaned = base is not None and self._drop_replaced_files(base)
        expected = self._expected_begin(base)
        ceiling = self._term_ceiling()
        front = self._lost_front(expected, self.data.files)
        begins_anew = front is not None
        if front is not None:
            # Files before the first one are gone, not deleted by retention: the store keeps no
            # holes, so nothing after them is kept either; all of it is fetched again (repair).
            lost = self._lose_all_files(front, lost)
        files = self.data.files
        verify_from = max(0, len(files) - self.config.recover_verify_files)
        expected_index: int | None = None
        prev_term = -1
        begin = -1
        first_off = 0
        # A log with a base still "anchored" at it (its first file holds the base position, or
        # it has no data file at all) begins with entry base.index + 1 at base.pos. Once
        # retention deleted that file, the first entry is at offset 0 of the first file, as in
        # any retention-trimmed log.
        anchored = base is not None and (not files or files[0].start <= base.pos < files[0].end)
        if base is not None:
            prev_term = base.term
        if anchored:
            expected_index = base.index + 1
            first_off = base.pos - files[0].start if files else 0
        elif expected is not None and files and files[0].start == expected[1]:
            # The first file is where the log is known to begin: its first entry must be that
            # index (a damaged header must not move the whole log to another index).
            expected_index = expected[0]
        start_fi = 0
        # The checkpoint vouches for the log up to its committed entry C: walk (and CRC-check)
        # only from C on, and leave the entries before it to the scrub and to every read.
        start = self._checkpoint_start(cp, base, files, first_off)
        if start is not None:
            start_fi, first_off, expected_index, prev_term, begin = start
            verify_from = start_fi
        end_pos = files[start_fi].start + first_off if files else 0
        crc_from: int | None = None  # the first entry whose body CRC this walk checked
        problem: str | None = None
        records: list[tuple[int, int, int, int, int]] = []  # (magic, pos, size, index, term)

        for fi in range(start_fi, len(files)):
            f = files[fi]
            off, verify = (first_off if fi == start_fi else 0), fi >= verify_from
            mm = f.mm
            while True:
                if f.size - off < BLANK_SIZE:
                    problem = f"{f.path.name}: {f.size - off} trailing bytes without a BLANK marker"
                    break
                magic, size = _BLANK.unpack_from(mm, off)
                if magic == 0 and size == 0:
                    break  # the zeroed space after the last entry: end of the log
                if magic == MAGIC_BLANK:
                    if size != f.size - off:
                        problem = f"{f.path.name}@{off}: BLANK of {size} bytes, file has {f.size - off} left"
                    break
                if magic not in ENTRY_MAGICS:
                    problem = f"{f.path.name}@{off}: bad magic {magic}"
                    break
                if f.size - off < HEADER_SIZE or not HEADER_SIZE <= size <= f.size - off:
                    problem = f"{f.path.name}@{off}: entry size {size} does not fit"
                    break
                _m, _s, idx, term, pos, _c, _cc, body_crc, body_size = HEADER.unpack_from(mm, off)
                if body_size != size - HEADER_SIZE:
                    problem = f"{f.path.name}@{off}: body size {body_size} disagrees with size {size}"
                elif expected_index is not None and idx != expected_index:
                    problem = f"{f.path.name}@{off}: index {idx}, expected {expected_index}"
                elif base is not None and idx <= base.index:
                    problem = f"{f.path.name}@{off}: index {idx} at or before the log base {base.index}"
                elif term < prev_term:
                    problem = f"{f.path.name}@{off}: term {term} after term {prev_term}"
                elif term > ceiling:
                    problem = (f"{f.path.name}@{off}: term {term} above this node's current term "
                               f"{ceiling} ({TERM_FILE}): no leader of that term ever existed")
                elif pos != f.start + off:
                    problem = f"{f.path.name}@{off}: pos field {pos}, entry is at {f.start + off}"
                elif verify and _crc32(f.view[off + HEADER_SIZE: off + size]) != body_crc:
                    problem = f"{f.path.name}@{off}: body CRC mismatch for index {idx}"
                if problem:
                    break
                if begin < 0:
                    begin = idx
                if verify and crc_from is None:
                    crc_from = idx
                records.append((magic, pos, size, idx, term))
                expected_index, prev_term = idx + 1, term
                off += size
                end_pos = f.start + off
            if problem or (magic == 0 and size == 0):
                break  # later files hold nothing of the log (an empty roll, or a torn tail)
            end_pos = f.end  # the file ended in a BLANK: the log continues in the next one

        end = (expected_index - 1) if expected_index is not None else -1
        if not records and start is None and not anchored:
            end = -1  # nothing kept from the first file on (an index expected there kept no entry)
        first_bad = end + 1
        if begin > end:
            begin = -1  # the walk from C kept nothing and C is the first entry: an empty log
            if end >= 0 and not anchored:
                # ... of a log retention trimmed: an empty log beginning at C would need C - 1's
                # term, which retention deleted. It is dropped as a lost disk leaves it (as
                # `_drop_whole_log` does at runtime): every file goes once the repair index is
                # durable, and the log begins anew.
                first_bad, end, end_pos = end + 1, -1, 0
                lost = self._lose_all_files(problem or f"entry {first_bad}, the first of a trimmed log", lost)
                begins_anew = True
        # The log has entries [begin, end]. From the checkpoint, the walk may have kept none
        # (C itself damaged): [begin, C - 1] is still the log the checkpoint vouches for, with
        # its index records and C - 1's term (prev_term), and all of it left to the scrub.
        if problem is None and lost[0] is not None:
            problem = lost[0]  # the walk ran off the end of the files before a missing one
        self.repair_index = cp.repair_index
        self._checkpointed = cp
        # After a damage cut at end + 1 the entry before it is not taken as committed: a header
        # carries no CRC of its own, so when end + 1 failed its term order, entry `end`'s term
        # may be the damaged one, and only the leader's COMPARE can tell -- it must be able to
        # replace the entry (the repair index keeps the node from voting meanwhile).
        damaged = cp.committed_index > end or cp.end_index > end
        keep_committed = max(end - 1, -1) if damaged else end
        if damaged:
            # Committed entries are damaged or gone, or entries the checkpoint says were on
            # disk (at or below its end index: flushed, so this node may have acknowledged
            # them, and a write a crash tore cannot be among them; zeroed or gone counts too:
            # a truncation lowers the end index first). Not cut silently as a torn tail, not
            # refused either: recorded (repair index, durable before the cut), cut, and fetched
            # again from the leader; the node must not vote meanwhile (docs/store.md "Repair
            # from peers").
            why = problem or (f"the log ends at {end}, the checkpoint says {cp.committed_index} is "
                              f"committed and {cp.end_index} was on disk")
            self._enter_repair(max(cp.committed_index, cp.end_index), first_bad,
                               Checkpoint(min(cp.committed_index, keep_committed), end, base, cp.repair_index), why,
                               committed=cp.committed_index)
        elif problem is not None:
            log.warning("%s: cutting the log after index %d: %s", self.dir, end, problem)
        for p in lost[1]:
            p.unlink(missing_ok=True)  # after the repair index is durable (inside open's fence)
        if lost[1]:
            fsync_dir(self.data.dir)
        if begins_anew:
            (self.dir / BEGIN_FILE).unlink(missing_ok=True)

        self.data.set_wrote_position(end_pos)
        index_files = len(self.index.files)
        self._rebuild_index(records, begin, end)
        if cleaned or (base is not None and index_files and not self.index.files):
            # Leftovers of a replaced log are gone for good before anything new is written:
            # one coming back after a power loss next to new files would leave a hole in the
            # file list, which no store opens.
            fsync_dir(self.data.dir)
            fsync_dir(self.index.dir)
        self._base = base
        if anchored and not records:
            begin = base.index + 1  # empty, after its base: end = base.index, end term = base.term
        self.ledger_begin_index = begin
        self.ledger_end_index = end
        if records or (start is not None and begin >= 0):
            self.ledger_end_term = prev_term  # the last walked entry's, else C - 1's record's
        else:
            self.ledger_end_term = base.term if anchored else -1
        committed = min(cp.committed_index, keep_committed)
        if base is not None and base.index <= end:
            committed = max(committed, base.index)  # the base is a snapshot of committed state
        self.committed_index = committed
        # What this open did not check: from the log's begin to the entry before the first one
        # whose CRC the walk checked (the checkpoint's committed entry on the fast path).
        unchecked_end = end if crc_from is None else crc_from - 1
        self._scrub_reset(begin, min(unchecked_end, end) if begin >= 0 else -1)
        log.info("%s: recovered begin=%d end=%d term=%d committed=%d%s (walked %d entries from %s; "
                 "%s left to the scrub)%s; opened in %.0f ms", self.dir, begin, end,
                 self.ledger_end_term, self.committed_index,
                 f" base={base.index}/{base.term}@{base.pos}" if base is not None else "",
                 len(records), "the checkpoint" if start is not None else "the first file",
                 f"{begin}..{self._unchecked_end}" if self._unchecked_end >= 0 else "nothing",
                 f"; repairing up to {self.repair_index}" if self.repair_index >= 0 else "",
                 (time.monotonic() - self._open_started) * 1000)

    def _term_ceiling(self) -> int:
        """The highest term any stored entry can have: the node's current term on disk
        (`currterm`). The elector saves a term before the node acts in it, and an entry of
        term T is stored only once this node has seen T, so a walked entry of a higher term
        has a damaged header (a header has no CRC of its own). Without the check, one flipped
        bit raising the last entry's term -- nothing after it to contradict it -- gave the
        node a last term no other could beat: it won every election, and as leader could not
        append in its own, lower term. No ceiling (a very large one) when the file is absent
        or unreadable (a lost term file is the elector's to handle)."""
        try:
            tv = TermVoteFile(self.dir)
        except (LayoutError, OSError, ValueError):
            return 1 << 62
        return 1 << 62 if tv.absent else tv.current.term

    def _expected_begin(self, base: LogBase | None) -> tuple[int, int] | None:
        """(index, data position) where the log begins: entry 0 at position 0, right after its
        base, or where retention last moved its begin (DIR/begin, written before retention
        deletes a file; one from before a reset is told by a position below the base's: a
        reset puts its base past every old file). None when unknown: a store that did not
        record its begin (`_begin_recorded`), or a damaged begin file -- a log that begins
        late is then read as trimmed, as it always was."""
        if not self._begin_recorded:
            return None
        try:
            rec = read_log_begin(self.dir)
        except LayoutError as e:
            log.warning("%s: %s; where the log begins is taken from its files", self.dir, e)
            return None
        if rec is not None and base is not None and rec[1] < base.pos:
            rec = None
        if rec is not None:
            return rec
        return (base.index + 1, base.pos) if base is not None else (0, 0)

    def _lose_all_files(self, why: str, lost: tuple[str | None, list[Path]]) -> tuple[str, list[Path]]:
        """Recovery keeps no data file (the store keeps no holes): every one joins the files
        deleted once the repair index is durable, and the log begins anew at entry 0."""
        paths = [f.path for f in self.data.files] + list(lost[1])
        self.data.close()
        return why, paths

    def _lost_front(self, expected: tuple[int, int] | None, files: list[MappedFile]) -> str | None:
        """Why the data files before the first one are missing, or None: a first file that
        starts after the position the log is known to begin at was lost, not deleted."""
        if not files or expected is None or files[0].start <= expected[1]:
            return None
        return (f"the data files before {files[0].path.name} are missing: the log began at entry "
                f"{expected[0]} (data position {expected[1]}); retention did not delete them")

    def _record_trimmed_begin(self) -> None:
        """A store opened for the first time by this version: if its log begins after its
        natural start (trimmed by an older version's retention), record that begin now, so
        the next open does not read the missing front as lost."""
        natural = self._base.pos if self._base is not None else 0
        if self.data.files and self.ledger_begin_index >= 0 and self.data.files[0].start > natural:
            write_log_begin(self.dir, self.ledger_begin_index, self.data.files[0].start)

    def committed_damage(self, index: int, committed: int, problem: str) -> StoreCorruptError:
        """`base.committed_damage` for this store: recovery and the scrub raise it."""
        return committed_damage(self.dir, index, committed, problem)

    # ------------------------------------------------------------------ the scrub
    def _scrub_reset(self, begin: int, unchecked_end: int) -> None:
        self._scrub_next = begin
        self._unchecked_end = unchecked_end if begin >= 0 and unchecked_end >= begin else -1
        self._scrub_prev = None

    @property
    def unchecked_end(self) -> int:
        """The last index of the entries not checked since open (-1: none left). Entries at or
        below it are checked by whoever reads them before they are used: the handler's GET
        (body CRCs), a dispatcher before it pushes them (published in the shared block as
        `unchecked_end_index`), and the scrub, which moves this down to -1."""
        return self._unchecked_end

    def scrub_step(self, max_bytes: int = 1 << 20) -> bool:
        """Check the next run of entries recovery left unchecked (at most `max_bytes` of data,
        at least one entry; never across a data file end): each header against its index
        record, positions contiguous (a BLANK marker closing each file), index consecutive,
        terms never decreasing, every body CRC. Returns True while entries are left.

        Raises StoreCorruptError (`committed_damage`) for the first bad entry: every unchecked
        entry is below the checkpoint's committed index. Called by the handler between
        requests, so a store of any size opens in bounded time and is still fully checked."""
        end = self._unchecked_end
        if end < 0:
            return False
        i = max(self._scrub_next, self.ledger_begin_index)
        if i > end or self.ledger_begin_index < 0:
            self._unchecked_end = -1
            return False
        if i != self._scrub_next or i == self.ledger_begin_index:
            # Retention deleted what was left, or exactly the file the scrub had just finished:
            # either way entry i is now the log's first, and the previous one (whose end the
            # continuity check compares with) is gone with its file.
            self._scrub_next, self._scrub_prev = i, None
        try:
            n, last_term, run_end = self._scrub_run(i, end, max_bytes)
        except (StoreError, OSError, struct.error, codec.CodecError) as e:
            err = self.committed_damage(i, max(self.committed_index, end), str(e))
            # Damaged index records are rewritten from intact data (a second failure at the
            # same entry finds nothing left to rewrite, so this cannot loop).
            if self.fix_index_records(err.index) or (err.index != i and self.fix_index_records(i)):
                return True
            raise err from e
        self._scrub_next = i + n
        self._scrub_prev = (last_term, run_end)
        if self._scrub_next > end:
            self._unchecked_end = -1
            log.info("%s: scrub done: entries up to %d checked", self.dir, end)
            return False
        return True

    def scrub(self) -> None:
        """Run the scrub to the end (tests, tools): `scrub_step` until nothing is left."""
        while self.scrub_step(16 << 20):
            pass

    def _scrub_run(self, i: int, end: int, max_bytes: int) -> tuple[int, int, int]:
        """Check entries from `i` (at most to `end`): (count, last term, data position past the
        last). Raises StoreError/CodecError naming what is wrong."""
        rec = self.index_record(i)
        f = self.data.find(rec.pos)
        if f is None or rec.pos + rec.size > f.end:
            raise CorruptEntry(f"entry {i}: pos {rec.pos} size {rec.size} not in a data file")
        prev = self._scrub_prev
        if prev is not None:
            prev_term, prev_end = prev
            if rec.term < prev_term:
                raise CorruptEntry(f"entry {i}: term {rec.term} after term {prev_term}")
            if prev_end != rec.pos:
                # The previous entry ended its file: the rest of that file is one BLANK record.
                pf = self.data.find(prev_end)
                if pf is None or rec.pos != pf.end or f.start != pf.end:
                    raise CorruptEntry(f"entry {i} at pos {rec.pos}, the previous one ends at {prev_end}")
                magic, size = _BLANK.unpack_from(pf.mm, prev_end - pf.start)
                if magic != MAGIC_BLANK or size != pf.end - prev_end:
                    raise CorruptEntry(f"{pf.path.name}@{prev_end - pf.start}: no BLANK marker "
                                       f"after the file's last entry (magic {magic}, size {size})")
        mv, recs, n, run_end = self._checked_run(i, rec, f, min(end - i + 1, max_bytes // HEADER_SIZE + 1),
                                                 max_bytes)
        last_term = INDEX.unpack_from(recs, (n - 1) * INDEX_SIZE)[4]
        return n, last_term, run_end

    @staticmethod
    def _first_bad_entry(i: int, mv: memoryview, recs: memoryview, n: int) -> None:
        """Raise CorruptEntry naming the first entry of a failed run that fails on its own."""
        off = 0
        for j, (_m, _p, size, _x, _t) in enumerate(INDEX.iter_unpack(recs)):
            try:
                _push_check().check_run(mv[off: off + size], recs[j * INDEX_SIZE: (j + 1) * INDEX_SIZE],
                                     1, verify_bodies=True)
            except StoreError as e:
                raise CorruptEntry(f"entry {i + j}: {e}") from e
            off += size
        del n

    def _set_damaged_checkpoint_aside(self, e: LayoutError) -> Checkpoint:
        """An unreadable checkpoint is no reason to refuse the store: the log is in the files,
        and the checkpoint only vouches for part of it. It is kept for the operator as
        `checkpoint.damaged` and recovery goes on as without one (as after deleting it): the
        walk starts at the first entry and the committed index is learned from the leader
        again. What is lost with it: a log base (the log then reads as one that retention
        trimmed) and a repair in progress (docs/store.md "Recovery")."""
        path = self.dir / CHECKPOINT_FILE
        kept = path.with_name(CHECKPOINT_FILE + ".damaged")
        os.replace(path, kept)
        fsync_dir(self.dir)
        log.error("%s: the checkpoint is unreadable (%s); kept as %s, recovering from the files "
                  "alone (the walk starts at the first entry)", self.dir, e, kept.name)
        return Checkpoint()

    def _checkpoint_start(self, cp: Checkpoint, base: LogBase | None, files: list,
                          first_off: int) -> tuple[int, int, int, int, int] | None:
        """Where recovery may start walking instead of the log's first entry: at the
        checkpoint's committed entry C, as (data file number, offset in it, C, the term C may
        not go below, the log's first index). None: walk everything (no committed checkpoint,
        or an index record the shortcut needs is missing or disagrees).

        Why this is enough: the checkpoint is written only after data and index were flushed
        up to its end, and committed entries never move, so everything below C is where the
        index records say. What could have happened to it since is damage, which the scrub
        (`scrub_step`) and every read (`get`, GET's CRC check, a dispatcher's check of runs
        at or below `unchecked_end`) look for. The tail from C on is walked with every check,
        CRCs included, so the last entry (which votes and compares depend on) is checked
        before the node serves, and a torn tail is cut as before."""
        c = cp.committed_index
        if c < 0 or not files or not self.index.files:
            return None
        f0 = files[0]
        try:
            magic, _s, first, _t, pos0, *_rest = HEADER.unpack_from(f0.mm, first_off)
            if magic not in ENTRY_MAGICS or pos0 != f0.start + first_off or first > c:
                return None
            if base is not None and first <= base.index:
                return None
            # Each record the shortcut takes is checked against the header it points at: C - 1's
            # term becomes the log's end term if C turns out damaged, and a vote compares it.
            rb, rc = self._verified_record(first), self._verified_record(c)
            if rb is None or rc is None or rb[1] != pos0:
                return None
            pos = rc[1]
            fi = (pos - f0.start) // self.config.data_file_size
            if not 0 <= fi < len(files) or pos + rc[2] > files[fi].end:
                return None
            prev_term = base.term if base is not None else -1
            if c > first:
                prev = self._verified_record(c - 1)
                if prev is None:
                    return None
                prev_term = prev[4]
        except struct.error:
            return None
        return fi, pos - files[fi].start, c, prev_term, first

    def _raw_record(self, index: int) -> tuple[int, int, int, int, int] | None:
        """Index record `index` straight from the index files, or None when it is missing or
        does not name an entry `index` (recovery, before the ledger bounds are known)."""
        f = self.index.find(index * INDEX_SIZE)
        if f is None:
            return None
        rec = INDEX.unpack_from(f.mm, index * INDEX_SIZE - f.start)
        if rec[0] not in ENTRY_MAGICS or rec[3] != index or rec[2] < HEADER_SIZE:
            return None
        return rec

    def _enter_repair(self, target: int, first_bad: int, cp: Checkpoint, why: str,
                      committed: int | None = None) -> None:
        """Record durably that this replica lost entries up to `target` (from `first_bad`)
        BEFORE anything is cut: a crash after it reopens with the repair index still set.
        The checkpoint `cp` (committed and end at most first_bad - 1) is written with it.
        The caller then cuts the log at `first_bad` (recovery's torn-tail cut or truncate)."""
        self.repair_index = max(self.repair_index, target)
        cp = Checkpoint(cp.committed_index, cp.end_index, cp.base, self.repair_index)
        try:
            write_checkpoint(self.dir, cp)
        except OSError as e:
            raise self._io_failed(e, "recording a damaged range") from e
        self._checkpointed = cp
        # `committed`: what recovery knows is committed; damage above it is of entries the
        # checkpoint says were on disk (this node may have acknowledged them).
        what = "committed" if committed is None or first_bad <= committed else "durable"
        self.damage = f"{what} entry {first_bad} is damaged: {why}"
        log.error("%s: DAMAGED %s entries from index %d: %s. Cutting the log there and "
                  "fetching it again from the leader; this node does not vote until it holds "
                  "committed entries up to %d again (repair)", self.dir, what, first_bad, why,
                  self.repair_index)

    def mark_damaged(self, first_bad: int, why: str) -> int:
        """THE path for a damaged entry found after open (a read that fails its CRC, a
        background check): entries from `first_bad` on can no longer be trusted or served.
        Records the repair index (everything this replica may have acknowledged: its ledger
        end) durably, then drops the log from `first_bad` on -- even below the committed
        index -- so the leader's normal catch-up (COMPARE at the new end, then APPEND, or an
        install) fetches the range again. Recovery at open takes the same way
        (`_enter_repair` + the cut). Returns the repair index; the caller (the handler, the
        store's one writer, under the member lock) publishes it so the elector stops voting.

        Damage at the begin of a log that retention trimmed empties the whole log
        (`_drop_whole_log`): there is no entry before it to continue from."""
        if first_bad > self.ledger_end_index:
            return self.repair_index
        target = max(self.committed_index, self.ledger_end_index)
        first_bad, pos = self._damage_cut(max(first_bad, self.ledger_begin_index))
        if first_bad == self.ledger_begin_index and first_bad > 0 and self.log_base is None:
            return self._drop_whole_log(target, why)
        keep = first_bad - 1
        with self._cp_lock:
            # The entry before the cut is not taken as committed either (see _recover): its
            # term may be what is damaged, and the leader's COMPARE must be able to replace it.
            self._enter_repair(target, first_bad, Checkpoint(min(self.committed_index, max(keep - 1, -1)), keep,
                                                             self._base, self.repair_index), why)
            self.committed_index = min(self.committed_index, max(keep - 1, -1))
        if first_bad <= self.ledger_end_index:
            self._truncate_at(first_bad, pos, self.log_base)
        if self._unchecked_end >= first_bad:  # nothing left to scrub past the cut
            self._unchecked_end = first_bad - 1 if self._scrub_next <= first_bad - 1 else -1
        return self.repair_index

    def _drop_whole_log(self, target: int, why: str) -> int:
        """Damage at the first entry of a log that retention trimmed: no entry is left to cut
        after, and an empty log that began at that index would need the term before it, which
        is gone. So the log becomes what a lost disk leaves -- empty, beginning anew at entry
        0, position 0 -- with the repair index recorded first; the leader sends what it has
        (the entries, or a snapshot past its retention). In order, as `reset_to`: the
        checkpoint (repair index, empty log: the commit point), then every data and index
        file, front first, then the begin record. A crash before the deletions reopens the
        old log with the repair index set (the scrub finds the damage again); one during them
        leaves a suffix of files after the recorded begin, which recovery reads as a lost
        front and drops the same way."""
        self.begin_change()
        try:
            with self._cp_lock:
                self._enter_repair(target, self.ledger_begin_index, Checkpoint(-1, -1, None, self.repair_index),
                                   why)
                self.committed_index = -1
                self._base = None
                self._scrub_reset(-1, -1)
                self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
                try:
                    with self._lock:
                        self.data.delete_all()
                        self.index.delete_all()
                    fsync_dir(self.data.dir)
                    fsync_dir(self.index.dir)
                    (self.dir / BEGIN_FILE).unlink(missing_ok=True)
                except OSError as e:
                    err = self._broken = self._io_failed(e, "dropping a log damaged at its begin")
                    raise err from e
        finally:
            self.end_change()
        return self.repair_index

    def _damage_cut(self, first_bad: int) -> tuple[int, int]:
        """Where `mark_damaged` cuts: (index, data position of that entry). The position is
        where the entry before ends (its record checked against its own header), not the
        damaged entry's own index record, which may be what is damaged; when the record before
        cannot be trusted either, the cut moves down to it (cutting more is safe: the repair
        index covers everything this replica may have acknowledged). The log's begin is cut at
        its first position."""
        i = first_bad
        while i > self.ledger_begin_index:
            prev = self._verified_record(i - 1)
            if prev is not None:
                return i, prev[1] + prev[2]
            i -= 1
        return i, self._first_pos()

    def _first_pos(self) -> int:
        """The data position of the log's first entry: its base's while the log begins right
        after it, else the first data file's start (0 with none)."""
        base = self.log_base
        if base is not None:
            return base.pos
        return self.data.files[0].start if self.data.files else 0

    def _verified_record(self, index: int) -> tuple[int, int, int, int, int] | None:
        """Index record `index` when the data header it points at agrees with it (magic, size,
        index, term, position); None otherwise. The body is not checked: what the caller needs
        is where the entry ends."""
        rec = self._raw_record(index)
        if rec is None:
            return None
        magic, pos, size, _idx, term = rec
        f = self.data.find(pos)
        if f is None or pos + size > f.end:
            return None
        try:
            h = HEADER.unpack_from(f.mm, pos - f.start)
        except struct.error:
            return None
        if (h[0], h[1], h[2], h[3], h[4]) != (magic, size, index, term, pos):
            return None
        return rec

    def fix_index_records(self, index: int) -> int:
        """Index records are derived data: when entry `index`'s record (or one after it in the
        same data file) disagrees with the data, and the data passes every check the walk at
        open makes (magic, size, index, position, term order, body CRC), rewrite the records
        from the data instead of calling it damage -- a repair from peers would also be
        correct, but costs the node its vote and a refetch for nothing lost. Walks from where
        entry `index` must begin (the end of the entry before, its record checked against its
        header; the log's first position for its first entry) to the end of that data file
        (and the next, when the walk starts on a BLANK), never past the ledger end, and stops
        at the first entry whose data fails. Returns how many records it rewrote: 0 means the
        data itself is damaged (or where it starts cannot be trusted), and the caller's damage
        path goes on. The handler (the store's one writer) calls it; readers in other
        processes see a wrong record become right, which every check they make accepts."""
        if not 0 <= self.ledger_begin_index <= index <= self.ledger_end_index:
            return 0
        if index == self.ledger_begin_index:
            base = self.log_base
            pos, prev_term = self._first_pos(), (base.term if base is not None else -1)
        else:
            prev = self._verified_record(index - 1)
            if prev is None:
                return 0
            pos, prev_term = prev[1] + prev[2], prev[4]
        # A header has no CRC of its own: its term is trusted only between the entry before's
        # and the entry after's (each checked the same way), and never against a record that
        # names this entry with another term (which of the two was damaged cannot be told:
        # that stays damage, fetched again). So a rewrite waits in `held` until the entry after
        # it (or the ledger end term, for the last entry) bounds its term.
        fixes: list[tuple[MappedFile, int, bytes]] = []
        held: tuple[MappedFile, int, bytes, int] | None = None
        i, files_left = index, 2
        while i <= self.ledger_end_index:
            f = self.data.find(pos)
            if f is None:
                break
            rel = pos - f.start
            if f.size - rel < BLANK_SIZE:
                break
            magic, size = _BLANK.unpack_from(f.mm, rel)
            if magic == MAGIC_BLANK:
                files_left -= 1
                if size != f.size - rel or files_left == 0:
                    break
                pos = f.end
                continue
            if magic not in ENTRY_MAGICS or not HEADER_SIZE <= size <= f.size - rel:
                break
            _m, _s, idx, term, p, _c, _cc, body_crc, body_size = HEADER.unpack_from(f.mm, rel)
            if (idx, p) != (i, pos) or term < prev_term or body_size != size - HEADER_SIZE \
                    or _crc32(f.view[rel + HEADER_SIZE: rel + size]) != body_crc:
                break
            if held is not None:  # this entry's term bounds the held one's from above
                fixes.append(held[:3])
                held = None
            xf = self.index.find(i * INDEX_SIZE)
            if xf is None:
                break
            xrel, want = i * INDEX_SIZE - xf.start, INDEX.pack(magic, pos, size, i, term)
            have = xf.mm[xrel: xrel + INDEX_SIZE]
            if have != want:
                r_magic, _rp, _rs, r_index, r_term = INDEX.unpack(have)
                if r_magic in ENTRY_MAGICS and r_index == i and r_term != term:
                    break  # record and header disagree on the term: damage, not derived data
                held = (xf, xrel, want, term)
            prev_term, pos, i = term, pos + size, i + 1
        if held is not None and i > self.ledger_end_index and held[3] <= self.ledger_end_term:
            fixes.append(held[:3])
        for xf, xrel, want in fixes:
            xf.write(xrel, want)
        if fixes:
            log.warning("%s: rewrote %d damaged index record(s) from entry %d on from the data "
                        "(the entries are intact; nothing to fetch)", self.dir, len(fixes), index)
        return len(fixes)

    def _drop_replaced_files(self, base: LogBase) -> bool:
        """Delete the data files a reset left behind: every file that ends at or before the base
        position belongs to the replaced log (reset_to puts the base past all of them and only
        then deletes them, so a crash in between leaves some). Returns whether any were found.
        Runs inside open's generation change."""
        stale = [f for f in self.data.files if f.end <= base.pos]
        if not stale:
            return False
        log.warning("%s: deleting %d data file(s) of the log replaced by the snapshot at index %d "
                    "(a reset was interrupted)", self.dir, len(stale), base.index)
        if len(stale) == len(self.data.files):
            self.data.delete_all()
        else:  # a prefix (files are sorted), never the last file
            self.data.delete_files_before(base.pos)
        return True

    def _rebuild_index(self, records: list[tuple[int, int, int, int, int]], begin: int, end: int) -> None:
        """Make the index list agree with the data list, record by record. A log without
        entries (`begin` < 0: empty, or empty after its base; `_recover` says so) keeps no
        index file. The records below the first walked one (a walk from the checkpoint) are
        kept."""
        start_off = max(begin, 0) * INDEX_SIZE
        if begin < 0 or (self.index.files and self.index.files[0].start > start_off):
            # An empty log needs no index; one starting before the first index file is
            # rebuilt from scratch.
            self.index.delete_all()
        # Index files that end before the first entry's record are leftovers of retention.
        self.index.delete_files_before(start_off)
        if begin < 0:
            return
        fixed = 0
        for magic, pos, size, idx, term in records:
            off = idx * INDEX_SIZE
            f = self.index.find(off)
            if f is None:
                f = self.index.last_file_for_append(off)
            rel = off - f.start
            want = INDEX.pack(magic, pos, size, idx, term)
            if f.mm[rel:rel + INDEX_SIZE] != want:
                f.write(rel, want)
                fixed += 1
            f.wrote = rel + INDEX_SIZE
        self.index.set_wrote_position((end + 1) * INDEX_SIZE)
        if fixed:
            log.warning("%s: rewrote %d index records from the data list", self.dir, fixed)

    # ------------------------------------------------------------------ appends
    def _room_for(self, size: int):
        """DLedger's preAppend: the file the next `size` bytes go to, padding the current one
        with a BLANK record when the entry plus a future BLANK marker do not fit."""
        f = self.data.files[-1] if self.data.files else None
        if f is None or f.wrote >= f.size:
            with self._lock:
                return self.data.last_file_for_append(self._data_end())
        if size + BLANK_SIZE > f.size - f.wrote:
            remaining = f.size - f.wrote
            f.write(f.wrote, _BLANK.pack(MAGIC_BLANK, remaining))
            f.wrote = f.size
            with self._lock:
                return self.data.last_file_for_append()
        return f

    def _data_end(self) -> int:
        """The data position the next entry goes to: past the last file's bytes, or, with no
        data file, where the log's base says it begins (0 for a log that was never reset)."""
        if self.data.files:
            return self.data.wrote_position
        return self._base.pos if self._base is not None else 0

    def _index_file(self, idx: int):
        off = idx * INDEX_SIZE
        f = self.index.files[-1] if self.index.files else None
        if f is None or f.wrote >= f.size:
            with self._lock:
                f = self.index.last_file_for_append(off)
        return f

    def append_leader(self, body: bytes, term: int, magic: int = MAGIC_NORMAL, session: int = 0,
                      seq: int = 0) -> AppendResult:
        """Append one entry with index = ledgerEnd + 1 in `term` (the caller checked leadership),
        stamped with a client session's (`session`, `seq`) when given (0, 0: none)."""
        if self._broken is not None:
            self._check_writable()
        if term < self.ledger_end_term:
            raise InconsistentAppend(f"term {term} below ledger end term {self.ledger_end_term}")
        n = len(body)
        size = HEADER_SIZE + n
        self._check_size(size)
        idx = self.ledger_end_index + 1
        start_pos = self.data.wrote_position
        try:
            f = self._room_for(size)
            off = f.wrote
            pos = f.start + off
            f.writev(off, [HEADER.pack(magic, size, idx, term, pos, session, seq, _crc32(body), n), body])
            f.wrote = off + size
            xf = self._index_file(idx)
            xf.write(xf.wrote, INDEX.pack(magic, pos, size, idx, term))
            xf.wrote += INDEX_SIZE
        except OSError as e:
            self._rollback(start_pos, idx)
            raise self._io_failed(e, f"append of entry {idx}") from e
        except BaseException:
            self._rollback(start_pos, idx)
            raise
        self._advance(idx, idx, term)
        if self._sync:
            self.flush()
        return AppendResult(idx, term, pos)

    def _check_size(self, size: int) -> None:
        if size + BLANK_SIZE > self.config.data_file_size:
            raise StoreError(f"entry of {size} bytes does not fit in a data file of "
                             f"{self.config.data_file_size} bytes", "UNEXPECTED_ARGUMENT")

    def _rollback(self, data_pos: int, first_index: int) -> None:
        """Undo a half-done append (e.g. ENOSPC creating a file) so the files never hold
        entries beyond the ledger end that recovery would later resurrect. If the rollback
        itself fails the files hold bytes past the ledger end: refuse writes until reopened
        (recovery cuts them)."""
        try:
            with self._lock:
                self.data.set_wrote_position(data_pos, dirty_end=self.data.wrote_position)
                self.index.set_wrote_position(first_index * INDEX_SIZE, dirty_end=self.index.wrote_position)
        except OSError as e:
            self._broken = self._io_failed(e, f"rollback of a failed append from entry {first_index}")

    def append_batch_raw(self, bodies: list[bytes], term: int, session: int = 0,
                         first_seq: int = 0) -> tuple[int, list[int]]:
        """Append many bodies as consecutive entries; returns (first index, positions).

        The hot path for BATCH_APPEND: no per-entry object beyond the position int, and a
        `sync` store flushes once for the whole batch. With a `session`, entry k is stamped
        (session, first_seq + k mod 2**32); `first_seq` may also be a list, one seq per body
        (single appends of one session coalesced into one write).
        """
        if not bodies:
            raise StoreError("empty batch", "REQUEST_WITH_EMPTY_BODYS")
        if self._broken is not None:
            self._check_writable()
        if term < self.ledger_end_term:
            raise InconsistentAppend(f"term {term} below ledger end term {self.ledger_end_term}")
        self._check_size(HEADER_SIZE + max(map(len, bodies)))
        first = idx = self.ledger_end_index + 1
        positions: list[int] = []
        start_pos = self.data.wrote_position
        try:
            self._write_batch(bodies, term, idx, positions, session, first_seq)
        except OSError as e:
            self._rollback(start_pos, first)
            raise self._io_failed(e, f"append of entries {first}..{first + len(bodies) - 1}") from e
        except BaseException:
            self._rollback(start_pos, first)
            raise
        self._advance(first, first + len(bodies) - 1, term)
        if self._sync:
            self.flush()
        return first, positions

    def _write_batch(self, bodies: list[bytes], term: int, idx: int, positions: list[int],
                     session: int = 0, first_seq: int | list[int] = 0) -> None:
        """Encode the batch into header/body parts and index records, then write each file's
        share with one pwritev (no per-entry syscall, no per-entry mapping fault)."""
        hpack, ipack, crc = HEADER.pack, INDEX.pack, _crc32  # locals: hot loop
        first = idx
        records: list[bytes] = []
        f = self.data.files[-1] if self.data.files else None
        parts: list = []
        base = f.wrote if f is not None else 0
        for body, seq in zip(bodies, entry_seqs(session, first_seq, len(bodies)), strict=True):
            n = len(body)
            size = HEADER_SIZE + n
            if f is None or size + BLANK_SIZE > f.size - f.wrote:
                if parts:
                    f.writev(base, parts)
                    parts = []
                f = self._room_for(size)
                base = f.wrote
            pos = f.start + f.wrote
            parts.append(hpack(MAGIC_NORMAL, size, idx, term, pos, session, seq, crc(body), n))
            parts.append(body)
            f.wrote += size
            records.append(ipack(MAGIC_NORMAL, pos, size, idx, term))
            positions.append(pos)
            idx += 1
        if parts:
            f.writev(base, parts)
        self._write_index_records(first, b"".join(records))

    def _write_index_records(self, first_index: int, recs: bytes | memoryview) -> None:
        """Append consecutive index records, which may straddle an index file end."""
        n, done = len(recs) // INDEX_SIZE, 0
        while done < n:
            xf = self._index_file(first_index + done)
            k = min(n - done, (xf.size - xf.wrote) // INDEX_SIZE)
            xf.write(xf.wrote, recs[done * INDEX_SIZE:(done + k) * INDEX_SIZE])
            xf.wrote += k * INDEX_SIZE
            done += k

    def append_leader_batch(self, bodies: list[bytes], term: int) -> list[AppendResult]:
        first, positions = self.append_batch_raw(bodies, term)
        return [AppendResult(first + i, term, p) for i, p in enumerate(positions)]

    def append_follower(self, blob: bytes | memoryview, index_records: bytes | memoryview = b"",
                        run_crc: int | None = None) -> int:
        """Store entries pushed by the leader, as received: `blob` is consecutive encoded entries
        starting at exactly ledgerEnd + 1. Validates every entry before writing anything.
        Returns the new end.

        `run_crc` is the push's run CRC (`codec.push_run_crc` of `index_records` and `blob`):
        when given (and `verify_push_crc` is on) one CRC over the run must equal it, and it
        stands for every body CRC; without it (direct callers, pushes that lack one) every
        entry's body CRC is checked. A mismatch of either refuses the push, nothing stored.

        With the leader's `index_records` for the run and our write position equal to the
        leader's (the normal case: same bytes, same file size, same padding rule give the same
        positions), the run is stored with one copy for the data and one for the index, after
        checking every header against its index record (`_check_run`, no per-entry objects
        for long runs). Otherwise every entry is checked, its pos field re-stamped to the
        local position and its index record written (no re-encoding)."""
        if self._broken is not None:
            self._check_writable()
        mv, recs = memoryview(blob), memoryview(index_records)
        n = len(recs) // INDEX_SIZE
        with_records = n > 0 and len(recs) == n * INDEX_SIZE
        if with_records:
            # first: damaged records are refused, never bypassed; the bytes are checked here
            # too, once, whichever path then stores the run
            self._check_run(mv, recs, n, run_crc)
            if self._append_follower_fast(mv, recs, n):
                return self.ledger_end_index
        verify = self.config.verify_push_crc and not with_records
        if verify and run_crc is not None:
            _push_check().check_run_crc(mv, recs, run_crc)
            verify = False  # the run CRC covered every body
        spans = self._follower_spans(mv, verify)
        if not spans:
            return self.ledger_end_index
        ipack = INDEX.pack
        start_pos, first = self.data.wrote_position, spans[0][2]
        try:
            self._write_spans(mv, spans, ipack)
        except OSError as e:
            self._rollback(start_pos, first)
            raise self._io_failed(e, f"follower append of entries {first}..{spans[-1][2]}") from e
        except BaseException:
            self._rollback(start_pos, first)
            raise
        last = spans[-1]
        self._advance(first, last[2], last[3])
        if self._sync:
            self.flush()
        return self.ledger_end_index

    def _follower_spans(self, mv: memoryview, verify: bool) -> list[tuple[int, int, int, int, int]]:
        """The per-entry path's check: every header decoded, index continuity, term order, the
        body CRC if `verify`. Returns (offset in blob, size, index, term, magic) per entry."""
        n = len(mv)
        spans: list[tuple[int, int, int, int, int]] = []
        off, expected, prev_term = 0, self.ledger_end_index + 1, self.ledger_end_term
        try:
            while off < n:
                h = codec.decode_header(mv, off)
                if off + h.size > n:
                    raise codec.CodecError(f"entry {h.index} truncated in push")
                if h.index != expected:
                    raise InconsistentAppend(f"push entry index {h.index}, expected {expected}")
                if h.term < prev_term:
                    raise InconsistentAppend(f"push entry term {h.term} after {prev_term}")
                if verify and _crc32(mv[off + HEADER_SIZE: off + h.size]) != h.body_crc:
                    raise codec.CodecError(f"push entry {h.index}: body CRC mismatch")
                if h.size + BLANK_SIZE > self.config.data_file_size:
                    raise codec.CodecError(f"push entry {h.index} larger than a data file")
                spans.append((off, h.size, h.index, h.term, h.magic))
                off += h.size
                expected += 1
                prev_term = h.term
        except codec.CodecError as e:
            raise StoreError(str(e), "UNEXPECTED_ARGUMENT") from e
        return spans

    def _check_run(self, mv: memoryview, recs: memoryview, n: int, run_crc: int | None) -> None:
        """Every entry of a pushed run against its index record, before anything is stored:
        magic, pos (contiguous from the first), size, index (consecutive), term (never
        decreasing), body size (node/store/push_check.py: a loop for short runs, numpy for
        long ones). Then the bytes, when `verify_push_crc`: one CRC over the run against
        `run_crc` when the leader sent one, else every body CRC. Raises StoreError
        (UNEXPECTED_ARGUMENT) naming the first entry that fails.

        Why every entry: checking only the ends let a run with a damaged body in the middle
        be stored and later committed, and the replica then refused to start. Why the run
        CRC: one CRC per entry plus two struct unpacks cost ~0.56 µs per entry, over the
        128 B bench line's bound; the run CRC is two C calls per push."""
        verify = self.config.verify_push_crc
        if verify and run_crc is not None:
            _push_check().check_run_crc(mv, recs, run_crc)
            verify = False
        _push_check().check_run(mv, recs, n, verify_bodies=verify)

    def _append_follower_fast(self, mv: memoryview, recs: memoryview, n: int) -> bool:
        """Store a run of `n` entries with the leader's index records, already checked by
        `_check_run`; False when the run must take the per-entry path instead (it does not
        continue our log, or our positions differ)."""
        _m, pos0, size0, idx0, term0 = INDEX.unpack_from(recs, 0)
        if (idx0 != self.ledger_end_index + 1 or term0 < self.ledger_end_term
                or size0 + BLANK_SIZE > self.config.data_file_size):
            return False  # the per-entry path says precisely what is wrong
        _m, _p, _s, idxn, termn = INDEX.unpack_from(recs, (n - 1) * INDEX_SIZE)
        run = len(mv)
        self._adopt_leader_position(pos0, size0)
        start_data = self.data.wrote_position
        try:
            f = self._room_for(size0)
            w = f.wrote
            if f.start + w != pos0 or w + run + BLANK_SIZE > f.size:
                return False  # positions differ from the leader's: the re-stamping path handles it
            f.write(w, mv)
            f.wrote = w + run
            self._write_index_records(idx0, recs)
        except OSError as e:
            self._rollback(start_data, idx0)
            raise self._io_failed(e, f"follower append of entries {idx0}..{idxn}") from e
        except BaseException:
            self._rollback(start_data, idx0)
            raise
        self._advance(idx0, idxn, termn)
        if self._sync:
            self.flush()
        return True

    def _adopt_leader_position(self, pos: int, size: int) -> None:
        """Before the first entry of a log that begins after a snapshot is written: take the
        leader's data position for it, so that this follower's positions equal the leader's
        from then on and every later push takes the one-copy path above. A reset puts the new
        log at a file boundary past the old files, which no leader shares: without this, an
        installed follower (and, should it lead, each of its followers) would re-stamp every
        entry for good (about 3x the cost per entry).

        Only forward (`pos` past the base position: every file of the replaced log still ends
        at or before it, which is what recovery tells leftovers by), only while the log has no
        data file, and only for a position at which the entry fits one of our files. The new
        position is made durable (the checkpoint, atomically) before anything is written
        there, since recovery starts reading the first file at the base position. A failed
        checkpoint write is logged and the run is stored at the old position instead."""
        b = self._base
        fsize = self.config.data_file_size
        if (b is None or pos <= b.pos or self.data.files or self.ledger_end_index != b.index
                or pos % fsize + size + BLANK_SIZE > fsize):
            return
        new = LogBase(b.index, b.term, pos)
        with self._cp_lock:
            end = self.ledger_end_index
            cp = Checkpoint(min(self.committed_index, end), end, new, self.repair_index)
            try:
                write_checkpoint(self.dir, cp)
            except OSError as e:
                self._io_failed(e, f"moving the log base to the leader's position {pos}")
                return
            self._checkpointed = cp
            self._base = new

    def _write_spans(self, mv: memoryview, spans: list[tuple[int, int, int, int, int]], ipack) -> None:  # noqa: ANN001
        i = 0
        while i < len(spans):
            f = self._room_for(spans[i][1])
            # Copy the longest run of entries that fits in this file with one memcpy.
            j, room, run = i, f.size - f.wrote, 0
            while j < len(spans) and run + spans[j][1] + BLANK_SIZE <= room:
                run += spans[j][1]
                j += 1
            base = f.wrote
            src = spans[i][0]
            buf = bytearray(mv[src: src + run])  # re-stamp positions in a copy, then one write
            records = []
            for boff, size, idx, term, magic in spans[i:j]:
                rel = boff - src
                pos = f.start + base + rel
                codec.restamp_pos(buf, rel, pos)
                records.append(ipack(magic, pos, size, idx, term))
            f.write(base, buf)
            f.wrote = base + run
            self._write_index_records(spans[i][2], b"".join(records))
            i = j

    def _advance(self, first_index: int, end_index: int, end_term: int) -> None:
        if self.ledger_begin_index < 0:
            self.ledger_begin_index = first_index
        self.ledger_end_index = end_index
        self.ledger_end_term = end_term

    # ------------------------------------------------------------------ reads
    def _check_range(self, index: int) -> None:
        if self.ledger_begin_index < 0 or not self.ledger_begin_index <= index <= self.ledger_end_index:
            raise IndexOutOfRange(
                f"index {index} outside [{self.ledger_begin_index}, {self.ledger_end_index}]")

    def index_record(self, index: int) -> codec.IndexRecord:
        self._check_range(index)
        try:
            rec = codec.decode_index(self.index.read(index * INDEX_SIZE, INDEX_SIZE))
        except (codec.CodecError, OSError) as e:
            raise CorruptEntry(f"index record {index}: {e}") from e
        if rec.index != index:
            raise CorruptEntry(f"index record at {index} names index {rec.index}")
        return rec

    def get(self, index: int, verify_crc: bool = True) -> Entry:
        """Entry `index`, verified (magic, index, pos, CRC). The body is a zero-copy view of the
        mapped file: copy it if it must outlive a later truncate."""
        rec = self.index_record(index)
        try:
            buf = self.data.read(rec.pos, rec.size)
            e = codec.decode_entry(buf, 0, verify_crc)
        except (codec.CodecError, OSError) as ex:
            raise CorruptEntry(f"entry {index} at pos {rec.pos}: {ex}") from ex
        if e.index != index or e.pos != rec.pos:
            raise CorruptEntry(f"entry at pos {rec.pos} is index {e.index}/pos {e.pos}, expected {index}")
        return e

    def get_range(self, index: int, count: int) -> list[Entry]:
        self._check_range(index)
        last = min(self.ledger_end_index, index + max(count, 0) - 1)
        return [self.get(i) for i in range(index, last + 1)]

    def get_raw(self, index: int, max_count: int, max_bytes: int) -> tuple[memoryview, int]:
        """Consecutive encoded entries from `index` as ONE zero-copy slice of a data file:
        at least one entry, then as many as fit in `max_count`/`max_bytes` without crossing a
        file end. How dispatchers and GET build frames without decoding entries."""
        first = self.index_record(index)
        last_idx = min(self.ledger_end_index, index + max(max_count, 1) - 1)
        f = self.data.find(first.pos)
        if f is None:
            raise CorruptEntry(f"pos {first.pos} of entry {index} is not in any data file")
        file_end = f.start + f.wrote
        end_pos = first.pos + first.size
        count = 1
        # Extend by index records (O(1) each) until a bound is hit.
        while index + count <= last_idx:
            rec = codec.INDEX.unpack_from(self.index.read((index + count) * INDEX_SIZE, INDEX_SIZE))
            _m, pos, size, _i, _t = rec
            if pos != end_pos or pos + size > file_end or end_pos + size - first.pos > max_bytes:
                break
            end_pos += size
            count += 1
        rel = first.pos - f.start
        return f.view[rel: rel + (end_pos - first.pos)], count

    def get_checked(self, index: int, max_count: int, max_bytes: int) -> tuple[memoryview, int]:
        """`get_raw` with every entry of the run checked: each header against its index record,
        the records consecutive from `index`, each body's CRC (push_check.check_run, the array
        checks the scrub uses). What GET and FETCH serve: a member never serves an entry it has
        not checked (entries below the checkpoint may not have been since open: "Recovery" in
        docs/store.md). ~1.2 µs an entry of 1 KiB where decoding each entry cost ~3 µs
        (docs/performance.md "Spark over the network"). At least one entry, within one data
        file. Raises CorruptEntry naming the first bad entry (IndexOutOfRange outside the log)."""
        rec = self.index_record(index)
        f = self.data.find(rec.pos)
        # The file's end, not its write position: a file below the checkpoint that recovery did
        # not walk has none (its entries are where the index records say, as the scrub reads them).
        if f is None or rec.size < HEADER_SIZE or rec.pos + rec.size > f.end:
            raise CorruptEntry(f"entry {index}: pos {rec.pos} size {rec.size} not in a data file")
        count = min(max(max_count, 1), self.ledger_end_index - index + 1)
        try:
            mv, _recs, n, _end = self._checked_run(index, rec, f, count, max_bytes)
        except CorruptEntry:
            raise
        except StoreError as e:  # a run that fails as a whole (no entry alone): damage too
            raise CorruptEntry(f"entries {index}-{index + count - 1}: {e}") from e
        return mv, n

    def _checked_run(self, i: int, rec: codec.IndexRecord, f: MappedFile, max_count: int,
                     max_bytes: int) -> tuple[memoryview, memoryview, int, int]:
        """The run from entry `i` (its record `rec`, in data file `f`): consecutive records whose
        entries lie in this file, at most `max_count` of them and ~`max_bytes` of data (at least
        one), checked with push_check.check_run (bodies included). (entries, their index
        records, count, data position past the last). The scrub and `get_checked` read runs
        this way. Raises CorruptEntry naming the first entry that fails on its own, else the
        run's StoreError."""
        xf = self.index.find(i * INDEX_SIZE)
        xrel = i * INDEX_SIZE - xf.start
        k_max = min(max_count, (xf.size - xrel) // INDEX_SIZE)
        limit = min(f.end, rec.pos + max(max_bytes, rec.size))
        unpack, mm = INDEX.unpack_from, xf.mm

        def fits(j: int) -> bool:  # entries i .. i+j-1 end within this file and the budget
            _m, pos, size, _x, _t = unpack(mm, xrel + (j - 1) * INDEX_SIZE)
            return rec.pos <= pos and pos + size <= limit

        n = longest_fitting_run(k_max, fits)
        _m, pos, size, _x, _t = unpack(mm, xrel + (n - 1) * INDEX_SIZE)
        run_end = pos + size if n > 1 else rec.pos + rec.size
        recs = xf.view[xrel: xrel + n * INDEX_SIZE]
        mv = f.view[rec.pos - f.start: run_end - f.start]
        try:
            _push_check().check_run(mv, recs, n, verify_bodies=True)
        except StoreError:
            self._first_bad_entry(i, mv, recs, n)  # names the entry; the run's error otherwise
            raise
        return mv, recs, n, run_end

    def term_at(self, index: int) -> int:
        """The term of entry `index`; for the log base (the snapshot's last entry, just before
        the first entry of a log that begins after a snapshot) its term from the base record."""
        b = self.log_base
        if b is not None and index == b.index:
            return b.term
        return self.index_record(index).term

    def first_index_of_term(self, term: int, from_index: int) -> int:
        """getFirstLogOfTargetTerm: walk back from `from_index` to the first entry of `term`
        (down to the log base, whose term is known, when the log begins after a snapshot)."""
        b = self.log_base
        lowest = b.index if b is not None else self.ledger_begin_index
        if b is None or from_index != b.index:
            self._check_range(from_index)
        i = from_index
        if self.term_at(i) != term:
            raise StoreError(f"entry {from_index} is not of term {term}", "UNEXPECTED_ARGUMENT")
        while i > lowest and self.term_at(i - 1) == term:
            i -= 1
        return i

    @property
    def log_base(self) -> LogBase | None:
        """(index S, term T, data position) of the snapshot this log begins after, while the
        log still begins right after it (ledger_begin_index == S + 1); None for a log that
        begins at its first entry ever written, or once retention moved the begin past
        S + 1 (then S is as unknown as any index retention deleted)."""
        b = self._base
        if b is not None and self.ledger_begin_index == b.index + 1:
            return b
        return None

    def reset_to(self, snapshot_index: int, snapshot_term: int) -> None:
        """Replace the whole log by an empty one that begins after a snapshot whose last
        included entry is (`snapshot_index`, `snapshot_term`): afterwards ledger_begin_index =
        S + 1, ledger_end_index = S, ledger_end_term = T, committed_index = S, `term_at(S)` is
        T, and the next append (leader or follower) is entry S + 1. Install snapshot's store
        half (docs/store.md "A log that begins after a snapshot").

        Every entry goes, whatever the log held (before, at or after S, committed or not): the
        snapshot supersedes them. Raft's "keep the suffix after S if the log holds S with term
        T" is the caller's case, not this method's: such a log needs no store change at all
        (check `begin <= S <= end and term_at(S) == T`, then only mark S committed).

        Durable when it returns, in both flush modes, and crash-safe at every step: the one
        commit point is the atomic rename of the checkpoint naming the new base (index S,
        term T, data position P past every existing data file); files are deleted only after
        it, and recovery deletes any data file ending at or before P. So a crash leaves the old
        log (checkpoint not yet renamed) or the new empty one, never a mix. Fenced by the store
        generation: readers holding the old files see it move (docs/contracts.md C1).

        A failed checkpoint write raises DiskFull/DiskError with the log unchanged; a failure
        deleting the replaced files (after the commit point) leaves the new empty log in
        memory and the store refusing writes until it is reopened (recovery finishes the
        deletion)."""
        if snapshot_index < 0 or snapshot_term < 0:
            raise StoreError(f"reset_to({snapshot_index}, {snapshot_term}): index and term must be "
                             ">= 0", "UNEXPECTED_ARGUMENT")
        if self._broken is not None:
            self._check_writable()
        what = f"reset to snapshot {snapshot_index}/{snapshot_term}"
        self.begin_change()
        try:
            with self._cp_lock:
                # Past every data file that exists: any file ending at or before P is the old
                # log's, so recovery can tell leftovers from new files by name alone.
                pos = self.data.files[-1].end if self.data.files else self._data_end()
                base = LogBase(snapshot_index, snapshot_term, pos)
                cp = Checkpoint(snapshot_index, snapshot_index, base,
                                -1 if self.repair_index <= snapshot_index else self.repair_index)
                try:
                    write_checkpoint(self.dir, cp)  # the commit point
                except OSError as e:
                    raise self._io_failed(e, what) from e
                self._checkpointed = cp
                self._base = base
                self._scrub_reset(-1, -1)  # nothing of the old log is left to check
                self.ledger_begin_index = snapshot_index + 1
                self.ledger_end_index = snapshot_index
                self.ledger_end_term = snapshot_term
                self.committed_index = snapshot_index
                if 0 <= self.repair_index <= snapshot_index:
                    self._repaired()
                try:
                    with self._lock:
                        self.data.delete_all()  # front first: leftovers are a contiguous suffix
                        self.index.delete_all()
                    # Durable before any new file exists (async mode too): a deleted file that
                    # came back next to new ones would leave a hole no store opens.
                    fsync_dir(self.data.dir)
                    fsync_dir(self.index.dir)
                except OSError as e:
                    err = self._broken = self._io_failed(e, f"{what}: deleting the replaced log")
                    raise err from e
        finally:
            self.end_change()
        log.info("%s: log reset to begin after snapshot %d/%d (data position %d)", self.dir,
                 snapshot_index, snapshot_term, base.pos)

    # ------------------------------------------------------------------ truncation, commit
    def truncate(self, index: int) -> None:
        """Drop entries >= index. Never below the committed index (that would lose committed
        data). Dropped bytes are zeroed so a crash can never bring them back."""
        if index <= self.committed_index:
            raise StoreError(f"truncate({index}) would drop committed entries (committed "
                             f"{self.committed_index})", "UNEXPECTED_ARGUMENT")
        if index > self.ledger_end_index:
            return
        base = self.log_base
        if index < self.ledger_begin_index or (index == self.ledger_begin_index and index > 0
                                                and base is None):
            # Emptying a log whose begin is past 0 needs a snapshot to continue from: the log
            # base (reset_to) is one; a log trimmed by retention has none.
            raise IndexOutOfRange(f"truncate({index}) at or below ledger begin {self.ledger_begin_index}")
        if self._broken is not None:
            self._check_writable()
        self._truncate_at(index, self.index_record(index).pos, base)

    def _truncate_at(self, index: int, pos: int, base: LogBase | None) -> None:
        """truncate's cut of entries >= `index`, the first of which begins at data position
        `pos` (its index record's; `mark_damaged` derives it from the entry before when that
        record is itself damaged)."""
        # The checkpoint's end first: recovery reads damage at or below it (or a log ending
        # before it) as lost durable entries (repair), and the entries written over the cut
        # range are not durable yet. Lowering it claims nothing new (what was durable below
        # `index` still is). Under `_cp_lock` to the end of the cut: a checkpoint taken in
        # between would read the old end and claim the range being zeroed.
        with self._cp_lock:
            if self._checkpointed.end_index >= index:
                self._write_checkpoint(min(self._checkpointed.committed_index, index - 1), index - 1)
            self._cut(index, pos, base)
        if self._sync:
            self.flush()  # the zeroed range and the deletions reach the disk before we answer

    def _cut(self, index: int, pos: int, base: LogBase | None) -> None:
        """truncate's cut, under `_cp_lock`: zero from entry `index` on, drop later files."""
        # Fenced: files after the cut are deleted and their names re-created by later appends;
        # a reader still mapping them must see the generation move (docs/contracts.md C1,
        # docs/store.md).
        self.begin_change()
        try:
            with self._lock:
                data_end = self.data.wrote_position
                idx_end = self.index.wrote_position
                self.data.set_wrote_position(pos, dirty_end=data_end)
                self.index.set_wrote_position(index * INDEX_SIZE, dirty_end=idx_end)
            if index == self.ledger_begin_index and base is not None:
                self.ledger_end_index, self.ledger_end_term = base.index, base.term  # empty at its base
            elif index == self.ledger_begin_index:
                self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
            else:
                self.ledger_end_index = index - 1
                self.ledger_end_term = self.term_at(index - 1)
        except OSError as e:
            # Half-truncated files: only recovery can say what the log is now.
            err = self._broken = self._io_failed(e, f"truncate({index})")
            raise err from e
        finally:
            self.end_change()

    def set_committed_index(self, index: int) -> None:
        """Advance the committed index (monotonic, never past the ledger end)."""
        if index > self.ledger_end_index:
            index = self.ledger_end_index
        if index > self.committed_index:
            self.committed_index = index
            if 0 <= self.repair_index <= index:
                self._repaired()

    def _repaired(self) -> None:
        """The committed index reached the repair index: every entry this replica may have
        acknowledged before the damage is here again, written by a leader that has it
        committed. The next checkpoint drops the key (until then a restart only waits for
        the commit again: being a non-voter longer is always safe)."""
        log.warning("%s: repaired: committed entries up to %d are here again; voting resumes",
                    self.dir, self.repair_index)
        self.repair_index = -1
    # ------------------------------------------------------------------ durability
    def flush(self) -> None:
        """fdatasync what was written (and zeroed) since the last flush. A failure leaves the
        store refusing writes until reopened: after a failed fdatasync Linux may drop the dirty
        pages and report success next time, so nothing written before it can be trusted."""
        if self._broken is not None:
            self._check_writable()
        try:
            with self._lock:
                observe = self.flush_observer
                if observe is not None and (self.data.needs_sync() or self.index.needs_sync()):
                    t0 = time.perf_counter_ns()
                    self.data.sync()
                    self.index.sync()
                    observe((time.perf_counter_ns() - t0) // 1000)
                else:
                    self.data.sync()
                    self.index.sync()
        except OSError as e:
            err = self._broken = self._io_failed(e, "flush")
            raise err from e

    def checkpoint(self) -> None:
        """Persist committed index and ledger end — only as far as data is durable, so a
        checkpoint never claims more than recovery can find (DLedger #285: never refuse a
        store we wrote ourselves). The log base, if any, is written with them."""
        with self._cp_lock:
            committed, end = self.committed_index, self.ledger_end_index
            self.flush()  # data first, then a checkpoint that claims no more than that
            self._write_checkpoint(committed, end)

    def _write_checkpoint(self, committed: int, end: int) -> None:
        """The caller holds `_cp_lock` (and read `committed`/`end` under it)."""
        cp = Checkpoint(min(committed, end), end, self._base, self.repair_index)
        if cp != self._checkpointed:
            try:
                write_checkpoint(self.dir, cp)
            except OSError as e:
                raise self._io_failed(e, "checkpoint") from e
            self._checkpointed = cp

    def _flush_service(self) -> None:
        """async: flush every flush_interval_ms and checkpoint every checkpoint_interval_ms.
        sync: appends flush themselves, so only the checkpoint is kept current (every
        checkpoint_interval_ms, off the append path: its fsyncs cost milliseconds).
        Errors cannot be raised to anyone from here: they are logged (once per distinct
        error) and kept in `last_flush_error` until a pass succeeds."""
        cp_every = self.config.checkpoint_interval_ms / 1000
        interval = cp_every if self._sync else self.config.flush_interval_ms / 1000
        next_cp = time.monotonic() + cp_every
        while not self._stop.wait(interval):
            try:
                now = time.monotonic()
                if now >= next_cp:
                    self.checkpoint()  # flushes first
                    next_cp = now + cp_every
                else:
                    self.flush()
                self.last_flush_error = None
            except StoreError as e:
                if self.last_flush_error is None or str(self.last_flush_error) != str(e):
                    log.error("%s: flush service: %s", self.dir, e)
                self.last_flush_error = e
            except Exception:  # noqa: BLE001 - keep flushing; the error is logged
                log.exception("%s: flush service error", self.dir)

    # ------------------------------------------------------------------ retention
    def delete_before(self, index: int, wait: bool = True) -> int | None:
        """Delete whole data files whose entries are all below `index` (never past the committed
        index). Returns files deleted, or None when `wait` is False and the flush service holds
        the file lists (it does for a whole fdatasync: up to ~200 ms under load — the retention
        service retries shortly rather than stall appends for that)."""
        index = min(index, self.committed_index + 1)
        if self._unchecked_end >= 0:
            # Positions come from index records: only those the scrub checked decide a deletion.
            index = min(index, self._scrub_next)
        if index <= self.ledger_begin_index or self.ledger_begin_index < 0:
            return 0
        index = min(index, self.ledger_end_index)
        pos = self.index_record(index).pos
        keep = self.data.find(pos)
        if keep is None or keep is self.data.files[0]:
            return 0
        # Where the log will begin, durably before any file goes: recovery tells a file
        # retention deleted from a lost one by it (`_lost_front`). A crash before the deletion
        # leaves files before that begin, which is no loss (the next deletion takes them).
        first = self._first_index_at(keep.start, self.ledger_begin_index, index)
        try:
            write_log_begin(self.dir, first, keep.start)
        except OSError as e:
            raise self._io_failed(e, "recording the log's new begin") from e
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            n = self.data.delete_files_before(pos)
            if n:  # the new begin: the first entry of the first remaining file (`keep`)
                self.ledger_begin_index = first
                self.index.delete_files_before(first * INDEX_SIZE)
        finally:
            self._lock.release()
        return n

    def _first_index_at(self, pos: int, lo: int, hi: int) -> int:
        """The first index in [lo, hi] whose entry starts at or after data position `pos`
        (positions grow with the index, so a bisection over index records); hi if none."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self.index_record(mid).pos < pos:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def data_file_ranges(self, limit: int) -> list[tuple[int, int, float]]:
        """(first index, last index, last-modified time) of the oldest `limit` data files: what
        the retention decision (node.core.retention) needs. The last file of the store ends at
        the ledger end; a file holding no entry start has last < first."""
        if self.ledger_begin_index < 0:
            return []
        files, end = self.data.files, self.ledger_end_index
        # bounds[i] = first index of file i; one bound past the last file listed (the ledger
        # end + 1 when that is the store's last file), so file i holds [bounds[i], bounds[i+1]).
        bounds = [self.ledger_begin_index]
        for f in files[1:limit + 1]:
            bounds.append(self._first_index_at(f.start, bounds[-1], end + 1))
        if len(files) <= limit:
            bounds.append(end + 1)
        return [(bounds[i], bounds[i + 1] - 1, os.fstat(f.fd).st_mtime)
                for i, f in enumerate(files[:limit])]

    def disk_usage_ratio(self) -> float:
        return disk_usage_ratio(self.dir)

    def stats(self) -> dict[str, int]:
        return {
            "ledger_begin_index": self.ledger_begin_index,
            "ledger_end_index": self.ledger_end_index,
            "ledger_end_term": self.ledger_end_term,
            "committed_index": self.committed_index,
            "data_files": len(self.data.files),
            "index_files": len(self.index.files),
            "data_wrote_position": self.data.wrote_position,
            "generation": self.generation,
            "base_index": self._base.index if self._base is not None else -1,
            "repair_index": self.repair_index,
            "flush_failing": int(self.last_flush_error is not None),
            "refusing_writes": int(self._broken is not None),
        }

