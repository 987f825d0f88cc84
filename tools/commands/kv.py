"""The replicated KV store of a group started with --state-machine kv (docs/statemachine.md).

  dledger kv put  --peers P KEY VALUE          prints the new revision
  dledger kv put  --peers P KEY --value-file F the value is F's bytes, as they are ("-": stdin)
  dledger kv get  --peers P KEY [--json]       prints the value (exit 1: not found)
  dledger kv del  --peers P KEY                prints 1 if the key was there, else 0
  dledger kv cas  --peers P KEY EXPECTED NEW   swaps only if the value is EXPECTED; exit 0
                                               when it swapped, 1 when not (--absent: only if
                                               the key does not exist; then give KEY NEW)
  dledger kv scan --peers P [PREFIX] [--limit N] [--json]   "key<TAB>value<TAB>revision" lines
  dledger kv watch --peers P KEY [--prefix] [--from-revision R] [--prev] [--json]
                                               every change of KEY (or under the prefix), in
                                               revision order, for ever: "PUT<TAB>key<TAB>value
                                               <TAB>revision" / "DELETE<TAB>key<TAB><TAB>revision"
                                               lines; from now, or from revision R (exit 1 with
                                               INDEX_LESS_THAN_LOCAL_BEGIN when retention removed
                                               that history); Ctrl-C or a closed pipe: exit 0

Reads are linearizable (they reflect every write acknowledged before them); writes are
applied once even when the client resends them after a failover. Keys and values are UTF-8
arguments (bytes that are not valid UTF-8 pass through unchanged); --value-file takes any
bytes, up to the 1 MiB value limit. Bad input (an empty key, a key over 4 KiB, a value over
1 MiB) is one line and exit 2; an outcome that may still change (a timeout after sending)
exit 3.

--json: put prints {"revision"}, del {"deleted"}, cas {"swapped"}, get {"key", "value",
"revision", "create_revision", "version"}, scan one such object per key; a failure is
{"error", "code", "exit_code"} on stdout, with the same exit code.

Example:
  dledger cluster --nodes 3 --state-machine kv     # prints PEERS
  dledger kv put --peers "$PEERS" greeting hello
  dledger kv get --peers "$PEERS" greeting
  dledger kv put --peers "$PEERS" blob --value-file ./blob.bin
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.cli import CliError, client_options, positive_int
from tools.commands.metadata import EXIT_DEFINITE, EXIT_USAGE, add_client_arguments, cli_error

JSON_SHAPES = {"put": 'one {"revision"} object', "get": "one object: key, value, revision, "
               "create_revision, version", "del": 'one {"deleted"} object',
               "cas": 'one {"swapped"} object', "scan": "one object per key, a line each",
               "watch": "one object per change, a line each: type, key, value, revision, "
                        "create_revision, version[, prev_value, prev_revision]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="kv_op", metavar="OP", required=True)
    doc = __doc__
    for name, help_text in (("put", "set KEY to VALUE"), ("get", "print KEY's value"),
                            ("del", "delete KEY"), ("cas", "compare-and-set"),
                            ("scan", "keys with a prefix, in order"),
                            ("watch", "print every change of a key or prefix, for ever")):
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
            sp.add_argument("value", nargs="?", metavar="VALUE",
                            help="the value (UTF-8, at most 1 MiB) (required unless --value-file)")
            sp.add_argument("--value-file", metavar="PATH",
                            help='read the value from PATH, its bytes as they are, at most 1 MiB; '
                                 '"-" reads stdin (default: the VALUE argument)')
            sp.set_defaults(_put_parser=sp)
        if name == "watch":
            sp.add_argument("--prefix", action="store_true",
                            help="watch every key starting with KEY (default: KEY only)")
            sp.add_argument("--from-revision", type=positive_int, default=None, metavar="R",
                            help="report changes from revision R on (default: from now)")
            sp.add_argument("--prev", action="store_true",
                            help="also print each key's value before the change (default: off)")
        if name == "cas":
            sp.add_argument("operands", nargs="+", metavar="EXPECTED NEW",
                            help="the expected value and the new one (with --absent: only NEW)")
            sp.add_argument("--absent", action="store_true", help="swap only if KEY does not exist (default: off)")
        from tools.commands.metadata import add_json_argument

        add_json_argument(sp, JSON_SHAPES[name])


def _b(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _s(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _read_value(path: str) -> bytes:
    """The value from a file or stdin ("-"), read no further than one byte past the limit (a
    10 GB file is refused without being read). A missing file is a usage error (exit 2)."""
    from node.statemachine.kv import MAX_VALUE_SIZE

    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_VALUE_SIZE + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_VALUE_SIZE + 1)
    except OSError as e:
        raise CliError(f"--value-file {path}: {e.strerror or e}", EXIT_USAGE) from None
    if len(data) > MAX_VALUE_SIZE:
        where = "stdin" if path == "-" else path
        raise CliError(f"--value-file: {where} holds more than the value limit of "
                       f"{MAX_VALUE_SIZE} bytes (1 MiB)", EXIT_USAGE)
    return data


def _kv_json(kv) -> dict:  # noqa: ANN001 - node.statemachine.kv.KeyValue
    return {"key": _s(kv.key), "value": _s(kv.value), "revision": kv.mod_revision,
            "create_revision": kv.create_revision, "version": kv.version}


def _watch(kv, args: argparse.Namespace) -> int:  # noqa: ANN001 - ipc.client.KVClient
    """`kv watch`: one line per change, flushed; Ctrl-C ends it with exit 0."""
    try:
        for ev in kv.watch(_b(args.key), prefix=args.prefix, start_revision=args.from_revision,
                           prev_kv=args.prev):
            if args.json:
                row = {"type": ev.type, "key": _s(ev.key), "revision": ev.revision,
                       "value": None if ev.kv is None else _s(ev.kv.value),
                       "create_revision": None if ev.kv is None else ev.kv.create_revision,
                       "version": None if ev.kv is None else ev.kv.version}
                if args.prev:
                    row["prev_value"] = None if ev.prev_kv is None else _s(ev.prev_kv.value)
                    row["prev_revision"] = None if ev.prev_kv is None else ev.prev_kv.mod_revision
                line = json.dumps(row)
            else:
                value = "" if ev.kv is None else _s(ev.kv.value)
                line = f"{ev.type}\t{_s(ev.key)}\t{value}\t{ev.revision}"
                if args.prev:
                    line += "\t" + ("" if ev.prev_kv is None else _s(ev.prev_kv.value))
            print(line, flush=True)
    except KeyboardInterrupt:
        return 0
    return 0


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
    value = None
    if op == "put":
        if (args.value is None) == (args.value_file is None):
            args._put_parser.error("the following arguments are required: VALUE (or --value-file "
                                   "PATH, not both)" if args.value is None else
                                   "give VALUE or --value-file PATH, not both")
        value = _read_value(args.value_file) if args.value_file is not None else _b(args.value)
    try:
        kv = KVClient(args.peers, args.group, timeout=args.timeout, **client_options(args))
    except (PeersError, ProtocolError, ValueError) as e:
        raise CliError(f"bad --peers/--group: {e}", EXIT_USAGE) from None
    try:
        with kv:
            if op == "put":
                rev = kv.put(_b(args.key), value)
                print(json.dumps({"revision": rev}) if args.json else rev)
            elif op == "get":
                got = kv.get(_b(args.key))
                if got is None:
                    raise CliError(f"key {args.key!r} not found", EXIT_DEFINITE, response="NOT_FOUND")
                print(json.dumps(_kv_json(got)) if args.json else _s(got.value))
            elif op == "del":
                deleted = kv.delete(_b(args.key))
                print(json.dumps({"deleted": bool(deleted)}) if args.json else int(bool(deleted)))
            elif op == "cas":
                expected = None if args.absent else _b(args.operands[0])
                swapped = kv.cas(_b(args.key), expected, _b(args.operands[-1]))
                print(json.dumps({"swapped": bool(swapped)}) if args.json
                      else "swapped" if swapped else "not swapped")
                return 0 if swapped else EXIT_DEFINITE
            elif op == "watch":
                return _watch(kv, args)
            else:
                for item in kv.scan(_b(args.prefix), args.limit):
                    if args.json:
                        print(json.dumps(_kv_json(item)))
                    else:
                        print(f"{_s(item.key)}\t{_s(item.value)}\t{item.mod_revision}")
            sys.stdout.flush()
    except (KVInputError, TypeError) as e:
        raise CliError(str(e), EXIT_USAGE, response=getattr(getattr(e, "status", None), "name", None)) from None
    except KVError as e:
        raise CliError(str(e), EXIT_DEFINITE, response=getattr(getattr(e, "status", None), "name", None)) from None
    except DLedgerError as e:
        raise cli_error(e) from None
    return 0
