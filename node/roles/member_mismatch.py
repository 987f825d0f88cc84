"""Say so when members disagree on who the members are (docs/operations.md "Trust and
membership"): a node started with another `--peers` string (a member the others do not have,
another address) can never be elected, and only the logs and `dledger health` can tell the
operator why. The elector reports, at most once a minute per peer:

* a VOTE or HEARTBEAT from a sender that is not a member here;
* an answer UNKNOWN_MEMBER to one of its own requests: that peer does not count this node;
* (`member_set_difference`) a peer's METADATA, which lists its member set, naming one of our
  members at another address, or not naming this node: what a misconfigured member, or one
  removed while it was down, sees while it asks the group's term, before it ever votes.
"""

from __future__ import annotations

import logging

from ipc import protocol as P
from ipc.codes import ResponseCode

REPORT_EVERY_MS = 60_000


class MemberMismatch:
    def __init__(self, log: logging.Logger, self_id: str, members: list[str]) -> None:
        self.log = log
        self.self_id = self_id
        self.members = frozenset(members)
        self._said: dict[tuple[str, str], int] = {}

    def _due(self, key: tuple[str, str], now_ms: int) -> bool:
        last = self._said.get(key)
        if last is not None and now_ms - last < REPORT_EVERY_MS:
            return False
        self._said[key] = now_ms
        return True

    def on_request(self, msg: P.Message, now_ms: int) -> None:
        sender = getattr(msg, "leader_id", None)
        if isinstance(msg, P.VoteRequest | P.HeartbeatRequest) and sender and sender not in self.members \
                and self._due(("from", sender), now_ms):
            self.log.warning("%s: a %s from %r, which is not a member here (members: %s): its --peers "
                             "differs from this node's", self.self_id, type(msg).__name__.removesuffix("Request").upper(),
                             sender, ", ".join(sorted(self.members)))

    def on_response(self, msg: P.Message, now_ms: int) -> None:
        if getattr(msg, "code", None) == ResponseCode.UNKNOWN_MEMBER:
            peer = getattr(msg, "leader_id", "") or "a peer"
            if self._due(("by", peer), now_ms):
                self.log.warning("%s: %s does not count %s as a member (UNKNOWN_MEMBER): the members' "
                                 "--peers strings differ; this node cannot be elected until they agree",
                                 self.self_id, peer, self.self_id)


def member_set_difference(self_id: str, ours: dict[str, tuple[str, int]], peer: str,
                          theirs: list[P.PeerInfo]) -> str | None:
    """A warning line when `peer`'s member set (from its METADATA: its newest configuration)
    disagrees with our `--peers` in a way that is a mistake, else None. Members added or removed
    online are no mistake (a node's `--peers` is only its start, docs/membership.md); the same
    id at another address is (two machines claim one member, or a typo), and so is a set that
    does not hold this node at its address (it was removed, or it was never added: it cannot be
    elected)."""
    other = {x.id: x.address for x in theirs}
    moved = sorted(f"{i} at {a} (--peers here: {ours[i][0]}:{ours[i][1]})" for i, a in other.items()
                   if i in ours and a != f"{ours[i][0]}:{ours[i][1]}")
    if moved:
        return (f"{self_id}: {peer}'s members name {', '.join(moved)}: the members' --peers strings "
                "differ; this node cannot be elected until they agree")
    if self_id in ours and self_id not in other:
        return (f"{self_id}: {peer}'s configuration does not hold this node (its members: "
                f"{', '.join(sorted(other))}): it was removed, or never added; it follows the "
                "group but cannot be elected")
    return None
