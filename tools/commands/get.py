"""Print committed entries: "index term body" per line, from --index, at most --count.

Bodies are shown as UTF-8 with backslash escapes (\\n, \\t, \\\\, \\xNN for bytes that are not
UTF-8 or not printable), so one entry is always one line. A NOOP entry (written by a new leader)
shows "(noop)". --raw writes only the bodies, each followed by a newline; --json writes one
object per line: index, term, pos, type, body_b64 (and body, when it is valid UTF-8).

Fewer than --count lines are printed at the committed end; an --index that is not committed is
an error (INDEX_OUT_OF_RANGE).

Example:
  dledger get --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --index 0 --count 10
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
    p.add_argument("--index", type=log_index, required=True, metavar="I",
                   help="first index, 0 or more (required)")
    p.add_argument("--count", type=positive_int, default=1, metavar="N",
                   help="at most this many entries (default: %(default)s)")
    p.add_argument("--linearizable", action="store_true",
                   help="the leader confirms its leadership before answering (default: off)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--raw", action="store_true", help="bodies only, as bytes, newline-separated (default: off)")
    fmt.add_argument("--json", action="store_true", help="one JSON object per entry (default: off)")


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


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    if args.index < 0 or args.count < 1:
        raise CliError("--index must be >= 0 and --count >= 1", EXIT_USAGE)
    with open_client(args) as c:
        try:
            entries = c.get_range(args.index, args.count, linearizable=args.linearizable)
        except DLedgerError as e:
            raise cli_error(e) from None
    out = sys.stdout
    for e in entries:
        if args.raw:
            out.flush()
            sys.stdout.buffer.write(e.body + b"\n")
        elif args.json:
            row = {"index": e.index, "term": e.term, "pos": e.pos, "type": e.type,
                   "body_b64": base64.b64encode(e.body).decode("ascii")}
            try:
                row["body"] = e.body.decode("utf-8")
            except UnicodeDecodeError:
                pass
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        elif e.type == "NOOP":
            out.write(f"{e.index} {e.term} (noop)\n")
        else:
            out.write(f"{e.index} {e.term} {escape_body(e.body)}\n")
    out.flush()
    return 0
