"""`dledger`: one command, one module per subcommand (tools/commands/<name>.py).

Each subcommand module has a docstring (its --help text), `add_arguments(parser)` and
`run(args) -> int`. Errors become one line on stderr and a non-zero exit (2: bad usage, 1: it
failed at run time); `--debug` shows the traceback. Modules are imported lazily so `dledger
dump` never pays for pyspark or zmq.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from node.observe.logfmt import configure_logging

EXIT_RUNTIME = 1
EXIT_USAGE = 2

SUBCOMMANDS: dict[str, str] = {
    "server": "tools.commands.server",
    "cluster": "tools.commands.cluster",
    "append": "tools.commands.append",
    "get": "tools.commands.get",
    "metadata": "tools.commands.metadata",
    "transfer": "tools.commands.transfer",
    "dump": "tools.commands.dump",
    "bench": "tools.commands.bench",
    "export": "tools.commands.export",
    "verify": "tools.commands.verify",
    "chaos": "tools.commands.chaos",
    "kv": "tools.commands.kv",
    "snapshot": "tools.commands.snapshot",
    "backup": "tools.commands.backup",
    "restore": "tools.commands.restore",
    "config": "tools.commands.config",
    "health": "tools.commands.health",
    "top": "tools.commands.top",
    "completion": "tools.commands.completion",
    "keygen": "tools.commands.keygen",
    "member": "tools.commands.member",
}


class CliError(Exception):
    """An expected failure: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = 1, response: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.response = response  # the response code's name when a DLedgerError caused it


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
    "backup": "copy the group's committed log over the network into a directory",
    "restore": "seed a new group's node from a backup",
    "config": "check a node config file",
    "health": "exit 0 only if the group has one leader, a quorum and no lagging follower",
    "member": "online membership change: list, add, promote, remove",
    "top": "live view of a group (role, commits, lag, rates, p99, disk)",
    "completion": "print a bash or zsh completion script for dledger",
    "keygen": "write a CurveZMQ key pair (NAME.key, NAME.key_secret)",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the subcommand (`dledger server: error:
    unrecognized arguments: --bogus (see dledger server --help)`), not a usage block: scripts
    and people read the last line, and an unknown server flag used to print the top-level
    usage, which hid where the mistake was."""

    json_errors = False  # set by main() when --json is on the command line

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            print_json_error(f"{self.prog}: {message}", EXIT_USAGE)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def version() -> str:
    """The installed package's version; from setup.cfg when running from a checkout that was
    never installed (so `dledger --version` answers in every way the tool can be run)."""
    from importlib import metadata

    try:
        return metadata.version("dledger-py")
    except metadata.PackageNotFoundError:
        import configparser

        cp = configparser.ConfigParser()
        cp.read(Path(__file__).resolve().parent.parent / "setup.cfg")
        return cp.get("metadata", "version", fallback="0+unknown")


# ---- argparse types: a bad value is a one-line usage error (exit 2) before anything runs ----
def _number(kind: Callable[[str], float], text: str) -> float:
    try:
        v = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _checked(kind: type, ok: Callable[[float], bool], rule: str, doc: str) -> Callable[[str], Any]:
    """An argparse type: `text` parsed as `kind` (finite), refused with "must be RULE" unless
    `ok(value)`. One place for every numeric option's check and message."""
    def parse(text: str) -> Any:
        v = kind(_number(kind, text))
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return v
    parse.__doc__ = doc
    return parse


# The longest duration or timeout any option takes, in seconds (a year). Without a bound,
# `--timeout 1e308` passed argparse and failed deep inside a wait with "timestamp out of range
# for platform time_t": an argument error must say the valid range instead.
MAX_SECONDS = 365 * 24 * 3600

positive_int = _checked(int, lambda v: v >= 1, ">= 1", "An int >= 1 (counts: nodes, entries, threads).")
nonneg_int = _checked(int, lambda v: v >= 0, ">= 0", "An int >= 0.")
positive_float = _checked(float, lambda v: 0 < v <= MAX_SECONDS, f"> 0 and <= {MAX_SECONDS} seconds",
                          "A finite number of seconds in (0, MAX_SECONDS] (durations, timeouts).")
nonneg_float = _checked(float, lambda v: 0 <= v <= MAX_SECONDS, f">= 0 and <= {MAX_SECONDS} seconds",
                        "A finite number of seconds in [0, MAX_SECONDS].")
fraction = _checked(float, lambda v: 0 <= v <= 1, "between 0 and 1", "A number in [0, 1].")


MAX_INDEX = (1 << 63) - 1


def log_index(text: str) -> int:
    """A log index: 0 .. 2^63-1 (the wire's i64), so a huge number is a usage error here and not
    a response code from the server."""
    v = int(_number(int, text))
    if not 0 <= v <= MAX_INDEX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_INDEX}, got {text}")
    return v


def size_arg(text: str) -> int:
    """A size in bytes with an optional unit (`64MiB`, `1GiB`, `512KiB`, `4096`): the same
    parser as the config file's (node.config.parse_size)."""
    from node.config import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def peers_arg(text: str) -> str:
    """A peers string with no duplicate id or address and no data port on another node's
    elector port (node.wiring.ports.peers_problems), all found before any client or node starts."""
    from node.wiring.ports import peers_problems

    problems = peers_problems(text)
    if problems:
        raise argparse.ArgumentTypeError("; ".join(problems))
    return text


PEERS_HELP = ('the group, ID-HOST:PORT;... e.g. "n0-127.0.0.1:20911;n1-127.0.0.1:20913" '
              "(each node also uses PORT+1) (required)")


def add_group_arguments(p: argparse.ArgumentParser) -> None:
    """--peers and --group, spelled and checked the same by every command that talks to a
    running group (one definition: three copies had already drifted in their help)."""
    p.add_argument("--peers", required=True, type=peers_arg, metavar="PEERS", help=PEERS_HELP)
    p.add_argument("--group", default="default", help="group name (default: %(default)s)")
    p.add_argument("--key-file", default=None, metavar="FILE",
                   help="this client's CurveZMQ secret key (NAME.key_secret; the members' ID.key "
                        "files beside it) for a secure group (default: $DLEDGER_KEY_FILE; none: "
                        "plain)")


def key_file_of(args: argparse.Namespace) -> str | None:
    """The client key file for a group command: --key-file, else $DLEDGER_KEY_FILE, else None
    (plain). Checked here, so a bad file is one line and exit 2 before anything connects."""
    from ipc.security import KeyFileError, client_key_file

    try:
        return client_key_file(getattr(args, "key_file", None), "--key-file")
    except KeyFileError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def client_options(args: argparse.Namespace) -> dict[str, str]:
    """`DLedgerClient`/`KVClient` keyword options from the common group arguments."""
    path = key_file_of(args)
    return {} if path is None else {"key_file": path}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, found before building any parser: only its
    module gets imported (a `dledger server` start does not pay for pyspark, rich or zmq
    clients it will never use)."""
    for a in argv:
        if not a.startswith("-"):
            return a if a in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] = (), full: bool = False) -> argparse.ArgumentParser:
    """The parser for `argv`: only the chosen subcommand gets its options (and its module
    imported); with `full`, every subcommand does (shell completion needs them all)."""
    parser = Parser(
        prog="dledger", description="DLedger for Python: a Raft-replicated commit log. "
        "Run `dledger COMMAND --help` for one command.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"dledger {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _chosen(argv)
    for name, modname in SUBCOMMANDS.items():
        if name != chosen and not full:
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


def innermost_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command actually chosen (`dledger kv put`): the one whose name a
    usage error should carry."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            child = action.choices.get(getattr(args, action.dest, None) or "")
            if child is not None:
                return innermost_parser(child, args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C while the parser or a subcommand module is still being imported: quiet, like
        # one during the command itself (a traceback of an import is noise to an operator).
        return 130


def _main(argv: list[str]) -> int:
    Parser.json_errors = "--json" in argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        innermost_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    debug = getattr(args, "debug", False)
    configure_logging(getattr(args, "log_level", None) or "info",
                      getattr(args, "log_format", None) or "text", debug=debug, force=False)
    try:
        if hasattr(args, "_missing"):
            raise CliError(f"{args.command}: missing dependency: {args._missing}")
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # A reader that stopped reading (`dledger get ... | head -1`): its choice, not a
        # failure. Commands that write to the group (append) catch it themselves: for them a
        # closed stdout must not silently drop input.
        quiet_stdout()
        return 0
    except Exception as e:  # noqa: BLE001 - the CLI's one place that turns errors into a line
        if debug:
            raise
        message = one_line(e)
        rc = e.code if isinstance(e, CliError) else EXIT_RUNTIME
        print(f"dledger {args.command}: error: {message}", file=sys.stderr)
        if getattr(args, "json", False):
            print_json_error(message, rc, error_code(e))
        return rc


def error_code(e: BaseException) -> str | None:
    """The response code's name behind an error (`TIMEOUT`, `TAKE_LEADERSHIP_FAILED`), if any:
    a CliError made from a DLedgerError keeps it (tools/commands/metadata.py cli_error)."""
    if isinstance(e, CliError):
        return e.response
    name = getattr(e, "name", None)
    return name if isinstance(name, str) else None


def print_json_error(message: str, exit_code: int, code: str | None = None) -> None:
    """Under --json a failure is a JSON object on stdout too (scripts parse stdout, and an
    empty stdout said nothing): {"error": message, "code": response code name or null,
    "exit_code": the process's exit code}. The one line on stderr stays for people."""
    import json

    try:
        print(json.dumps({"error": message, "code": code, "exit_code": exit_code}), flush=True)
    except BrokenPipeError:
        quiet_stdout()


def quiet_stdout() -> None:
    """After EPIPE on stdout: point it at /dev/null so the interpreter's final flush does not
    print "Exception ignored ... BrokenPipeError" (Python's documented recipe)."""

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def one_line(e: BaseException) -> str:
    """An unexpected error as one readable line: an OSError as `path: reason`, never `[Errno N]`."""
    if isinstance(e, OSError) and e.strerror:
        where = " -> ".join(str(x) for x in (e.filename, e.filename2) if x is not None)
        return f"{where}: {e.strerror}" if where else e.strerror
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    # Run through the importable module, not this __main__ copy: subcommands raise
    # tools.cli.CliError, which must be the class main() catches (its exit code matters).
    from tools.cli import main as _main

    sys.exit(_main())
