"""Take a snapshot of the state machine now, on every node of the group or on one (--node).

Each node (whatever its role) first applies everything committed, then writes its snapshot
(docs/statemachine.md, docs/snapshots.md) and answers with the index and term it covers. One
line per node: "n0 snapshot at index 1234 term 3", or the error. Exit 0 only if every asked
node took one; a node that is down is an error. A group without a state machine answers
UNSUPPORTED.

--json prints one object instead: {"nodes": [{"id", "index", "term"} or {"id", "error",
"code"}]}, with the same exit code.

Example:
  dledger snapshot --peers "$PEERS"
  dledger snapshot --peers "$PEERS" --node n1 --timeout 300
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.cli import CliError
from tools.commands.metadata import (
    EXIT_DEFINITE,
    EXIT_USAGE,
    add_client_arguments,
    add_json_argument,
    open_client,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, timeout=60.0)
    p.add_argument("--node", metavar="ID", help="only this node (default: every node in --peers)")
    add_json_argument(p, 'one {"nodes": [...]} object')


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    failed = 0
    rows: list[dict] = []
    with open_client(args) as c:
        nodes = [args.node] if args.node else list(c.peers)
        if args.node and args.node not in c.peers:
            raise CliError(f"--node {args.node!r} is not in --peers ({', '.join(c.peers)})", EXIT_USAGE)
        for nid in nodes:
            try:
                index, term = c.take_snapshot(nid)
            except DLedgerError as e:
                failed += 1
                rows.append({"id": nid, "error": str(e), "code": e.name})
                if not args.json:
                    print(f"{nid} failed: {e}", flush=True)
                continue
            rows.append({"id": nid, "index": index, "term": term})
            if not args.json:
                print(f"{nid} snapshot at index {index} term {term}", flush=True)
    summary = f"{failed} of {len(nodes)} node(s) took no snapshot"
    if args.json:  # one object, the failures inside it (not a second, error object)
        print(json.dumps({"nodes": rows}), flush=True)
        if failed:
            print(f"dledger snapshot: error: {summary}", file=sys.stderr)
            return EXIT_DEFINITE
        return 0
    if failed:
        raise CliError(summary, EXIT_DEFINITE)
    return 0
