"""Take a snapshot of the state machine now, on every node of the group or on one (--node).

Each node (whatever its role) first applies everything committed, then writes its snapshot
(docs/statemachine.md, docs/snapshots.md) and answers with the index and term it covers. One
line per node: "n0 snapshot at index 1234 term 3", or the error. Exit 0 only if every asked
node took one; a node that is down is an error. A group without a state machine answers
UNSUPPORTED.

Example:
  dledger snapshot --peers "$PEERS"
  dledger snapshot --peers "$PEERS" --node n1 --timeout 300
"""

from __future__ import annotations

import argparse

from tools.cli import CliError
from tools.cmd_metadata import EXIT_DEFINITE, EXIT_USAGE, add_client_arguments, open_client


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, timeout=60.0)
    p.add_argument("--node", metavar="ID", help="only this node (default: every node in --peers)")


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    failed = 0
    with open_client(args) as c:
        nodes = [args.node] if args.node else list(c.peers)
        if args.node and args.node not in c.peers:
            raise CliError(f"--node {args.node!r} is not in --peers ({', '.join(c.peers)})", EXIT_USAGE)
        for nid in nodes:
            try:
                index, term = c.take_snapshot(nid)
            except DLedgerError as e:
                failed += 1
                print(f"{nid} failed: {e}", flush=True)
                continue
            print(f"{nid} snapshot at index {index} term {term}", flush=True)
    if failed:
        raise CliError(f"{failed} of {len(nodes)} node(s) took no snapshot", EXIT_DEFINITE)
    return 0
