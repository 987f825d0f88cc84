"""Print committed entries: "index term body" per line, from --index, at most --count.

Bodies are shown as UTF-8 with backslash escapes (\\n, \\t, \\\\, \\xNN for bytes that are not
UTF-8 or not printable), so one entry is always one line. A NOOP entry (written by a new leader)
shows "(noop)". --raw writes only the bodies, each followed by a newline; --json writes one
object per line: index, term, pos, type, body_b64 (and body, when it is valid UTF-8).

Fewer than --count lines are printed at the committed end; an --index that is not committed is
an error (INDEX_OUT_OF_RANGE).

--follow prints entries as they commit, for ever, like `tail -f` (docs/client.md "Following the
log"): from --from earliest (the oldest entry the members keep), latest (the next entry to
commit) or an index; through leader changes and restarts, read from followers by preference.
It exits 0 on Ctrl-C and when its reader goes away (`| head`), and 1 with one line when the
start is below every member's log begin (INDEX_LESS_THAN_LOCAL_BEGIN). --format jsonl writes
dump's keys (index, term, pos, type, body_b64) plus `body` when it is UTF-8, one entry per line.

Examples:
  dledger get --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --index 0 --count 10
  dledger get --peers "$PEERS" --follow --from latest --format jsonl | jq -r .body
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys

from tools.cli import CliError, log_index, positive_int
from tools.commands.metadata import EXIT_USAGE, add_client_arguments, cli_error, open_client


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--index", type=log_index, metavar="I",
                   help="first index, 0 or more (required without --follow)")
    p.add_argument("--count", type=positive_int, default=1, metavar="N",
                   help="at most this many entries (default: %(default)s)")
    p.add_argument("--linearizable", action="store_true",
                   help="the leader confirms its leadership before answering (default: off)")
    p.add_argument("--follow", action="store_true",
                   help="print entries as they commit, for ever (Ctrl-C stops; default: off)")
    p.add_argument("--from", dest="start", type=follow_start, default=None, metavar="WHERE",
                   help="with --follow: earliest, latest or an index (default: latest)")
    p.add_argument("--include-noop", action="store_true",
                   help="with --follow: print the NOOP entries new leaders write too (default: off)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--raw", action="store_true", help="bodies only, as bytes, newline-separated (default: off)")
    fmt.add_argument("--json", action="store_true", help="one JSON object per entry (default: off)")
    fmt.add_argument("--format", choices=("text", "json", "jsonl"), default=None,
                     help="text (default), json (as --json) or jsonl (dump's keys, one line each)")


def follow_start(text: str) -> int | str:
    """--from: earliest, latest or an index."""
    if text in ("earliest", "latest"):
        return text
    try:
        return log_index(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be earliest, latest or an index, got {text}") from None


_SIMPLE = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\udc80-\udcff]")


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _SIMPLE:
        return _SIMPLE[ch]
    code = ord(ch)
    return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"


def escape_body(body: bytes) -> str:
    """One printable line per body: undecodable bytes -> \\xNN, controls escaped, \\ doubled."""
    return _ESCAPE.sub(_escape_char, body.decode("utf-8", "surrogateescape"))


def entry_line(e, fmt: str) -> str:  # noqa: ANN001 - ipc.client.Entry
    """One entry as one line of output, newline included (not for --raw)."""
    if fmt in ("json", "jsonl"):
        row = {"index": e.index, "term": e.term, "pos": e.pos, "type": e.type,
               "body_b64": base64.b64encode(e.body).decode("ascii")}
        try:
            row["body"] = e.body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        return json.dumps(row, ensure_ascii=False, separators=(",", ":") if fmt == "jsonl" else None) + "\n"
    if e.type == "NOOP":
        return f"{e.index} {e.term} (noop)\n"
    return f"{e.index} {e.term} {escape_body(e.body)}\n"


def _format(args: argparse.Namespace) -> str:
    if args.raw:
        return "raw"
    if args.json:
        return "json"
    return args.format or "text"


def _write(e, fmt: str) -> None:  # noqa: ANN001
    if fmt == "raw":
        sys.stdout.flush()
        sys.stdout.buffer.write(e.body + b"\n")
    else:
        sys.stdout.write(entry_line(e, fmt))


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    if args.follow:
        return follow(args)
    if args.start is not None or args.include_noop:
        raise CliError("--from and --include-noop go with --follow", EXIT_USAGE)
    if args.index is None:
        raise CliError("--index is required (or --follow)", EXIT_USAGE)
    if args.index < 0 or args.count < 1:
        raise CliError("--index must be >= 0 and --count >= 1", EXIT_USAGE)
    with open_client(args) as c:
        try:
            entries = c.get_range(args.index, args.count, linearizable=args.linearizable)
        except DLedgerError as e:
            raise cli_error(e) from None
    fmt = _format(args)
    for e in entries:
        _write(e, fmt)
    sys.stdout.flush()
    return 0


def follow(args: argparse.Namespace) -> int:
    """--follow: entries as they commit, flushed one by one; 0 on Ctrl-C or a closed pipe."""
    from ipc.client import DLedgerError

    if args.index is not None:
        raise CliError("--follow starts at --from, not --index", EXIT_USAGE)
    fmt = _format(args)
    try:
        with open_client(args) as c:
            try:
                for e in c.follow(args.start if args.start is not None else "latest",
                                  include_noop=args.include_noop):
                    _write(e, fmt)
                    sys.stdout.flush()
            except DLedgerError as e:
                raise cli_error(e) from None
    except KeyboardInterrupt:
        return 0
    return 0
