"""Append entries to the group and print "index term" for each, in order, once committed.

Each DATA argument is one entry (UTF-8); "-" reads entries from stdin, one per line (the
trailing newline is not part of the entry). Entries are appended one after another; with
--batch K, K entries at a time travel in one BATCH_APPEND (contiguous indexes).

On failure the entries before the failing one have been printed (they are committed) and one
error line names the response code. An indeterminate failure (timeout after sending,
WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED) says "(indeterminate: it may still be committed)" and
exits 3: check with `dledger get` before appending it again, or it may be stored twice.

Example:
  dledger append --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" hello world
  seq 1000 | dledger append --peers "$PEERS" --batch 100 -
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator

from tools.cli import CliError, positive_int
from tools.cmd_metadata import EXIT_USAGE, add_client_arguments, cli_error, open_client


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--batch", type=positive_int, default=1, metavar="K",
                   help="entries per request (BATCH_APPEND when > 1; default: %(default)s)")
    p.add_argument("data", nargs="+", metavar="DATA", help='entry bodies; "-" = stdin lines')


def _bodies(items: list[str]) -> Iterator[bytes]:
    for item in items:
        if item == "-":
            for line in sys.stdin.buffer:
                if line.endswith(b"\n"):
                    line = line[:-1]
                    if line.endswith(b"\r"):
                        line = line[:-1]
                yield line
        else:
            # surrogateescape: arguments that were not valid UTF-8 keep their original bytes.
            yield item.encode("utf-8", "surrogateescape")


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    if args.batch < 1:
        raise CliError("--batch must be >= 1", EXIT_USAGE)
    done = 0
    with open_client(args) as c:
        it = _bodies(args.data)
        while chunk := list(itertools.islice(it, args.batch)):
            try:
                results = [c.append(chunk[0])] if len(chunk) == 1 else c.append_batch(chunk)
            except DLedgerError as e:
                what = f"entry {done + 1}" if len(chunk) == 1 else f"entries {done + 1}-{done + len(chunk)}"
                raise cli_error(e, f"{what}: ") from None
            for r in results:
                print(f"{r.index} {r.term}")
            sys.stdout.flush()
            done += len(chunk)
    return 0
