"""Plain data shared by the election decision functions and the ElectorCore.

Kept separate so `vote.py`, `heartbeat.py` and `election.py` can import it without cycles.
Nothing here does I/O; times are integer milliseconds passed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """Election timings (DLedgerConfig names in parentheses). Defaults: docs/election.md.

    DLedger's defaults (2000 ms heartbeat, leak 3, votes every 300-1000 ms) fail over in ~6 s;
    We want sub-second detection (docs/election.md "Failover timing") that still never flaps on a
    loaded 2-core box.
    """

    heartbeat_interval_ms: int = 100
    """(heartBeatTimeIntervalMs) leader -> follower heartbeat period."""
    max_heartbeat_leak: int = 4
    """(maxHeartBeatLeak) missed periods before a follower / an unconfirmed leader gives up."""
    min_vote_interval_ms: int = 50
    """(minVoteIntervalMs) lower bound of the randomized candidate vote timer."""
    max_vote_interval_ms: int = 450
    """(maxVoteIntervalMs) upper bound (exclusive) of the randomized vote timer."""
    vote_round_timeout_ms: int = 300
    """How long a vote round waits for answers (DLedger: 2000 + rand(maxVoteIntervalMs))."""
    min_take_leadership_vote_interval_ms: int = 30
    """(minTakeLeadershipVoteIntervalMs) vote timer while taking leadership (transfer)."""
    max_take_leadership_vote_interval_ms: int = 100
    """(maxTakeLeadershipVoteIntervalMs)."""

    @property
    def election_timeout_ms(self) -> int:
        """maxHeartBeatLeak x heartBeatTimeIntervalMs: how long a follower waits without a
        heartbeat before it stands, and how long a leader keeps leading without a quorum.
        The lease the other roles act on is shorter: node/core/lease.py."""
        return self.max_heartbeat_leak * self.heartbeat_interval_ms

    @property
    def leader_lease_ms(self) -> int:
        """Old name of `election_timeout_ms` (it is *not* the lease of node/core/lease.py)."""
        return self.election_timeout_ms

    def problems(self) -> list[str]:
        """One message per bad field (empty list = valid). Config is checked before start."""
        out = []
        if self.heartbeat_interval_ms < 10:
            out.append(f"heartbeat_interval_ms={self.heartbeat_interval_ms}: must be >= 10")
        if self.max_heartbeat_leak < 2:
            out.append(f"max_heartbeat_leak={self.max_heartbeat_leak}: must be >= 2 "
                       "(one lost heartbeat must not depose a leader)")
        if self.min_vote_interval_ms < 0:
            out.append(f"min_vote_interval_ms={self.min_vote_interval_ms}: must be >= 0")
        if self.max_vote_interval_ms <= self.min_vote_interval_ms:
            out.append(f"max_vote_interval_ms={self.max_vote_interval_ms}: must be > "
                       f"min_vote_interval_ms={self.min_vote_interval_ms} (randomization "
                       "is what breaks split votes)")
        if self.vote_round_timeout_ms < 1:
            out.append(f"vote_round_timeout_ms={self.vote_round_timeout_ms}: must be >= 1")
        if self.min_take_leadership_vote_interval_ms < 0:
            out.append("min_take_leadership_vote_interval_ms: must be >= 0")
        if self.max_take_leadership_vote_interval_ms <= self.min_take_leadership_vote_interval_ms:
            out.append("max_take_leadership_vote_interval_ms: must be > "
                       "min_take_leadership_vote_interval_ms")
        return out

    def validate(self) -> ElectionConfig:
        """Return self, or raise ValueError listing every problem."""
        p = self.problems()
        if p:
            raise ValueError("invalid election config: " + "; ".join(p))
        return self


class LedgerEnd(NamedTuple):
    """(ledgerEndIndex, ledgerEndTerm) of the local store; (-1, -1) when empty.

    Owned by the handler process; the elector reads it from the shared block under the
    member lock and passes it into every call that needs it.

    `writable` is False while the handler cannot write its store (a leader-side write failed
    with DISK_FULL / DISK_ERROR and none succeeded since: the block's `store_unwritable_ms`).
    A leader that cannot write must not stay leader (the group would have a leader that
    answers but never commits), and a node that cannot write must not stand for election.
    """

    index: int = -1
    term: int = -1
    writable: bool = True
    voting: bool = True
    """False while this node must not take part in elections: its store is repairing a
    damaged committed range, or it lost its term/vote state and has not yet learned a term past
    any it may have voted in (docs/election.md "Non-voting members"). It then grants no vote
    (answers UNKNOWN: no valid answer, so no candidate moves to a new term because of it),
    does not stand, refuses TAKE_LEADERSHIP, and a LEADER steps down. It still follows a
    leader and stores what it pushes: that is how it repairs."""
    committed: int = -1
    """The committed index (the ledger group's): a leader that removed itself steps down once
    its newest configuration is committed (`leader_steps_down`). -1: unknown, never."""
    vote_floor: tuple[int, int] | None = None
    """While not `voting` only because it lost its disk and has not caught up: (term, index)
    a candidate's log must reach, in Raft's order, for this node's vote (and only then does it
    vote; node/core/lost_state.py says why that is safe). None: no vote at all."""


EMPTY_LEDGER = LedgerEnd()
"""An empty log, (-1, -1): the default ledger end for calls that do not need one."""


@dataclass(frozen=True, slots=True)
class ElectorView:
    """What handleVote / handleHeartBeat read under ``synchronized(memberState)``.

    A snapshot: the decision functions are pure over it, the caller applies the decision.
    """

    self_id: str
    group: str
    peers: frozenset[str]  # every member id, self included (DLedger's peerMap keys)
    term: int  # currTerm
    voted_for: str | None  # currVoteFor
    leader_id: str | None  # leaderId (None while candidate)
    ledger_end_index: int = -1
    ledger_end_term: int = -1
    taking_leadership: bool = False  # termToTakeLeadership == currTerm


def is_quorum(num: int, member_count: int) -> bool:
    """MemberState.isQuorum: num >= peerSize / 2 + 1 (peerSize counts self)."""
    return num >= member_count // 2 + 1
