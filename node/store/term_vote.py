"""The durable term/vote file (DLedger's `currterm`: `currTerm=` and `voteLeader=`).

Raft's safety rests on a node never voting twice in one term and never going back to an
older term, across restarts too. DLedger writes this file without fsync; we write it
atomically (temp file + fsync + rename + directory fsync) and the elector acts on a new term
or vote only after `save` returns (persist before send).

A file that is present but unreadable (not UTF-8, no `currTerm=`/`voteLeader=` line, a term
that is not a non-negative integer) raises `TermFileDamaged` naming the file: loading it as
"term 0, no vote" would let the node vote a second time in a term it already voted in. The
elector opens it with `tolerate_damage=True` and, for a damaged or an absent file alike, learns
the group's term before voting (node/core/lost_state.py; docs/election.md "Non-voting
members"), then saves the term with `LOST_VOTE`. A failed save (ENOSPC, EIO) raises a store error (DISK_FULL /
DISK_ERROR) naming the file, and the term/vote in memory stays what is on disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from node.store.base import store_error_from_os
from node.store.layout import TERM_FILE, LayoutError, parse_properties, write_properties_atomically

TERM_KEY = "currTerm"
VOTE_KEY = "voteLeader"
CATCH_UP_KEY = "catchUpIndex"
FLOOR_TERM_KEY = "voteFloorTerm"
FLOOR_INDEX_KEY = "voteFloorIndex"
LOST_VOTE = "<lost>"
"""The vote recorded for a term this node may have voted in but cannot tell for whom (its
term/vote state was lost; docs/election.md "Non-voting members"): no member has this id, so
the one-vote-per-term rule then refuses every vote in that term, and only that term."""


class TermFileDamaged(LayoutError):
    """The term/vote file exists but cannot be trusted: never read as term 0 (the elector
    learns the group's term instead)."""


@dataclass(frozen=True, slots=True)
class TermVote:
    term: int = 0
    voted_for: str | None = None  # a peer id, or None when no vote was cast in `term`
    catch_up: int = -1
    """-1, or: this node lost its disk and must hold entries up to this index, committed,
    before it votes (what the group had when it rejoined)."""
    floor: tuple[int, int] | None = None
    """With `catch_up`: the most up to date log (last term, last index) the members reported
    when it rejoined. Until it caught up, the node votes only for a candidate whose log reaches
    it, and is caught up once its own does: such a log holds every entry it could have stored
    (node/core/lost_state.py). None (a file from before these keys): no such vote."""


class TermVoteFile:
    """Load/save the term and vote of one node. `save` refuses to go backwards."""

    def __init__(self, store_dir: str | os.PathLike[str], tolerate_damage: bool = False) -> None:
        self.path = Path(store_dir) / TERM_FILE
        self.absent = not self.path.exists()
        # Why the file could not be trusted (tolerate_damage: the elector then learns the
        # group's term before voting instead of refusing to start); None when it was read.
        self.damaged: str | None = None
        try:
            self.current = self.load()
        except TermFileDamaged as e:
            if not tolerate_damage:
                raise
            self.damaged = str(e)
            self.current = TermVote()

    def load(self) -> TermVote:
        """The saved term/vote; TermVote() when there is no file (a new node). Raises
        TermFileDamaged (naming the file and what is wrong) for anything else unreadable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return TermVote()
        except OSError as e:
            raise TermFileDamaged(f"{self.path}: cannot read the term/vote file: {e.strerror or e}") from e
        try:
            props = parse_properties(self.path, raw)
        except LayoutError as e:
            raise TermFileDamaged(str(e)) from None
        missing = [k for k in (TERM_KEY, VOTE_KEY) if k not in props]
        if missing:
            what = "empty" if not raw.strip() else f"no {' / '.join(k + '=' for k in missing)} line"
            raise TermFileDamaged(f"{self.path}: damaged term/vote file ({what}); refusing to guess "
                                  "the term and vote")
        value = props[TERM_KEY]
        try:
            term = int(value)
        except ValueError:
            term = -1
        if term < 0 or not value.isdigit():
            raise TermFileDamaged(f"{self.path}: {TERM_KEY}={value!r} is not a non-negative integer")
        catch_up = props.get(CATCH_UP_KEY, "-1")
        try:
            catch_up_index = int(catch_up)
        except ValueError:
            raise TermFileDamaged(f"{self.path}: {CATCH_UP_KEY}={catch_up!r} is not an integer") from None
        floor = None
        if FLOOR_TERM_KEY in props or FLOOR_INDEX_KEY in props:
            raw_floor = (props.get(FLOOR_TERM_KEY, ""), props.get(FLOOR_INDEX_KEY, ""))
            try:
                floor = (int(raw_floor[0]), int(raw_floor[1]))
            except ValueError:
                raise TermFileDamaged(f"{self.path}: {FLOOR_TERM_KEY}={raw_floor[0]!r} / "
                                      f"{FLOOR_INDEX_KEY}={raw_floor[1]!r} are not integers") from None
        return TermVote(term, props[VOTE_KEY] or None, catch_up_index, floor)

    def save(self, term: int, voted_for: str | None, catch_up: int | None = None,
             floor: tuple[int, int] | None = None) -> TermVote:
        """Durably record (term, voted_for). A lower term, or a different vote in the same term,
        is a bug in the caller and raises instead of being written. `catch_up` None keeps the
        current catch-up index and floor; otherwise both are replaced. An I/O failure raises DiskFull/DiskError naming the file; nothing changes
        then. A damaged file is replaced whole by the first save."""
        cur = self.current
        if term < cur.term:
            raise ValueError(f"term going backwards: {cur.term} -> {term}")
        if term == cur.term and cur.voted_for is not None and voted_for != cur.voted_for:
            raise ValueError(f"second vote in term {term}: {cur.voted_for} then {voted_for}")
        new = (TermVote(term, voted_for, cur.catch_up, cur.floor) if catch_up is None
               else TermVote(term, voted_for, catch_up, floor if catch_up >= 0 else None))
        if new != cur or self.damaged is not None:
            values: dict[str, object] = {TERM_KEY: term, VOTE_KEY: voted_for or ""}
            if new.catch_up >= 0:
                values[CATCH_UP_KEY] = new.catch_up
                if new.floor is not None:
                    values[FLOOR_TERM_KEY], values[FLOOR_INDEX_KEY] = new.floor
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_properties_atomically(self.path, values)
            except OSError as e:
                raise store_error_from_os(e, f"saving term {term} / vote {voted_for or '-'}") from e
            self.current = new
            self.damaged = None
            self.absent = False
        return new
