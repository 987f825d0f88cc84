"""What a member whose term/vote state is lost may do, decided from its peers' answers (pure).

A node that cannot read its term/vote file (damaged, or gone with the whole disk) does not know
in which terms it voted. Voting again in such a term could elect two leaders in it. So it asks
the other members for their current term (METADATA) and decides here:

* **Enough answers.** Any term X this node voted in was entered durably by the candidate it
  voted for, and if that candidate won X a majority (this node included) has a term >= X for
  good. A set of `n - majority + 1` OTHER members always contains one of that majority's
  other members, so the highest term F they report is >= X. The node records (F, a vote for
  nobody it could name: `term_vote.LOST_VOTE`) and so votes only in terms after F. (A vote it
  cast for a candidate that did not win is harmless once that candidate's round is over; the
  round lasts `vote_round_timeout_ms`, shorter than any restart.) The answers must be the
  members' durable terms (a handler asked with `want_end_term` reads its `currterm`: its
  elector may not have published it yet), and the node never stands in F (its lost vote may
  have been for itself: `ElectorCore` campaigns in F + 1).
* **A brand-new group.** Every member of a new group starts with no file and no log. A node
  with neither that hears `n - majority + 1` other members, all in term 0 with empty logs, is
  in a new group: they intersect every majority, so no majority ever stored an entry. The
  same holds when they report terms > 0 but still no log: the group's first election is under
  way (a member that decided first already stands); the node then votes only in terms after
  the highest it heard, with nothing to catch up.
* **A new group with members down.** Two of three must be able to elect a leader before the
  third ever starts, so after `NEW_GROUP_PATIENCE_MS` of asking, `majority - 1` such answers
  are enough. Not sooner: an empty member answers at once, but so does a member that never
  received an entry (down or cut off while the group wrote), and a node that lost its disk
  hearing only that one would take a group with history for a new one and could elect,
  with it, a leader without the committed entries (the simulator's `lost-disk` fault found it:
  a lagging member in term 1 with no log answered first). Waiting for the other members'
  answers makes that a second failure: this node's disk together with every member that saw
  the group's history silent for the whole wait.
* **A lost disk.** No file and no log, but an answer shows history (a term > 0 or a log): the
  node lost its disk. Besides the term, it must not vote before it holds what it may have
  stored before: `catch_up` is the highest ledger end the answers report (one of them holds
  every committed entry, by the same intersection). It votes once its committed index, set
  from a leader, reaches it.
* **A vote before it caught up.** Waiting alone can block the group for good: when the
  leader that had the entries dies before pushing them here, the survivors may need this
  node's vote, and it would wait for a leader they cannot elect without it (a member that
  started a moment after the others, as a new group's often does, meets exactly this). So
  until it caught up it still votes for a candidate whose log is at least as up to date as
  the `floor`: the most up to date log among the answers, in Raft's order (last entry's
  term, then index). That is safe: a committed entry e this node stored was stored by a
  majority M with an entry of its commit term T >= e's at an index >= e's; one answerer A is
  in M, and A's log (last term >= T, e held) is at most the floor. A candidate at least as up
  to date as A holds e: with a higher last term, its last entry came from a leader of a term
  > T, which held e (leader completeness); with the same, both logs end in that term's
  leader's entries, the candidate's no shorter. It still does not stand (its own log lacks
  entries) -- until its own log reaches the floor: by the same argument it then holds every
  such entry, and it is caught up even if the group never commits index catch_up (the
  highest end heard may be a tail no majority stored). The floor is a log some answerer
  holds, so that answerer can always win this node's vote. A member of an older version does
  not say its last entry's term (METADATA's `want_end_term`): its current term stands in for
  it, which only raises the floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.core.election_types import is_quorum


@dataclass(frozen=True, slots=True)
class PeerTerm:
    """One member's METADATA answer: its current term, ledger end and committed index, and its
    last entry's term (None: a member that does not say it)."""

    peer: str
    term: int
    ledger_end: int
    committed: int
    ledger_end_term: int | None = None

    def log_bound(self) -> tuple[int, int]:
        """(last term, last index) of its log, or above it in Raft's order: an empty log is
        (-1, -1); an unknown last term is at most its current term."""
        if self.ledger_end < 0:
            return (-1, -1)
        return (self.term if self.ledger_end_term is None else self.ledger_end_term, self.ledger_end)


@dataclass(frozen=True, slots=True)
class LostStateDecision:
    new_group: bool
    term: int = 0  # F: the node votes only in terms after it (unless new_group)
    catch_up: int = -1  # -1, or the index it must hold committed before voting
    # Meanwhile it votes only for a candidate whose (last term, last index) reaches this: the
    # most up to date log the answers report (None when there is nothing to catch up).
    floor: tuple[int, int] | None = None


def vote_floor_met(candidate_end_term: int, candidate_end_index: int,
                   floor: tuple[int, int]) -> bool:
    """Whether a candidate's log is at least as up to date as `floor` (term, index): Raft's
    order, the last entry's term first. The only vote a member catching up after a lost disk
    gives (module docstring)."""
    return (candidate_end_term, candidate_end_index) >= floor


NEW_GROUP_PATIENCE_MS = 5000
"""How long a node with no file and no log asks every member before it takes `majority - 1`
answers without history for a new group (module docstring): a member that is up answers
within one ask interval (300 ms) many times over."""


def majority(n: int) -> int:
    return next(k for k in range(n + 1) if is_quorum(k, n))


def answers_needed(n: int) -> int:
    """Other members whose term must be known to bound every term this node voted in."""
    return n - majority(n) + 1


def decide_lost_state(n_members: int, answers: list[PeerTerm], *, file_absent: bool,
                      local_empty: bool, local_end_term: int,
                      patience_over: bool = False) -> LostStateDecision | None:
    """The decision, or None while more answers are needed (see the module docstring).
    `patience_over`: the node has asked for `NEW_GROUP_PATIENCE_MS` already."""
    fresh = file_absent and local_empty
    history = any(a.term > 0 or a.ledger_end >= 0 for a in answers)
    heard = len(answers) >= answers_needed(n_members)
    enough_for_new = n_members == 1 or heard or (patience_over and len(answers) >= majority(n_members) - 1)
    if fresh and not history and enough_for_new:
        return LostStateDecision(True)
    if fresh and enough_for_new and all(a.ledger_end < 0 for a in answers):
        # A new group whose first election is under way (a member that decided first is a
        # candidate already): no log anywhere, so nothing to catch up; the terms heard are
        # skipped.
        return LostStateDecision(False, max(a.term for a in answers), -1)
    if n_members > 1 and not heard:
        return None
    term = max([local_end_term, 0, *(a.term for a in answers)])
    catch_up = max((a.ledger_end for a in answers), default=-1) if local_empty else -1
    floor = max(a.log_bound() for a in answers) if catch_up >= 0 else None
    return LostStateDecision(False, term, catch_up, floor)
