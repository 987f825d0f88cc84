"""The durable term/vote file (DLedger's `currterm`: `currTerm=` and `voteLeader=`).

Raft's safety rests on a node never voting twice in one term and never going back to an
older term, across restarts too. DLedger writes this file without fsync; we write it
atomically (temp file + fsync + rename + directory fsync) and the elector acts on a new term
or vote only after `save` returns (persist before send).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from node.store.layout import TERM_FILE, LayoutError, read_properties, write_properties_atomically


@dataclass(frozen=True, slots=True)
class TermVote:
    term: int = 0
    voted_for: str | None = None  # a peer id, or None when no vote was cast in `term`


class TermVoteFile:
    """Load/save the term and vote of one node. `save` refuses to go backwards."""

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.path = Path(store_dir) / TERM_FILE
        self.current = self.load()

    def load(self) -> TermVote:
        props = read_properties(self.path)
        if not props:
            return TermVote()
        try:
            term = int(props.get("currTerm", "0"))
        except ValueError as e:
            raise LayoutError(f"{self.path}: currTerm is not an integer") from e
        voted = props.get("voteLeader") or None
        return TermVote(term, voted)

    def save(self, term: int, voted_for: str | None) -> TermVote:
        """Durably record (term, voted_for). A lower term, or a different vote in the same term,
        is a bug in the caller and raises instead of being written."""
        cur = self.current
        if term < cur.term:
            raise ValueError(f"term going backwards: {cur.term} -> {term}")
        if term == cur.term and cur.voted_for is not None and voted_for != cur.voted_for:
            raise ValueError(f"second vote in term {term}: {cur.voted_for} then {voted_for}")
        new = TermVote(term, voted_for)
        if new != cur:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_properties_atomically(self.path, {"currTerm": term, "voteLeader": voted_for or ""})
            self.current = new
        return new
