"""Append entries to the group and print "index term" for each, in order, once committed.

Each DATA argument is one entry (UTF-8); "-" reads entries from stdin, one per line (the
trailing newline is not part of the entry). Entries are appended one after another; with
--batch K, K entries at a time travel in one BATCH_APPEND (contiguous indexes).

On failure the entries before the failing one have been printed (they are committed) and one
error line names the response code. An indeterminate failure (timeout after sending,
WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED) says "(indeterminate: it may still be committed)" and
exits 3: check with `dledger get` before appending it again, or it may be stored twice.

If stdout is closed by its reader (`... | head -1`), no further entry is appended: the command
stops, says on stderr how many entries were appended (their indexes may not all have been
printed) and exits 1, so a pipeline never drops input silently.

--json prints one object per entry, {"index", "term"}, a line each.

Example:
  dledger append --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" hello world
  seq 1000 | dledger append --peers "$PEERS" --batch 100 -
"""

from __future__ import annotations

import argparse
import itertools
import json
import select
import sys
from collections.abc import Iterator

from tools.cli import EXIT_RUNTIME, CliError, positive_int, quiet_stdout
from tools.commands.metadata import (
    EXIT_USAGE,
    add_client_arguments,
    add_json_argument,
    cli_error,
    open_client,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--batch", type=positive_int, default=1, metavar="K",
                   help="entries per request (BATCH_APPEND when > 1; default: %(default)s)")
    add_json_argument(p, 'one {"index", "term"} object per entry, a line each')
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


def _reader_gone() -> bool:
    """True when stdout is a pipe whose reader has closed it (poll says POLLERR): checked
    before each request, so `seq 3000 | dledger append ... - | head -1` stops appending once
    head is gone instead of appending everything it can no longer report."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _broken_pipe(done: int, printed: int) -> CliError:
    quiet_stdout()
    unprinted = f" (the last {done - printed} of them perhaps not printed)" if done > printed else ""
    return CliError(f"stdout was closed (broken pipe): {done} entries appended{unprinted}; "
                    "the rest of the input was not appended", EXIT_RUNTIME)


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    if args.batch < 1:
        raise CliError("--batch must be >= 1", EXIT_USAGE)
    done = printed = 0
    with open_client(args) as c:
        it = _bodies(args.data)
        while chunk := list(itertools.islice(it, args.batch)):
            if _reader_gone():
                raise _broken_pipe(done, printed)
            try:
                results = [c.append(chunk[0])] if len(chunk) == 1 else c.append_batch(chunk)
            except DLedgerError as e:
                what = f"entry {done + 1}" if len(chunk) == 1 else f"entries {done + 1}-{done + len(chunk)}"
                raise cli_error(e, f"{what}: ") from None
            done += len(chunk)
            try:
                for r in results:
                    print(json.dumps({"index": r.index, "term": r.term}) if args.json
                          else f"{r.index} {r.term}")
                sys.stdout.flush()
                printed = done
            except BrokenPipeError:
                raise _broken_pipe(done, printed) from None
    return 0
