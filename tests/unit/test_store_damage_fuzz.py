"""Random damage to a stopped store's files, then what a node does with it (docs/store.md
"Recovery" and "Repair from peers"), on the real `SegmentStore`: open, the scrub, reads, and
a leader's catch-up. Whatever the damage -- flipped bits, zeroed or random runs, a file
truncated, extended or deleted, in data, index, checkpoint or the store's small files -- the
store must open (never a refusal, never a traceback), never hand out an entry other than the
one written, never keep a committed entry with a term its leader does not have, and end, once
caught up, holding exactly the log that was written. Each trial is a seed: a failure names it,
and `_trial(seed)` replays it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from node.store.base import CorruptEntry, StoreCorruptError, StoreError
from node.store.mmap_file import StoreIOError
from node.store.segment_store import SegmentStore, StoreConfig
from node.store.term_vote import TermVoteFile

FILE = 4096
TRIALS = int(os.environ.get("DLEDGER_DAMAGE_TRIALS", "250"))
FIRST = int(os.environ.get("DLEDGER_DAMAGE_FIRST", "0"))


def _cfg(path: Path) -> StoreConfig:
    return StoreConfig(store_dir=str(path), data_file_size=FILE, index_file_size=256)


def _body(i: int) -> bytes:
    return bytes([i % 251]) * (100 + (i * 37) % 400)


def _term(i: int) -> int:
    return 1 + i // 20


def _files(path: Path) -> list[Path]:
    out = [p for d in ("data", "index") if (path / d).is_dir() for p in sorted((path / d).iterdir())]
    return out + [path / n for n in ("checkpoint", "segments", "begin") if (path / n).exists()]


def _damage(path: Path, rng: random.Random) -> str:
    f = rng.choice(_files(path))
    kind = rng.choice(["flip", "flip", "flip", "zero", "garbage", "truncate", "unlink", "extend"])
    size = f.stat().st_size
    what = f"{kind} {f.relative_to(path)}"
    if kind in ("flip", "zero", "garbage") and size:
        with open(f, "r+b") as fh:
            for _ in range(rng.randint(1, 3)) if kind == "flip" else [0]:
                off = rng.randrange(size)
                fh.seek(off)
                if kind == "flip":
                    b = fh.read(1)
                    fh.seek(off)
                    fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
                else:
                    n = rng.randint(1, min(size - off, 64 if kind == "garbage" else size))
                    fh.write(b"\0" * n if kind == "zero" else rng.randbytes(n))
                what += f" @{off}"
    elif kind == "truncate":
        os.truncate(f, rng.randrange(size + 1) if size else 0)
    elif kind == "unlink":
        f.unlink()
    elif kind == "extend":
        with open(f, "ab") as fh:
            fh.write(b"\1" * rng.randint(1, 100))
    return what


def _damaged_at(s: SegmentStore, i: int) -> None:
    """The handler's damage path (node/roles/handling/damage.py): the derived index first,
    then the cut."""
    if s.fix_index_records(i):
        try:
            s.get(i)
            return
        except StoreError:
            pass
    s.mark_damaged(i, "found by the test")


def _trial(seed: int, path: Path) -> None:
    rng = random.Random(seed)
    n = rng.randint(5, 80)
    committed = rng.randint(-1, n - 1)
    with SegmentStore(_cfg(path)) as s:
        for i in range(n):
            s.append_leader(_body(i), _term(i))
        s.set_committed_index(committed)
    TermVoteFile(path).save(_term(n - 1), None)  # as the elector: no entry's term is above it
    damage = [_damage(path, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    ctx = f"seed {seed}: n={n} committed={committed} damage={damage}"
    s = SegmentStore(_cfg(path))
    try:
        s.open()  # never refused while the sizes are recorded: the rest is damage
    except StoreIOError:
        if "unlink segments" not in damage:
            raise
        return  # no record of the sizes, every data file of one other size: the old rule

    try:
        for _ in range(n + 2):  # the scrub, each finding through the damage path
            try:
                s.scrub()
                break
            except StoreCorruptError as e:
                _damaged_at(s, e.index)
        i = max(s.ledger_begin_index, 0)
        while i <= s.ledger_end_index:  # every read: the entry written, or an error
            try:
                e = s.get(i)
            except CorruptEntry:
                _damaged_at(s, i)
                continue
            assert bytes(e.body) == _body(i), f"{ctx}: entry {i} read back other bytes"
            i += 1
        # The leader's COMPARE from the follower's end back: a term that differs is cut
        # (never a committed one), then its APPENDs and its commit index.
        end = s.ledger_end_index
        while end >= max(s.ledger_begin_index, 0) and s.term_at(end) != _term(end):
            end -= 1
        assert end >= s.committed_index, f"{ctx}: committed entry {end + 1} has a term the leader never wrote"
        if end < s.ledger_end_index:
            s.truncate(end + 1)
        # A damaged checkpoint can claim more than was written (a flipped digit): the repair
        # then waits until the group's commit gets there, as it would for new appends.
        n = max(n, s.repair_index + 1)
        for i in range(s.ledger_end_index + 1, n):
            s.append_leader(_body(i), _term(i))
        s.set_committed_index(n - 1)
        assert s.repair_index == -1, f"{ctx}: repair not done at the leader's commit"
    finally:
        s.close()
    TermVoteFile(path).save(max(_term(n - 1), TermVoteFile(path).current.term), None)  # the leader's term
    with SegmentStore(_cfg(path)) as s:
        s.scrub()
        if "unlink segments" in damage and s.ledger_begin_index > 0:
            # No record of the sizes nor of the begin (a store of an older version, here made
            # by deleting the file): a lost first file reads as a trimmed log, as it always did.
            n0 = s.ledger_begin_index
        else:
            n0 = 0
        assert (s.ledger_begin_index, s.ledger_end_index, s.repair_index) == (n0, n - 1, -1), ctx
        assert [bytes(s.get(i).body) for i in range(n0, n)] == [_body(i) for i in range(n0, n)], ctx
        assert [s.term_at(i) for i in range(n0, n)] == [_term(i) for i in range(n0, n)], ctx


@pytest.mark.parametrize("chunk", range(5))
def test_random_damage_opens_serves_nothing_wrong_and_repairs(tmp_path, chunk):
    per = TRIALS // 5
    for seed in range(FIRST + chunk * per, FIRST + (chunk + 1) * per):
        d = tmp_path / str(seed)
        d.mkdir()
        _trial(seed, d)
