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
}


class CliError(Exception):
    """An expected failure: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _available() -> dict[str, object]:
    mods = {}
    for name, modname in SUBCOMMANDS.items():
        try:
            mods[name] = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:  # subcommand not built yet: leave it out of --help
                continue
            mods[name] = e  # a dependency is missing: say so when it is used
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dledger", description="DLedger for Python: a Raft-replicated commit log. "
        "Run `dledger COMMAND --help` for one command.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, mod in _available().items():
        if isinstance(mod, Exception):
            p = sub.add_parser(name, help=f"(unavailable: {mod})")
            p.set_defaults(_missing=mod)
            continue
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else name, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and debug logs")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    sys.exit(main())
