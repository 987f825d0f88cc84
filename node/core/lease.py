"""The leader lease: how long after a quorum heartbeat round the other roles may act as leader.

The elector is the only process that talks to the other electors, but the handler (appends,
GET, the NOOP), the dispatchers (pushes) and the ack checker (advancing the commit index) act as
leader on their own. If they trusted the block's role flag alone, a leader whose elector is
paused or cut off would keep serving for as long as nobody rewrites the flag (~10 s of stale
reads until the supervisor's watchdog noticed; docs/contracts.md C3). So leadership is a lease,
counted from the elector's last successful heartbeat round, which every role can check against its
own clock (CLOCK_MONOTONIC is one clock for all processes of a machine).

Why the lease is safe, and why it is ``leak x interval - interval / 2``:

- The elector publishes ``last_quorum_heartbeat_ms`` = the time it *started* sending the last
  heartbeat round that a quorum answered with SUCCESS (or the vote round it won). Start, not
  finish: each follower of that quorum reset its election timer when it *received* the
  round, which is at or after the start.
- A follower becomes candidate only after ``max_heartbeat_leak x heartbeat_interval_ms``
  without a heartbeat (heartbeat.follower_timed_out). So no member of that quorum stands for
  election before ``start + leak x interval``, and without one of them no new leader can be
  elected (quorums intersect).
- The lease ends ``interval / 2`` earlier. The margin covers what happens after a role checked
  the lease and before its action takes effect (building and sending a reply, a scheduler
  delay of a few ms) and clock-rate differences between the two checks; it is half a heartbeat
  so that a healthy leader, which renews the lease every interval, never sees it lapse
  between two rounds even when one round is lost (two lost rounds in a row do let it lapse:
  the roles then refuse leader work until the next quorum round, ~one interval later).

What the lease does not cover: a candidate with a higher term (a node returning from a
partition) can make the followers adopt its term before their timers expire (DLedger has no
"leader stickiness"), so a new leader may exist while the old one's lease still runs. Appends
are safe anyway (the old leader cannot reach a quorum in its term any more); a plain GET may
then be stale by at most the lease. A linearizable GET does not rely on the lease: it waits for
a heartbeat round that started after the read arrived (ElectorCore.request_heartbeat).
"""

from __future__ import annotations

from ipc.codes import Role
from node.core.election_types import ElectionConfig


def lease_ms(cfg: ElectionConfig) -> int:
    """The lease length: election timeout minus half a heartbeat interval (see module doc).

    Always > 0 and < ``cfg.election_timeout_ms`` (config validation guarantees leak >= 2 and
    interval >= 10, so this is at least 1.5 intervals)."""
    return cfg.max_heartbeat_leak * cfg.heartbeat_interval_ms - cfg.heartbeat_interval_ms // 2


def holds_lease(role: Role, last_quorum_heartbeat_ms: int, now_ms: int, lease: int) -> bool:
    """True when a role may act as leader now: the block says LEADER and the last quorum
    heartbeat round started less than `lease` ms ago.

    `now_ms` may be slightly *before* `last_quorum_heartbeat_ms` (the caller read its clock,
    then the block, while the elector wrote in between): that is a fresh lease, not an error.
    No special case for 0 (a block never written): with the real monotonic clock it is far in
    the past, and the simulator's virtual clock legitimately starts at 0."""
    return role == Role.LEADER and now_ms - last_quorum_heartbeat_ms < lease


__all__ = ["holds_lease", "lease_ms"]
