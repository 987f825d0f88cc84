"""The replicated KV store of a group started with --state-machine kv (docs/statemachine.md).

  dledger kv put  --peers P KEY VALUE          prints the new revision
  dledger kv get  --peers P KEY [--json]       prints the value (exit 1: not found)
  dledger kv del  --peers P KEY                prints 1 if the key was there, else 0
  dledger kv cas  --peers P KEY EXPECTED NEW   swaps only if the value is EXPECTED; exit 0
                                               when it swapped, 1 when not (--absent: only if
                                               the key does not exist; then give KEY NEW)
  dledger kv scan --peers P [PREFIX] [--limit N] [--json]   "key<TAB>value<TAB>revision" lines

Reads are linearizable (they reflect every write acknowledged before them); writes are
applied once even when the client resends them after a failover. Keys and values are UTF-8
arguments (bytes that are not valid UTF-8 pass through unchanged). Bad input (an empty key,
a key over 4 KiB, a value over 1 MiB) is one line and exit 2; an outcome that may still
change (a timeout after sending) exit 3.

Example:
  dledger cluster --nodes 3 --state-machine kv     # prints PEERS
  dledger kv put --peers "$PEERS" greeting hello
  dledger kv get --peers "$PEERS" greeting
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.cli import CliError, positive_int
from tools.cmd_metadata import EXIT_DEFINITE, EXIT_USAGE, add_client_arguments, cli_error


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="kv_op", metavar="OP", required=True)
    doc = __doc__
    for name, help_text in (("put", "set KEY to VALUE"), ("get", "print KEY's value"),
                            ("del", "delete KEY"), ("cas", "compare-and-set"),
                            ("scan", "keys with a prefix, in order")):
        sp = sub.add_parser(name, help=help_text, description=doc,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_client_arguments(sp)
        if name == "scan":
            sp.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="key prefix (default: all)")
            sp.add_argument("--limit", type=positive_int, default=None, metavar="N",
                            help="at most N keys (default: all)")
        else:
            sp.add_argument("key", metavar="KEY", help="the key (UTF-8, at most 4 KiB)")
        if name == "put":
            sp.add_argument("value", metavar="VALUE", help="the value (UTF-8, at most 1 MiB)")
        if name == "cas":
            sp.add_argument("operands", nargs="+", metavar="EXPECTED NEW",
                            help="the expected value and the new one (with --absent: only NEW)")
            sp.add_argument("--absent", action="store_true", help="swap only if KEY does not exist (default: off)")
        if name in ("get", "scan"):
            sp.add_argument("--json", action="store_true", help="JSON output (default: text)")


def _b(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _s(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _kv_json(kv) -> dict:  # noqa: ANN001 - node.statemachine.kv.KeyValue
    return {"key": _s(kv.key), "value": _s(kv.value), "revision": kv.mod_revision,
            "create_revision": kv.create_revision, "version": kv.version}


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError, KVClient, KVError
    from ipc.protocol import ProtocolError
    from ipc.sockets import PeersError
    from node.statemachine.kv import KVInputError

    if args.timeout <= 0:
        raise CliError("--timeout must be > 0", EXIT_USAGE)
    op = args.kv_op
    if op == "cas" and len(args.operands) != (1 if args.absent else 2):
        raise CliError("cas: give EXPECTED NEW (or, with --absent, only NEW)", EXIT_USAGE)
    if op == "scan" and args.limit is not None and args.limit < 1:
        raise CliError("--limit must be >= 1", EXIT_USAGE)
    try:
        kv = KVClient(args.peers, args.group, timeout=args.timeout)
    except (PeersError, ProtocolError, ValueError) as e:
        raise CliError(f"bad --peers/--group: {e}", EXIT_USAGE) from None
    try:
        with kv:
            if op == "put":
                print(kv.put(_b(args.key), _b(args.value)))
            elif op == "get":
                got = kv.get(_b(args.key))
                if got is None:
                    raise CliError(f"key {args.key!r} not found", EXIT_DEFINITE)
                print(json.dumps(_kv_json(got)) if args.json else _s(got.value))
            elif op == "del":
                print(1 if kv.delete(_b(args.key)) else 0)
            elif op == "cas":
                expected = None if args.absent else _b(args.operands[0])
                swapped = kv.cas(_b(args.key), expected, _b(args.operands[-1]))
                print("swapped" if swapped else "not swapped")
                return 0 if swapped else EXIT_DEFINITE
            else:
                for item in kv.scan(_b(args.prefix), args.limit):
                    if args.json:
                        print(json.dumps(_kv_json(item)))
                    else:
                        print(f"{_s(item.key)}\t{_s(item.value)}\t{item.mod_revision}")
            sys.stdout.flush()
    except (KVInputError, TypeError) as e:
        raise CliError(str(e), EXIT_USAGE) from None
    except KVError as e:
        raise CliError(str(e), EXIT_DEFINITE) from None
    except DLedgerError as e:
        raise cli_error(e) from None
    return 0
