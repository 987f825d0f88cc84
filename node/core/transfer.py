"""Leadership transfer and preferred leaders, pure: input + view + now -> effects.

DLedger's handleLeadershipTransfer / checkPreferredLeader, with the fixes of DLedger #39, #85 and
#247 (a transfer to a dead or stalled member fails fast instead of stalling the group). The
elector role feeds it and executes the effects; nothing here does I/O or reads a clock.

The protocol, seen from the leader:

1. A request (``dledger transfer``, via the handler's control channel) or the preferred-leader
   check names a target. Refused at once: not leader, wrong term, unknown member, already
   transferring, target not reachable; the target being this node is an immediate SUCCESS.
2. Otherwise the transfer starts: ``SetTransferee(target)`` (the handler stops taking appends,
   so the target can catch up) and a deadline of ``timeout_ms``.
3. Each check: once the target's replicated end (its dispatcher's match index in this term)
   reaches the ledger end, ``SendTakeLeadership`` (the target then campaigns in term + 1).
4. It ends with SUCCESS when this node follows the target, or TAKE_LEADERSHIP_FAILED at the
   deadline, when the target stops answering, when it refuses TAKE_LEADERSHIP, or when this
   node lost leadership to somebody else. Ending always clears the transferee
   (``SetTransferee(None)``) before answering (``Answer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ipc.codes import ResponseCode, Role

PREFERRED_CHECK_MS = 1000
TRANSFER_CHECK_MS = 50  # how often a transfer in progress is driven
RECENT_ACK_MS = 2500  # an idle follower still answers a COMMIT push every second
LEADER_GRACE_MS = 1500  # a new leader's dispatchers need a moment before a follower can look dead
TAKE_RID_BASE = 1 << 40  # TAKE_LEADERSHIP request ids, apart from the election core's


@dataclass(frozen=True, slots=True)
class PeerView:
    """What the leader's dispatcher for one peer published in the block."""

    alive: bool  # its socket is connected
    last_ack_ms: int  # when it last answered a push (0 = never in this incarnation)
    match_term: int
    match_index: int


@dataclass(frozen=True, slots=True)
class TransferView:
    """One snapshot of what the decisions read: the elector core's role/term/leader, the
    ledger end and the peers' replication progress."""

    role: Role
    term: int
    leader_id: str | None
    ledger_end_index: int
    leader_since_ms: int  # when this node last became leader
    peers: Mapping[str, PeerView]


@dataclass(frozen=True, slots=True)
class TransferConfig:
    self_id: str
    members: tuple[str, ...]
    timeout_ms: int = 5_000
    heartbeat_interval_ms: int = 200
    max_heartbeat_leak: int = 3
    preferred: tuple[str, ...] = ()


@dataclass(slots=True)
class Transfer:
    """A transfer in progress."""

    target: str
    term: int
    deadline_ms: int
    ident: bytes | None  # the handler's routing id; None for a preferred-leader transfer
    request_id: int
    take_rid: int = 0  # request id of the TAKE_LEADERSHIP sent, 0 = not sent yet


# ---- effects ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetTransferee:
    """Write the block's transferee slot (None = no transfer): the handler refuses appends while
    one is set. Executed before the Answer that ends a transfer."""

    target: str | None


@dataclass(frozen=True, slots=True)
class SendTakeLeadership:
    """Send TAKE_LEADERSHIP(term) to `target`'s elector. If it cannot be sent, call
    `TransferCore.on_send_failed`."""

    target: str
    term: int
    request_id: int


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the transfer request (`ident` None: a preferred-leader transfer, log only).
    `why`: for a refusal, what the operator needs to act on it (logged, and told the client)."""

    target: str
    code: ResponseCode
    ident: bytes | None
    request_id: int
    why: str = field(default="", compare=False)


TransferEffect = SetTransferee | SendTakeLeadership | Answer


# ---- pure decisions --------------------------------------------------------------------------


def reachable(cfg: TransferConfig, view: TransferView, target: str, now_ms: int) -> bool:
    """Not known dead: its dispatcher's socket is connected and its last answer, if any, is
    recent. Right after this node became leader everyone gets the benefit of the doubt (its
    dispatchers may not have reached anybody yet); the transfer timeout bounds that."""
    if now_ms - view.leader_since_ms < LEADER_GRACE_MS:
        return True
    p = view.peers.get(target)
    if p is None:
        return False
    window = max(RECENT_ACK_MS, 2 * cfg.heartbeat_interval_ms * cfg.max_heartbeat_leak)
    return p.alive and not (p.last_ack_ms > 0 and now_ms - p.last_ack_ms > window)


def caught_up(view: TransferView, target: str) -> bool:
    """The target holds every entry of this leader's log, replicated in this term."""
    p = view.peers.get(target)
    return p is not None and p.match_term == view.term and p.match_index >= view.ledger_end_index


def refuse(cfg: TransferConfig, view: TransferView, transferring: bool, target: str, term: int,
           now_ms: int) -> ResponseCode | None:
    """The immediate answer to a transfer request, or None when the transfer may start.
    `term` -1 = "whatever the current term is"."""
    if view.role != Role.LEADER:
        return ResponseCode.NOT_LEADER
    if term not in (-1, view.term):
        return ResponseCode.EXPIRED_TERM
    if target not in cfg.members:
        return ResponseCode.UNKNOWN_MEMBER
    if target == cfg.self_id:
        return ResponseCode.SUCCESS  # already there
    if transferring:
        return ResponseCode.LEADER_TRANSFERRING
    if not reachable(cfg, view, target, now_ms):
        return ResponseCode.TAKE_LEADERSHIP_FAILED  # dead or stalled: fail fast (#39, #85, #247)
    return None


# ---- the state holder ------------------------------------------------------------------------


@dataclass(slots=True)
class TransferCore:
    """The transfer in progress (at most one) and the preferred-leader timer."""

    cfg: TransferConfig
    transfer: Transfer | None = None
    next_preferred_check_ms: int = 0
    next_drive_ms: int = 0  # while a transfer is in progress: when to drive it next
    _next_rid: int = field(default=TAKE_RID_BASE)

    def request(self, target: str, ident: bytes | None, request_id: int, term: int,
                view: TransferView, now_ms: int) -> list[TransferEffect]:
        """A LEADERSHIP_TRANSFER request (or the preferred-leader check's own)."""
        code = refuse(self.cfg, view, self.transfer is not None, target, term, now_ms)
        if code is not None:
            why = (f"{target} is not reachable (no answer to this leader's pushes lately)"
                   if code == ResponseCode.TAKE_LEADERSHIP_FAILED else "")
            return [Answer(target, code, ident, request_id, why)]
        self.transfer = Transfer(target, view.term, now_ms + self.cfg.timeout_ms, ident,
                                 request_id)
        self.next_drive_ms = now_ms  # the target may be caught up already
        return [SetTransferee(target)]

    def tick(self, view: TransferView, now_ms: int) -> list[TransferEffect]:
        """Drive the transfer in progress, or run the preferred-leader check."""
        t = self.transfer
        if t is None:
            return self._check_preferred(view, now_ms)
        self.next_drive_ms = now_ms + TRANSFER_CHECK_MS
        if view.role != Role.LEADER or view.term != t.term:
            if view.leader_id == t.target:
                return self._end(ResponseCode.SUCCESS)
            if t.take_rid and view.leader_id is None and now_ms < t.deadline_ms:
                return []  # deposed by the target's election: wait for its outcome
            return self._end(ResponseCode.TAKE_LEADERSHIP_FAILED,
                             f"{view.leader_id} leads term {view.term}, not {t.target}"
                             if view.leader_id else
                             f"this node lost leadership (term {view.term}, no leader yet) "
                             f"before {t.target} took it")
        if now_ms >= t.deadline_ms:
            p = view.peers.get(t.target)
            return self._end(ResponseCode.TAKE_LEADERSHIP_FAILED, (
                f"{t.target} did not win its election within {self.cfg.timeout_ms} ms" if t.take_rid
                else f"{t.target} did not catch up within {self.cfg.timeout_ms} ms (it holds up to "
                     f"entry {p.match_index if p else -1}, this leader's log ends at "
                     f"{view.ledger_end_index})"))
        if t.take_rid:
            return []  # sent: the target's election decides
        if not reachable(self.cfg, view, t.target, now_ms):  # died or stalled meanwhile
            return self._end(ResponseCode.TAKE_LEADERSHIP_FAILED, f"{t.target} stopped answering")
        if caught_up(view, t.target):
            self._next_rid += 1
            t.take_rid = self._next_rid
            return [SendTakeLeadership(t.target, t.term, t.take_rid)]
        return []

    def next_check_ms(self, now_ms: int) -> int | None:
        """When `tick` has something to do next (None: only on the next input)."""
        if self.transfer is not None:
            return max(now_ms, self.next_drive_ms)
        if self.cfg.preferred and self.cfg.self_id not in self.cfg.preferred:
            return max(now_ms, self.next_preferred_check_ms)
        return None

    def on_take_response(self, request_id: int, code: int) -> list[TransferEffect]:
        """The target answered TAKE_LEADERSHIP. SUCCESS needs nothing: the target's higher term
        deposes this node and `tick` sees it follow the target."""
        t = self.transfer
        if t is not None and request_id == t.take_rid and code != ResponseCode.SUCCESS:
            name = ResponseCode.name_of(code)
            return self._end(ResponseCode.TAKE_LEADERSHIP_FAILED,
                             f"{t.target} could not take leadership ({name}: its store is not "
                             f"writable, it does not vote while it repairs or catches up, it is "
                             f"not a voter, or it ended up following another member)"
                             if code == ResponseCode.TAKE_LEADERSHIP_FAILED else
                             f"{t.target} could not take leadership ({name})")
        return []

    def on_send_failed(self) -> list[TransferEffect]:
        """TAKE_LEADERSHIP could not be sent (the target's connection is gone)."""
        if self.transfer is None:
            return []
        return self._end(ResponseCode.TAKE_LEADERSHIP_FAILED,
                         f"TAKE_LEADERSHIP could not be sent to {self.transfer.target}")

    def _end(self, code: ResponseCode, why: str = "") -> list[TransferEffect]:
        t, self.transfer = self.transfer, None
        if t is None:
            return []
        return [SetTransferee(None), Answer(t.target, code, t.ident, t.request_id, why)]

    def _check_preferred(self, view: TransferView, now_ms: int) -> list[TransferEffect]:
        """A leader that is not a preferred leader hands over to a preferred member that is
        reachable and caught up (DLedger's preferredLeaderIds), checked once a second."""
        pref = self.cfg.preferred
        if (not pref or self.cfg.self_id in pref or view.role != Role.LEADER
                or now_ms < self.next_preferred_check_ms):
            return []
        self.next_preferred_check_ms = now_ms + PREFERRED_CHECK_MS
        for target in pref:
            if target in self.cfg.members and reachable(self.cfg, view, target, now_ms) \
                    and caught_up(view, target):
                return self.request(target, None, 0, view.term, view, now_ms)
        return []


__all__ = [
    "LEADER_GRACE_MS",
    "PREFERRED_CHECK_MS",
    "RECENT_ACK_MS",
    "TRANSFER_CHECK_MS",
    "Answer",
    "PeerView",
    "SendTakeLeadership",
    "SetTransferee",
    "Transfer",
    "TransferConfig",
    "TransferCore",
    "TransferEffect",
    "TransferView",
    "caught_up",
    "reachable",
    "refuse",
]
