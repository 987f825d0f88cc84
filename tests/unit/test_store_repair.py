"""Damage to committed entries, at open and later (docs/store.md "Repair from peers"): the
store cuts the log at the first entry it cannot trust, records a repair index durably before
the cut, clears it once the committed index (set from a leader) reaches it again, and never
serves a damaged entry. Every damage kind a disk can produce, not just the one a test flips."""

import os

import pytest

from node.store import codec
from node.store.base import StoreCorruptError, StoreError
from node.store.layout import (
    BEGIN_FILE,
    SEGMENTS_FILE,
    Checkpoint,
    existing_file_sizes,
    read_checkpoint,
    read_log_begin,
    read_segment_sizes,
    write_checkpoint,
    write_log_begin,
)
from node.store.mmap_file import StoreIOError
from node.store.segment_store import SegmentStore, StoreConfig

FILE = 4096


def _cfg(path, **kw):
    return StoreConfig(store_dir=str(path), data_file_size=FILE, index_file_size=256, **kw)


def _body(i):
    return bytes([i % 251]) * 300  # ~12 entries per data file


def _write(path, n=60, committed=55):
    with SegmentStore(_cfg(path)) as s:
        for i in range(n):
            s.append_leader(_body(i), 1 + i // 20)
        s.set_committed_index(committed)
        return [s.index_record(i).pos for i in range(n)]


def _data_files(path):
    return sorted((path / "data").iterdir())


def _flip_crc(path, pos, index):
    """One bit of entry `index`'s body CRC flipped: a damaged entry whatever its body."""
    with open(path / "data" / f"{pos[index] - pos[index] % FILE:020d}", "r+b") as fh:
        fh.seek(pos[index] % FILE + codec.BODY_CRC_OFFSET)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 1]))


def _check_prefix(s, end):
    for i in range(end + 1):
        assert bytes(s.get(i).body) == _body(i)


def _scrub_and_repair(s):
    """What the handler does with the entries recovery left to the scrub (below the
    checkpoint's committed entry): scrub them, and hand damage to `mark_damaged`."""
    try:
        s.scrub()
    except StoreCorruptError as e:
        s.mark_damaged(e.index, str(e))


def _catch_up(s, upto, committed):
    """What a leader's pushes do: entries again, then the commit index."""
    for i in range(s.ledger_end_index + 1, upto + 1):
        s.append_leader(_body(i), 1 + i // 20)
    s.set_committed_index(committed)


@pytest.mark.parametrize("verify_files", [3, 100])
def test_flipped_body_byte_in_a_verified_file(tmp_path, verify_files):
    pos = _write(tmp_path)
    victim = 50 if verify_files == 3 else 10  # the last 3 files are CRC-checked by default
    with open(tmp_path / "data" / f"{pos[victim] - pos[victim] % FILE:020d}", "r+b") as fh:
        fh.seek(pos[victim] % FILE + codec.HEADER_SIZE + 100)
        fh.write(b"\x00")
    with SegmentStore(_cfg(tmp_path, recover_verify_files=verify_files)) as s:
        _scrub_and_repair(s)  # both victims are below the checkpoint's committed entry (55)
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (victim - 1, victim - 2, 59)
        _check_prefix(s, victim - 1)
        _catch_up(s, 59, 55)
        assert s.repair_index == 59  # committed 55 < 59: entries it may have acked are not all back
        s.set_committed_index(59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.repair_index == -1 and read_checkpoint(tmp_path).repair_index == -1
        _check_prefix(s, 59)


def test_missing_middle_data_file(tmp_path):
    _write(tmp_path)
    files = _data_files(tmp_path)
    gone = files[2]
    gone.unlink()
    with SegmentStore(_cfg(tmp_path)) as s:
        first_lost = s.ledger_end_index + 1
        assert first_lost > 0 and s.repair_index == 59
        assert s.data.files[-1].end <= int(gone.name) + FILE  # files after the hole are gone
        _check_prefix(s, s.ledger_end_index)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        _check_prefix(s, 59)


def test_missing_last_data_file_below_commit(tmp_path):
    _write(tmp_path, committed=59)
    _data_files(tmp_path)[-1].unlink()
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.ledger_end_index < 59 and s.repair_index == 59


def test_truncated_data_file(tmp_path):
    _write(tmp_path)
    f = _data_files(tmp_path)[1]
    os.truncate(f, 1000)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert s.repair_index == 59 and len(s.data.files) == 1
        _check_prefix(s, s.ledger_end_index)


def test_every_file_of_another_size_is_a_configuration_error(tmp_path):
    _write(tmp_path)
    with pytest.raises(StoreIOError, match="configured for 8192"):
        SegmentStore(StoreConfig(store_dir=str(tmp_path), data_file_size=8192, index_file_size=256)).open()
    with SegmentStore(_cfg(tmp_path)) as s:  # nothing was thrown away
        assert s.ledger_end_index == 59 and s.repair_index == -1


def test_truncated_or_missing_index_file_is_rebuilt_without_repair(tmp_path):
    _write(tmp_path)
    idx = sorted((tmp_path / "index").iterdir())
    os.truncate(idx[1], 100)
    idx[3].unlink()
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.repair_index) == (59, -1)  # the index is derived data
        _check_prefix(s, 59)


def test_garbled_header_in_committed_range(tmp_path):
    pos = _write(tmp_path)
    with open(tmp_path / "data" / f"{pos[20] - pos[20] % FILE:020d}", "r+b") as fh:
        fh.seek(pos[20] % FILE + 8)  # the index field
        fh.write(b"\x7f" * 8)
    with SegmentStore(_cfg(tmp_path)) as s:
        _scrub_and_repair(s)
        assert (s.ledger_end_index, s.repair_index) == (19, 59)


def test_mark_damaged_at_runtime_cuts_below_commit_and_survives_restart(tmp_path):
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        g = s.generation
        assert s.mark_damaged(30, "CRC mismatch on read") == 59
        assert (s.ledger_end_index, s.committed_index) == (29, 28)
        assert s.generation > g  # readers mapping the old files are fenced
        _check_prefix(s, 29)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.repair_index) == (29, 59)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1


def test_damage_at_the_begin_of_a_trimmed_log_empties_it_and_repairs(tmp_path):
    """No entry before the first of a trimmed log to cut after, and an empty log beginning at
    that index would need the term before it, which retention deleted: the node stopped
    ("cannot cut there") and needed an operator. It now drops the whole log, as a lost disk
    would, with the repair index recorded first, and takes the log again from the leader."""
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()  # retention deletes only what the scrub has checked
        s.delete_before(40)
        begin = s.ledger_begin_index
        assert begin > 0
        g = s.generation
        assert s.mark_damaged(begin, "x") == 59
        assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index) == (-1, -1, -1)
        assert s.generation > g and not _data_files(tmp_path) and read_log_begin(tmp_path) is None
    with SegmentStore(_cfg(tmp_path)) as s:  # durable: still empty, still repairing
        assert (s.ledger_end_index, s.repair_index) == (-1, 59)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        _check_prefix(s, 59)


def test_a_crash_while_a_damaged_trimmed_log_is_dropped_reopens_repairing(tmp_path):
    """The checkpoint is written first (repair index, empty log), then the files go front
    first: a crash after some of them left a suffix that starts past the recorded begin, which
    recovery reads as a lost front and drops the same way."""
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        s.delete_before(30)
        s.mark_damaged(s.ledger_begin_index, "x")
    # as if the deletions had stopped after the first file: put back a suffix of the old files
    _write(tmp_path / "old", committed=59)
    with SegmentStore(_cfg(tmp_path / "old")) as s:
        s.scrub()
        s.delete_before(30)
        begin = read_log_begin(tmp_path / "old")
    for f in _data_files(tmp_path / "old")[1:]:
        os.rename(f, tmp_path / "data" / f.name)
    write_log_begin(tmp_path, *begin)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.repair_index) == (-1, 59)
        assert not _data_files(tmp_path)


def test_install_clears_repair_when_it_covers_it(tmp_path):
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.mark_damaged(10, "x")
        s.reset_to(70, 4)
        assert s.repair_index == -1
    assert read_checkpoint(tmp_path).repair_index == -1


@pytest.mark.parametrize("committed, n", [(55, 60), (59, 60), (0, 60)],
                         ids=["mid-log", "last-entry", "first-entry"])
def test_damaged_checkpointed_entry_keeps_the_prefix_below_it(tmp_path, committed, n):
    """The walk at open starts at the checkpoint's committed entry C; here C itself is damaged,
    so the walk keeps no entry at all. What is below C is still the log the checkpoint vouches
    for: its index stays, its end term is C - 1's (a vote and the leader's COMPARE read it),
    and the scrub still has it to check. (A store that dropped that index and reported end term
    -1 could never be repaired: the leader's COMPARE at its end never matched.)"""
    pos = _write(tmp_path, n=n, committed=committed)
    _flip_crc(tmp_path, pos, committed)
    end = committed - 1
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (end, max(end - 1, -1), n - 1)
        assert s.ledger_begin_index == (0 if end >= 0 else -1)
        assert s.ledger_end_term == (1 + end // 20 if end >= 0 else -1)
        assert s.unchecked_end == end  # nothing below C was checked: the scrub's to do
        _check_prefix(s, end)
        assert [s.term_at(i) for i in range(end + 1)] == [1 + i // 20 for i in range(end + 1)]
        s.scrub()
        assert s.unchecked_end == -1
        _catch_up(s, n - 1, n - 1)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.repair_index) == (n - 1, -1)
        _check_prefix(s, n - 1)


def test_damage_above_the_commit_but_within_the_checkpoint_end_is_repaired_not_cut(tmp_path):
    """Entries up to the checkpoint's end index were on disk when it was written: this node may
    have acknowledged them, and a leader counted them toward a commit this node never heard
    of. A crash cannot tear them, so one that fails its CRC is damage: cut as a torn tail, the
    node would vote with a shorter log than it acknowledged and could elect a leader that lacks
    a committed entry. It is repaired instead, up to that end index."""
    pos = _write(tmp_path, n=60, committed=40)
    assert read_checkpoint(tmp_path).end_index == 59
    _flip_crc(tmp_path, pos, 50)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (49, 40, 59)
        assert "durable entry 50 is damaged" in s.damage
        _check_prefix(s, 49)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    assert read_checkpoint(tmp_path).repair_index == -1


def test_a_truncation_lowers_the_checkpoint_end_before_it_cuts(tmp_path):
    """What replaces a cut range is not on disk until the next flush: the checkpoint must stop
    vouching for that range first, or a crash that tore the new entries would read as damage."""
    _write(tmp_path, n=60, committed=40)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert read_checkpoint(tmp_path).end_index == 59
        s.truncate(45)
        cp = read_checkpoint(tmp_path)
        assert (cp.committed_index, cp.end_index) == (40, 44)
        assert s.ledger_end_index == 44


def test_durable_entries_read_as_zeros_are_repaired(tmp_path):
    """A range the checkpoint's end index vouches for that reads back as zeros (a lost write
    of a block the file system had acknowledged) looks like the end of the log. It is not: the
    node may have acknowledged those entries, so they are repaired like damaged ones."""
    pos = _write(tmp_path, n=60, committed=40)
    first = pos[50]
    with open(tmp_path / "data" / f"{first - first % FILE:020d}", "r+b") as fh:
        fh.seek(first % FILE)
        fh.write(b"\0" * (FILE - first % FILE))
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (49, 40, 59)
        _check_prefix(s, 49)


@pytest.mark.parametrize("junk", [b"\xff\xfe\x00garbage", b"committedIndex=zz\nendIndex=59\n",
                                  b"committedIndex=40\nendIndex=59\nbaseIndex=3\n"],
                         ids=["not-utf8", "not-a-number", "half-a-base"])
def test_a_damaged_checkpoint_is_set_aside_not_a_reason_to_refuse(tmp_path, junk):
    """The checkpoint only vouches for part of the log; the log is in the files. A damaged one
    is kept for the operator and the store opens as without one: every entry there, the
    committed index unknown until a leader says it again."""
    _write(tmp_path, n=60, committed=40)
    (tmp_path / "checkpoint").write_bytes(junk)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index, s.repair_index) == (0, 59, -1, -1)
        _check_prefix(s, 59)
        s.scrub()
        s.set_committed_index(59)
    assert (tmp_path / "checkpoint.damaged").read_bytes() == junk
    assert read_checkpoint(tmp_path).committed_index == 59
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.committed_index) == (59, 59)


def _patch_index(path, index, rel, data):
    with open(path / "index" / f"{index * 32 - index * 32 % 256:020d}", "r+b") as fh:
        fh.seek(index * 32 % 256 + rel)
        fh.write(data)


@pytest.mark.parametrize("damage", [(0, b"\x00" * 32), (4, b"\x00\x00\x00\x00\x00\x00\x20\x00"),
                                    (12, b"\x00\x00\x01\x00"), (16, b"\x7f" * 8), (0, b"\xa5" * 64)],
                         ids=["zeroed", "pos", "size", "index", "two-records-garbage"])
def test_a_damaged_index_record_of_an_intact_entry_is_rewritten_not_repaired(tmp_path, damage):
    """Index records are derived from the data: when the scrub finds one that disagrees with
    an entry whose data passes every check, it rewrites it from the data. Nothing is cut or
    fetched, the node keeps its vote. (Before, the scrub called it committed damage, and the
    cut then read the same record to find where to cut, failed, and the node stopped for good:
    a flipped byte in derived data made a replica unusable.)"""
    rel, junk = damage
    _write(tmp_path, committed=55)
    with SegmentStore(_cfg(tmp_path)) as s:
        want = [bytes(s.index.read(i * 32, 32)) for i in range(60)]
    _patch_index(tmp_path, 9, rel, junk)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (59, 55, -1)
        assert [bytes(s.index.read(i * 32, 32)) for i in range(60)] == want
        _check_prefix(s, 59)


@pytest.mark.parametrize("where", ["record", "header"])
def test_a_term_the_record_and_the_header_disagree_on_is_damage(tmp_path, where):
    """A data header has no CRC of its own, so when a record naming entry 9 and entry 9's
    header disagree on its term, which one was damaged cannot be told: rewriting the record
    from a header whose term was flipped would make a wrong term the log's (votes and the
    leader's COMPARE read terms). It is damage, cut at 9 and fetched again."""
    pos = _write(tmp_path, committed=55)
    if where == "record":
        _patch_index(tmp_path, 9, 24, (7).to_bytes(8, "big"))
    else:
        with open(tmp_path / "data" / f"{pos[9] - pos[9] % FILE:020d}", "r+b") as fh:
            fh.seek(pos[9] % FILE + codec.TERM_OFFSET)
            fh.write((7).to_bytes(8, "big"))
    with SegmentStore(_cfg(tmp_path)) as s:
        _scrub_and_repair(s)
        assert (s.ledger_end_index, s.ledger_end_term, s.repair_index) == (8, 1, 59)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
        _check_prefix(s, 59)
        assert [s.term_at(i) for i in range(60)] == [1 + i // 20 for i in range(60)]


def test_a_read_that_meets_a_damaged_index_record_rewrites_it(tmp_path):
    """GET reaches a damaged record before the scrub does: `fix_index_records` (what the
    handler's damage path tries first) rewrites it, and the entry reads again."""
    _write(tmp_path, committed=55)
    _patch_index(tmp_path, 9, 4, b"\x00" * 8)
    with SegmentStore(_cfg(tmp_path)) as s:
        with pytest.raises(StoreError):
            s.get(9)
        assert s.fix_index_records(9) == 1
        assert bytes(s.get(9).body) == _body(9) and s.repair_index == -1
        assert s.fix_index_records(9) == 0  # nothing left to rewrite: cannot loop


def test_damaged_entry_whose_index_record_is_damaged_too_is_cut_where_the_entry_before_ends(tmp_path):
    """Data and record of entry 9 both damaged: the record cannot be rewritten (the data fails
    its CRC), so it is damage, and the cut must not trust entry 9's record to find where
    entry 9 begins: it takes the end of entry 8, checked against 8's own header. The range is
    then fetched again like any damage."""
    pos = _write(tmp_path, committed=55)
    _flip_crc(tmp_path, pos, 9)
    _patch_index(tmp_path, 9, 4, b"\x00" * 8)
    with SegmentStore(_cfg(tmp_path)) as s:
        _scrub_and_repair(s)
        assert (s.ledger_end_index, s.committed_index, s.repair_index) == (8, 7, 59)
        assert s.data.wrote_position == pos[8] + codec.HEADER_SIZE + len(_body(8))
        _check_prefix(s, 8)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        assert (s.ledger_end_index, s.repair_index) == (59, -1)
        _check_prefix(s, 59)


ONE_FILE = 65536  # the 60 entries of `_write` fit in one data file, as a default 1 GiB store's do


def _one_file_cfg(path, **kw):
    return StoreConfig(store_dir=str(path), data_file_size=ONE_FILE, index_file_size=256, **kw)


def _write_one_file(path, n=60, committed=55):
    with SegmentStore(_one_file_cfg(path)) as s:
        for i in range(n):
            s.append_leader(_body(i), 1 + i // 20)
        s.set_committed_index(committed)
    assert len(_data_files(path)) == 1


@pytest.mark.parametrize("length", [5000, ONE_FILE // 2, ONE_FILE + 100, 0],
                         ids=["torn", "half", "extended", "empty"])
def test_the_only_data_file_of_another_length_is_damage_not_a_configuration_error(tmp_path, length):
    """With 1 GiB data files (the default) a store has one data file, and its length alone
    cannot tell a truncated file from a store made with another size: the store refused to
    open ("configured for ..."), so a node with a damaged file never came back. The sizes a
    store was made with are recorded (`segments`), so such a file is damage: cut, recorded,
    fetched again."""
    _write_one_file(tmp_path)
    os.truncate(_data_files(tmp_path)[0], length)
    with SegmentStore(_one_file_cfg(tmp_path)) as s:
        assert s.repair_index == 59 and s.ledger_end_index < 55
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_one_file_cfg(tmp_path)) as s:
        _check_prefix(s, 59)


def test_recorded_sizes_other_than_the_configured_ones_are_a_configuration_error(tmp_path):
    _write_one_file(tmp_path)
    with pytest.raises(StoreIOError, match=f"created with {ONE_FILE}-byte data files .* configured for 4096"):
        SegmentStore(_cfg(tmp_path)).open()
    with SegmentStore(_one_file_cfg(tmp_path)) as s:  # nothing was touched
        assert (s.ledger_end_index, s.repair_index) == (59, -1)


def test_a_store_without_recorded_sizes_keeps_the_old_rule_and_records_them_once_healthy(tmp_path):
    """A store made before the sizes were recorded: every file of the same other size is still
    a configuration mistake (nothing says otherwise); once it opens with its files all of the
    configured size, the sizes are recorded."""
    _write_one_file(tmp_path)
    (tmp_path / SEGMENTS_FILE).unlink()
    with pytest.raises(StoreIOError, match="configured for 4096"):
        SegmentStore(_cfg(tmp_path)).open()
    assert not (tmp_path / SEGMENTS_FILE).exists()
    with SegmentStore(_one_file_cfg(tmp_path)) as s:
        assert s.ledger_end_index == 59
    assert read_segment_sizes(tmp_path) == {"data_file_size": ONE_FILE, "index_file_size": 256}
    assert existing_file_sizes(tmp_path) == {"data_file_size": ONE_FILE, "index_file_size": 256}


def test_a_lost_first_data_file_is_damage_not_a_trimmed_log(tmp_path):
    """Without a record of where the log begins, a missing first data file looked exactly like
    retention having deleted it: the log began later, the lost committed entries were gone
    from this replica for good and nothing said so. Retention records the begin before it
    deletes (`DIR/begin`); a first file that starts later than that was lost: the whole log is
    fetched again (the store keeps no holes), and the node does not vote meanwhile."""
    _write(tmp_path, committed=55)
    _data_files(tmp_path)[0].unlink()
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (-1, -1, 59)
        assert "the data files before" in s.damage
        assert not _data_files(tmp_path)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        assert (s.ledger_begin_index, s.ledger_end_index) == (0, 59)
        _check_prefix(s, 59)


def test_retention_records_the_begin_so_a_trimmed_log_reopens_as_trimmed_and_a_later_loss_is_seen(tmp_path):
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()  # retention deletes only what the scrub checked
        assert s.delete_before(30) > 0
        begin = s.ledger_begin_index
        assert read_log_begin(tmp_path) == (begin, s.data.files[0].start)
    with SegmentStore(_cfg(tmp_path)) as s:  # deleted by retention: no damage
        assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (begin, 59, -1)
    _data_files(tmp_path)[0].unlink()  # now lost
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.repair_index) == (-1, 59)
        assert f"the log began at entry {begin}" in s.damage
    assert read_log_begin(tmp_path) is None  # the log begins anew, wherever the leader sends it from


def test_a_crash_between_recording_the_begin_and_deleting_loses_nothing(tmp_path):
    """Retention writes the new begin, then deletes: a crash in between leaves files before
    the recorded begin. They are the log's, not damage."""
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        first_kept = s.data.files[2]
        write_log_begin(tmp_path, 25, first_kept.start)  # as delete_before does first
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (0, 59, -1)


def test_a_store_trimmed_before_the_begin_was_recorded_is_not_read_as_damaged(tmp_path):
    """A store an older version trimmed has no `begin` (nor `segments`) file: its first open
    by this version records the begin it finds, so the next open does not call it lost."""
    _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        s.delete_before(30)
        begin = s.ledger_begin_index
    (tmp_path / SEGMENTS_FILE).unlink()
    (tmp_path / BEGIN_FILE).unlink()
    for _ in range(2):
        with SegmentStore(_cfg(tmp_path)) as s:
            assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (begin, 59, -1)
    assert read_log_begin(tmp_path)[0] == begin


def test_a_damaged_record_of_the_entry_before_the_checkpoint_does_not_become_the_end_term(tmp_path):
    """Recovery starts at the checkpoint's committed entry C and takes C - 1's term from its
    index record; when C then fails, that term is the log's end term, which votes and the
    leader's COMPARE read. A record whose term was damaged gave the node a term its log never
    had (here 32769: every append after the repair was refused as going back in term, so the
    repair never ended). The records the shortcut takes are checked against their headers."""
    pos = _write(tmp_path, committed=20)
    _patch_index(tmp_path, 19, 24, (32769).to_bytes(8, "big"))
    _flip_crc(tmp_path, pos, 20)
    with SegmentStore(_cfg(tmp_path)) as s:
        # The shortcut is refused (19's record disagrees with its header): a full walk, which
        # leaves the early files' CRCs to the scrub; the scrub then finds 20 and cuts there.
        assert (s.ledger_end_index, s.ledger_end_term) == (59, 3)
        _scrub_and_repair(s)
        assert (s.ledger_end_index, s.ledger_end_term, s.repair_index) == (19, 1, 59)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
        _check_prefix(s, 59)


def test_a_damaged_index_in_the_first_header_does_not_move_the_log(tmp_path):
    """A full walk (here the index list is rebuilt) took the log's first index from the first
    header it read: a flipped bit there made the log begin at entry 2**29, the committed
    entries were gone without a repair, and the index rebuild wrote records far outside its
    files. The store knows where its log begins (entry 0, a base, or retention's record), so
    the first entry is checked against that like any other."""
    pos = _write(tmp_path, committed=55)
    with open(tmp_path / "data" / f"{0:020d}", "r+b") as fh:
        fh.seek(pos[0] + codec.INDEX_OFFSET)
        fh.write((1 << 29).to_bytes(8, "big"))
    os.truncate(sorted((tmp_path / "index").iterdir())[0], 100)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (-1, -1, 59)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
        _check_prefix(s, 59)


def test_a_last_entry_whose_term_is_above_the_nodes_current_term_is_damage(tmp_path):
    """A header has no CRC of its own, and the last entry has nothing after it to contradict a
    flipped term: one bit raising it gave the node a last term no other could beat (it won
    every election, and as leader could not append in its own lower term). No entry's term
    can exceed the current term on disk (`currterm`: saved before the node acts in a term),
    so the walk calls that damage: repaired like any other."""
    from node.store.term_vote import TermVoteFile

    pos = _write(tmp_path, committed=55)
    TermVoteFile(tmp_path).save(3, None)
    with open(tmp_path / "data" / f"{pos[59] - pos[59] % FILE:020d}", "r+b") as fh:
        fh.seek(pos[59] % FILE + codec.TERM_OFFSET)
        fh.write((1 << 20).to_bytes(8, "big"))
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_end_index, s.ledger_end_term, s.repair_index) == (58, 3, 59)
        assert "above this node's current term 3" in s.damage
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
        _check_prefix(s, 59)


def test_a_damaged_first_entry_that_is_also_the_checkpoints_committed_entry_drops_the_trimmed_log(tmp_path):
    """Recovery walks from the checkpoint's committed entry C; in a log retention trimmed so
    far that C is its first entry, a damaged C left nothing to keep, and the store reopened
    claiming entries up to C - 1 with no entry at all (begin -1, end C - 1), which no push
    could continue. It is dropped as a lost disk leaves it, like damage to a trimmed log's
    first entry found later (`_drop_whole_log`)."""
    pos = _write(tmp_path, committed=59)
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        s.delete_before(40)
        c = s.ledger_begin_index
    write_checkpoint(tmp_path, Checkpoint(c, 59))  # committed index C = the first entry
    _flip_crc(tmp_path, pos, c)
    with SegmentStore(_cfg(tmp_path)) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index, s.repair_index) == (-1, -1, -1, 59)
        assert f"committed entry {c} is damaged" in s.damage and not _data_files(tmp_path)
        _catch_up(s, 59, 59)
        assert s.repair_index == -1
    with SegmentStore(_cfg(tmp_path)) as s:
        s.scrub()
        _check_prefix(s, 59)
