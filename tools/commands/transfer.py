"""Transfer leadership to another node; exit 0 once that node is the leader.

The current leader is found with METADATA and asked to hand over (it stops taking appends,
waits until the target has caught up, then tells it to take leadership). The command then polls
METADATA until --to is the leader, all within --timeout. A refused transfer (e.g. the target is
dead or lagging: TAKE_LEADERSHIP_FAILED) exits 1; an accepted transfer not yet observed when the
timeout ends exits 3 (it may still complete). A refusal says why: the response code, the
leader's reason (the target unreachable, not caught up in time, or another member won the
election it started), and what the group says of the target now (it did not answer: down or
unreachable; or it is behind the leader by N entries).

--json prints {"leader", "term"} once the target leads.

Example:
  dledger transfer --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --to n1
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tools.cli import CliError
from tools.commands.metadata import (
    EXIT_USAGE,
    add_client_arguments,
    add_json_argument,
    cli_error,
    open_client,
)

if TYPE_CHECKING:
    from ipc.client import DLedgerClient, DLedgerError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, timeout=10.0)
    p.add_argument("--to", required=True, metavar="ID",
                   help="the member that should lead (required): one of --peers, or one the group's "
                        "METADATA names (a member added since)")
    add_json_argument(p, 'one {"leader", "term"} object')


def why_refused(c: DLedgerClient, target: str, e: DLedgerError) -> str:
    """What the group says of `target` after a refused transfer, next to the leader's reason
    (a leader of an older version gives none, and "n0 refused the transfer" left the operator
    guessing between a dead target and a lagging one). One METADATA round tells them apart."""
    try:
        m = c.metadata(min(c.timeout, 2.0))
    except Exception:  # noqa: BLE001 - the diagnosis is a courtesy; the refusal stands
        return ""
    t, leader = m.node(target), m.node(m.leader_id) if m.leader_id else None
    if t is None or not t.alive:
        return (f"{target} did not answer: it is down or unreachable (a leader hands over only "
                "to a member it can reach)")
    if leader is not None and leader.ledger_end_index is not None \
            and t.ledger_end_index is not None and t.ledger_end_index < leader.ledger_end_index:
        behind = leader.ledger_end_index - t.ledger_end_index
        return (f"{target} is {behind} entries behind leader {leader.id} and did not catch up "
                "within the leader's transfer-timeout-ms")
    if e.name == "TAKE_LEADERSHIP_FAILED":
        return (f"{target} answers ({t.role or 'no role'}, term {t.term}) and has the leader's "
                "entries now: it was behind or stalled when asked, or lost the election it was "
                "told to start; see the leader's log")
    return ""


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    with open_client(args) as c:
        try:  # --to may be a member added since the --peers string was written: the client asks
            # the group's METADATA before it refuses an id it was not given (UNKNOWN_MEMBER)
            m = c.transfer_leadership(args.to)
        except DLedgerError as e:
            if e.name == "UNKNOWN_MEMBER":  # a usage error, as before membership could change
                raise CliError(f"--to {args.to!r} is not a member: neither in --peers "
                               f"({', '.join(c.peers)}) nor named by the group", EXIT_USAGE) from None
            why = "" if e.indeterminate else why_refused(c, args.to, e)
            raise cli_error(e, suffix=f"; {why}" if why else "") from None
    if args.json:
        print(json.dumps({"leader": args.to, "term": m.term if m is not None else None}))
        return 0
    term = f" (term {m.term})" if m is not None and m.term is not None else ""
    print(f"{args.to} is the leader{term}")
    return 0
