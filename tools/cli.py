"""`dledger`: one command, one module per subcommand (tools/cmd_<name>.py).

Each subcommand module has a docstring (its --help text), `add_arguments(parser)` and
`run(args) -> int`. Errors become one line on stderr and a non-zero exit; `--debug` shows the
traceback. Modules are imported lazily so `dledger dump` never pays for pyspark or zmq.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

SUBCOMMANDS: dict[str, str] = {
    "server": "tools.cmd_server",
    "cluster": "tools.cmd_cluster",
    "append": "tools.cmd_append",
    "get": "tools.cmd_get",
    "metadata": "tools.cmd_metadata",
    "transfer": "tools.cmd_transfer",
    "dump": "tools.cmd_dump",
    "bench": "tools.cmd_bench",
    "export": "tools.cmd_export",
    "verify": "tools.cmd_verify",
    "chaos": "tools.cmd_chaos",
    "kv": "tools.cmd_kv",
    "snapshot": "tools.cmd_snapshot",
}


class CliError(Exception):
    """An expected failure: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


HELP: dict[str, str] = {
    "server": "run one node in the foreground",
    "cluster": "run a local N-node group on 127.0.0.1",
    "append": "append entries and print their index and term",
    "get": "print committed entries",
    "metadata": "show every node's view of the group",
    "transfer": "hand leadership to another node",
    "dump": "decode a node's store read-only",
    "bench": "throughput/latency benchmark",
    "export": "committed entries to Parquet (PySpark)",
    "verify": "cross-replica check of committed prefixes (PySpark)",
    "chaos": "seeded fault injection with a history check",
    "kv": "the replicated KV store (put, get, del, cas, scan)",
    "snapshot": "snapshot the state machine now",
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, found before building any parser: only its
    module gets imported (a `dledger server` start does not pay for pyspark, rich or zmq
    clients it will never use)."""
    for a in argv:
        if not a.startswith("-"):
            return a if a in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dledger", description="DLedger for Python: a Raft-replicated commit log. "
        "Run `dledger COMMAND --help` for one command.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _chosen(argv)
    for name, modname in SUBCOMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=HELP[name])
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            p = sub.add_parser(name, help=f"(unavailable: {e})")
            p.set_defaults(_missing=e)
            continue
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(name, help=HELP[name], description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and debug logs")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if hasattr(args, "_missing"):
            raise CliError(f"{args.command}: missing dependency: {args._missing}")
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the CLI's one place that turns errors into a line
        if debug:
            raise
        print(f"dledger {args.command}: error: {e}", file=sys.stderr)
        return e.code if isinstance(e, CliError) else 1


if __name__ == "__main__":
    # Run through the importable module, not this __main__ copy: subcommands raise
    # tools.cli.CliError, which must be the class main() catches (its exit code matters).
    from tools.cli import main as _main

    sys.exit(_main())
