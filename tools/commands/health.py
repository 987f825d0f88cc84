"""Check a group for scripts: exit 0 only when it is healthy, else 1 with one line saying why.

Healthy means: exactly one node claims to lead (in the highest term any node claims), a quorum
(a majority of --peers) answers METADATA, every node that answers lists the same member set
as --peers (ids and addresses: a node started with another peers string never joins), and
every follower that answers is within --max-lag
entries of the leader's end index (as the leader's own watermarks say). Every node is asked at
once with a deadline of --timeout seconds; a node that does not answer in time counts as down.

Prints one line either way: `ok: leader n0 term 3, 3/3 alive, max lag 12` on stdout, or
`dledger health: unhealthy: <why>` on stderr.
--json prints one object instead: {"healthy", "reason", "leader", "term", "alive", "quorum",
"lag": {follower: entries}}.

--wait S asks again (every 0.2 s) until the group is healthy or S seconds have passed, for a
script that just started a group: exit 0 as soon as it is healthy, else 1 with the last
round's reason. Without --wait, one round.

Exit codes: 0 healthy, 1 unhealthy, 2 bad arguments.

Example:
  dledger health --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --max-lag 1000
  dledger health --peers "$PEERS" --wait 30
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tools.cli import add_group_arguments, key_file_of, nonneg_float, nonneg_int, positive_float
from tools.commands.group_status import GroupProbe, GroupView, member_set_problem, read_group

DEFAULT_MAX_LAG = 10_000
WAIT_INTERVAL = 0.2  # seconds between two rounds under --wait


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_group_arguments(p)
    p.add_argument("--max-lag", type=nonneg_int, default=DEFAULT_MAX_LAG, metavar="N",
                   help="largest follower lag accepted, in entries (default: %(default)s)")
    p.add_argument("--timeout", type=positive_float, default=2.0, metavar="S",
                   help="how long to wait for the nodes' answers, in seconds (default: %(default)s)")
    p.add_argument("--wait", type=nonneg_float, default=0.0, metavar="S",
                   help="ask again until healthy or S seconds have passed (default: %(default)s, "
                        "one round)")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: one line)")


def verdict(view: GroupView, n_peers: int, max_lag: int) -> tuple[bool, str]:
    """(healthy, the one line saying why) for a round of answers."""
    alive = [a for a in view.answers if a.alive]
    quorum = n_peers // 2 + 1
    down = [a.id for a in view.answers if not a.alive]
    if len(alive) < quorum:
        return False, (f"no quorum: {len(alive)}/{n_peers} nodes answered, {quorum} needed "
                       f"(down: {', '.join(down)})")
    members = member_set_problem(view.answers)
    if members is not None:
        return False, members
    if not view.leaders:
        return False, f"no leader: {len(alive)}/{n_peers} nodes answered, none leads"
    if len(view.leaders) > 1:
        return False, (f"{len(view.leaders)} nodes claim to lead term {view.leaders[0].meta.term}: "
                       f"{', '.join(a.id for a in view.leaders)}")
    leader = view.leader
    alive_ids = {a.id for a in alive}
    lagging = {f: n for f, n in view.lag.items() if f in alive_ids and n > max_lag}
    if lagging:
        worst = max(lagging, key=lagging.get)
        return False, (f"follower {worst} lags {lagging[worst]} entries behind leader {leader.id} "
                       f"(max {max_lag})" + (f"; also {', '.join(sorted(set(lagging) - {worst}))}"
                                             if len(lagging) > 1 else ""))
    max_seen = max((n for f, n in view.lag.items() if f in alive_ids), default=0)
    note = f", down: {', '.join(down)}" if down else ""
    return True, (f"leader {leader.id} term {leader.meta.term}, {len(alive)}/{n_peers} alive, "
                  f"max lag {max_seen}{note}")


def run(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.wait
    with GroupProbe(args.peers, args.group, timeout=args.timeout,
                    key_file=key_file_of(args)) as probe:
        while True:
            view = read_group(probe.round())
            n = len(view.answers)
            ok, why = verdict(view, n, args.max_lag)
            left = deadline - time.monotonic()
            if ok or left <= 0:
                break
            time.sleep(min(WAIT_INTERVAL, left))
    if args.json:
        print(json.dumps({"healthy": ok, "reason": why,
                          "leader": view.leader.id if view.leader else None, "term": view.term,
                          "alive": sum(a.alive for a in view.answers), "quorum": n // 2 + 1,
                          "lag": view.lag}))
    elif ok:
        print(f"ok: {why}")
    else:
        print(f"dledger health: unhealthy: {why}", file=sys.stderr)
    return 0 if ok else 1
