"""Transfer leadership to another node; exit 0 once that node is the leader.

The current leader is found with METADATA and asked to hand over (it stops taking appends,
waits until the target has caught up, then tells it to take leadership). The command then polls
METADATA until --to is the leader, all within --timeout. A refused transfer (e.g. the target is
dead or lagging: TAKE_LEADERSHIP_FAILED) exits 1; an accepted transfer not yet observed when the
timeout ends exits 3 (it may still complete).

Example:
  dledger transfer --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --to n1
"""

from __future__ import annotations

import argparse

from tools.cli import CliError
from tools.cmd_metadata import EXIT_USAGE, add_client_arguments, cli_error, open_client


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, timeout=10.0)
    p.add_argument("--to", required=True, metavar="ID", help="the node that should lead (required)")


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    with open_client(args) as c:
        if args.to not in c.peers:
            raise CliError(f"--to {args.to!r} is not in --peers ({', '.join(c.peers)})", EXIT_USAGE)
        try:
            m = c.transfer_leadership(args.to)
        except DLedgerError as e:
            raise cli_error(e) from None
    term = f" (term {m.term})" if m is not None and m.term is not None else ""
    print(f"{args.to} is the leader{term}")
    return 0
