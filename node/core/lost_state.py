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
  round lasts `vote_round_timeout_ms`, shorter than any restart.)
* **A brand-new group.** Every member of a new group starts with no file and no log, and two
  of three must be able to elect a leader before the third ever starts. A node with neither
  file nor log that hears `majority - 1` other members, all in term 0 with empty logs, is in a
  new group: with itself that is a majority that never started a term, so no term was ever won.
  (Wrong only after two failures at once: this node's disk and every member that saw the
  group's history.) The same holds when those members report terms > 0 but still no log:
  the group's first election is under way (a member that decided first already stands). The
  node then votes only in terms after the highest it heard, with nothing to catch up.
* **A lost disk.** No file and no log, but an answer shows history (a term > 0 or a log): the
  node lost its disk. Besides the term, it must not vote before it holds what it may have
  stored before: `catch_up` is the highest ledger end the answers report (one of them holds
  every committed entry, by the same intersection). It votes once its committed index, set
  from a leader, reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.core.election_types import is_quorum


@dataclass(frozen=True, slots=True)
class PeerTerm:
    """One member's METADATA answer: its current term, ledger end and committed index."""

    peer: str
    term: int
    ledger_end: int
    committed: int


@dataclass(frozen=True, slots=True)
class LostStateDecision:
    new_group: bool
    term: int = 0  # F: the node votes only in terms after it (unless new_group)
    catch_up: int = -1  # -1, or the index it must hold committed before voting


def majority(n: int) -> int:
    return next(k for k in range(n + 1) if is_quorum(k, n))


def answers_needed(n: int) -> int:
    """Other members whose term must be known to bound every term this node voted in."""
    return n - majority(n) + 1


def decide_lost_state(n_members: int, answers: list[PeerTerm], *, file_absent: bool,
                      local_empty: bool, local_end_term: int) -> LostStateDecision | None:
    """The decision, or None while more answers are needed (see the module docstring)."""
    fresh = file_absent and local_empty
    history = any(a.term > 0 or a.ledger_end >= 0 for a in answers)
    enough_for_new = n_members == 1 or len(answers) >= majority(n_members) - 1
    if fresh and not history and enough_for_new:
        return LostStateDecision(True)
    if fresh and enough_for_new and all(a.ledger_end < 0 for a in answers):
        # A new group whose first election is under way (a member that decided first is a
        # candidate already): no log anywhere, so nothing to catch up; the terms heard are
        # skipped. Waiting for `answers_needed` would block a new group with one member down.
        return LostStateDecision(False, max(a.term for a in answers), -1)
    if n_members > 1 and len(answers) < answers_needed(n_members):
        return None
    term = max([local_end_term, 0, *(a.term for a in answers)])
    catch_up = max((a.ledger_end for a in answers), default=-1) if local_empty else -1
    return LostStateDecision(False, term, catch_up)
