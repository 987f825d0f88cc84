"""Heartbeat decisions, pure: handleHeartBeat, the leader's tally/parse, the follower timeout.

Sources: docs/election.md "Decision tables"; DLedger's DLedgerLeaderElector (handleHeartBeat,
sendHeartbeats in its newer order: the max-term check comes first), DLedger issue #325 (a leader
must step down on any higher term it sees, even when a quorum still answers SUCCESS).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ipc.codes import ResponseCode
from ipc.protocol import HeartbeatRequest
from node.core.election_types import ElectionConfig, ElectorView, is_quorum


class HeartbeatAction(Enum):
    """What the follower side must do besides replying."""

    NONE = "none"
    REFRESH = "refresh"  # lastLeaderHeartBeatTime = now
    BECOME_FOLLOWER = "become_follower"  # changeRoleToFollower(term, leader)
    BECOME_CANDIDATE = "become_candidate"  # changeRoleToCandidate(term) + needIncreaseTerm...


@dataclass(frozen=True, slots=True)
class HeartbeatDecision:
    code: ResponseCode
    reply_term: int
    action: HeartbeatAction = HeartbeatAction.NONE
    term: int | None = None  # the term for BECOME_FOLLOWER / BECOME_CANDIDATE
    leader_id: str | None = None  # the leader for BECOME_FOLLOWER
    heartbeat_ms: int | None = None  # new lastLeaderHeartBeatTime (REFRESH / BECOME_FOLLOWER)


def decide_heartbeat(view: ElectorView, req: HeartbeatRequest, now_ms: int) -> HeartbeatDecision:
    """handleHeartBeat in DLedger's order (docs/election.md "handleHeartBeat")."""
    sender = req.leader_id
    # Envelope (DLedgerServer PreConditions): wrong group / not addressed to me.
    if req.group != view.group:
        return HeartbeatDecision(ResponseCode.UNKNOWN_GROUP, view.term)
    if req.remote_id != view.self_id:
        return HeartbeatDecision(ResponseCode.UNKNOWN_MEMBER, view.term)
    # DLedger refuses a sender that is not a member ("[BUG] remoteId is an unknown member").
    # With membership changes that refusal can strand a member: one whose log lacks the entry
    # that added the leader (it was down or cut off then) could never receive it from that
    # leader. Raft's followers accept the leader of any term at least their own: one leader per
    # term is the elections' guarantee, not the follower's; a sender outside every
    # configuration this node knows is followed the same way (a node's elector gives it a slot
    # of its own: node/roles/elector.py `_guest_slot`).
    if sender == view.self_id:
        return HeartbeatDecision(ResponseCode.UNEXPECTED_MEMBER, view.term)
    # A deposed leader still beating: tell it my (larger) term so it steps down.
    if req.term < view.term:
        return HeartbeatDecision(ResponseCode.EXPIRED_TERM, view.term)
    if req.term == view.term:
        if view.leader_id is None:
            # First heartbeat of the new leader in my term (I was candidate): follow it.
            return HeartbeatDecision(ResponseCode.SUCCESS, view.term,
                                     HeartbeatAction.BECOME_FOLLOWER, req.term, sender, now_ms)
        if sender == view.leader_id:
            # The normal case: refresh the follower timer.
            return HeartbeatDecision(ResponseCode.SUCCESS, view.term, HeartbeatAction.REFRESH,
                                     heartbeat_ms=now_ms)
        # Two leaders in one term "should not happen"; make the sender re-elect.
        return HeartbeatDecision(ResponseCode.INCONSISTENT_LEADER, view.term)
    # Larger term: "to make it simple, do not change to follower immediately": become
    # candidate in that term (votedFor cleared) and answer TERM_NOT_READY; the leader then
    # sends the next heartbeat at once and that one makes me its follower.
    return HeartbeatDecision(ResponseCode.TERM_NOT_READY, req.term,
                             HeartbeatAction.BECOME_CANDIDATE, req.term)


# ---------------------------------------------------------------------------------------------
# Leader side: tally one heartbeat round (sendHeartbeats' whenComplete callbacks) and parse it.
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class HeartbeatTally:
    """Counters of one heartbeat round; the leader counts itself (allNum = succNum = 1)."""

    term: int
    all_num: int = 1
    succ_num: int = 1
    not_ready_num: int = 0
    max_term: int = -1
    inconsistent_leader: bool = False

    def add(self, code: int | None, resp_term: int = -1) -> None:
        """Count one answer; `None` = no answer (the peer is marked not alive by the caller)."""
        self.all_num += 1
        if code is None:
            return
        if code == ResponseCode.SUCCESS:
            self.succ_num += 1
        elif code == ResponseCode.EXPIRED_TERM:
            # DLedger does maxTerm.set(x.getTerm()); keeping the max is the obvious intent.
            if resp_term > self.max_term:
                self.max_term = resp_term
        elif code == ResponseCode.INCONSISTENT_LEADER:
            self.inconsistent_leader = True
        elif code == ResponseCode.TERM_NOT_READY:
            self.not_ready_num += 1

    def done(self, member_count: int) -> bool:
        """beatLatch.countDown conditions."""
        return (is_quorum(self.succ_num, member_count)
                or is_quorum(self.succ_num + self.not_ready_num, member_count)
                or self.all_num >= member_count)


class HeartbeatOutcome(Enum):
    STEP_DOWN_HIGHER_TERM = "step_down_higher_term"  # changeRoleToCandidate(maxTerm)
    QUORUM = "quorum"  # lastSuccHeartBeatTime = now
    RESEND_NOW = "resend_now"  # lastSendHeartBeatTime = -1
    STEP_DOWN_INCONSISTENT_LEADER = "step_down_inconsistent_leader"  # candidate(term)
    STEP_DOWN_LEASE_EXPIRED = "step_down_lease_expired"  # candidate(term)
    NO_QUORUM_YET = "no_quorum_yet"  # keep leading, the lease is not over


@dataclass(frozen=True, slots=True)
class HeartbeatParse:
    outcome: HeartbeatOutcome
    term: int | None = None  # the candidate term for the STEP_DOWN_* outcomes


def parse_heartbeats(tally: HeartbeatTally, member_count: int, now_ms: int,
                     last_succ_heartbeat_ms: int, cfg: ElectionConfig) -> HeartbeatParse:
    """The parse at the end of sendHeartbeats (DLedger's newer order; DLedger #325 makes 1
    unconditional)."""
    # 1. Any follower in a later term: step down now, even if a quorum said SUCCESS (#325:
    #    otherwise a node that rejoins with a higher term rejects us forever).
    if tally.max_term > tally.term:
        return HeartbeatParse(HeartbeatOutcome.STEP_DOWN_HIGHER_TERM, tally.max_term)
    # 2. A quorum (self included) accepted us: the lease is renewed.
    if is_quorum(tally.succ_num, member_count):
        return HeartbeatParse(HeartbeatOutcome.QUORUM)
    # 3. Some followers are just entering my term: beat again immediately, the next one will
    #    make them followers.
    if is_quorum(tally.succ_num + tally.not_ready_num, member_count):
        return HeartbeatParse(HeartbeatOutcome.RESEND_NOW)
    # 4. A follower follows another leader in my term: re-elect.
    if tally.inconsistent_leader:
        return HeartbeatParse(HeartbeatOutcome.STEP_DOWN_INCONSISTENT_LEADER, tally.term)
    # 5. No quorum for maxHeartBeatLeak periods: a leader cut off from the majority stops
    #    acting as leader (bounds stale reads and pending appends).
    if now_ms - last_succ_heartbeat_ms > cfg.election_timeout_ms:
        return HeartbeatParse(HeartbeatOutcome.STEP_DOWN_LEASE_EXPIRED, tally.term)
    return HeartbeatParse(HeartbeatOutcome.NO_QUORUM_YET)


def follower_timed_out(now_ms: int, last_leader_heartbeat_ms: int, cfg: ElectionConfig) -> bool:
    """maintainAsFollower: no heartbeat for more than maxHeartBeatLeak x interval."""
    return now_ms - last_leader_heartbeat_ms > cfg.election_timeout_ms


def follower_deadline(last_leader_heartbeat_ms: int, cfg: ElectionConfig) -> int:
    """First ms at which follower_timed_out becomes true (the process loop's poll deadline)."""
    return last_leader_heartbeat_ms + cfg.election_timeout_ms + 1
