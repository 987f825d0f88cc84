"""Show every node's view of the group: role, term, leader, ledger begin/end, committed, alive.

Every node is asked at once; a node that does not answer within a short per-node deadline is
shown as not alive (with --json: "alive": false and null fields). The group's leader and term
are the highest-term leader claim among the answers.

--json prints one object:
  {"group", "leader", "term", "nodes": [{"id", "address", "role", "term", "leader",
   "ledger_begin_index", "ledger_end_index", "committed_index", "alive",
   "lag", "version", "store_bytes", "disk_usage_ratio"}]}
with role one of LEADER, FOLLOWER, CANDIDATE; "lag" is entries behind the leader, as the
leader's watermarks say (null for the leader); "version", "store_bytes" (bytes) and
"disk_usage_ratio" (0-1) are null when the node did not answer. These are what the table
shows; --status, which once was needed for the last four, is still accepted. A failure under
--json is {"error", "code", "exit_code"} on stdout (and the line on stderr).

Exit codes (all client subcommands): 0 success, 1 definite failure, 2 bad arguments,
3 indeterminate failure (an append or transfer may still take effect).

Example:
  dledger metadata --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" --json
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tools.cli import CliError, add_group_arguments, client_options, key_file_of, positive_float

if TYPE_CHECKING:
    from ipc.client import DLedgerClient

EXIT_DEFINITE = 1
EXIT_USAGE = 2
EXIT_INDETERMINATE = 3


# Shared by the client subcommands (append, get, metadata, transfer).
def add_client_arguments(p: argparse.ArgumentParser, timeout: float = 3.0) -> None:
    add_group_arguments(p)
    p.add_argument("--timeout", type=positive_float, default=timeout, metavar="S",
                   help="overall timeout per call in seconds, retries included (default: %(default)s)")


def open_client(args: argparse.Namespace) -> DLedgerClient:
    """The client for the common options; bad options become one-line usage errors."""
    from ipc.client import DLedgerClient
    from ipc.protocol import ProtocolError
    from ipc.sockets import PeersError

    if args.timeout <= 0:
        raise CliError("--timeout must be > 0", EXIT_USAGE)
    options = client_options(args)
    try:
        return DLedgerClient(args.peers, args.group, timeout=args.timeout, **options)
    except (PeersError, ProtocolError, ValueError) as e:
        raise CliError(f"bad --peers/--group: {e}", EXIT_USAGE) from None


def add_json_argument(p: argparse.ArgumentParser, what: str) -> None:
    """--json, the same for every command that prints: `what` says the shape it prints."""
    p.add_argument("--json", action="store_true",
                   help=f"print {what}; a failure is {{\"error\", \"code\", \"exit_code\"}} on "
                        "stdout (default: text)")


NO_LEADER_HINT = ("; a group that has just started may still be electing its first leader: "
                  "wait for it with `dledger health --wait S`, or give a longer --timeout")


def cli_error(e: Exception, prefix: str = "", suffix: str = "") -> CliError:
    """A DLedgerError as one line; indeterminate outcomes get their own exit code. A timeout
    that found no leader says what usually causes it right after `dledger cluster`."""
    indeterminate = bool(getattr(e, "indeterminate", False))
    if getattr(e, "name", None) == "TIMEOUT" and not indeterminate \
            and "no reachable leader" in str(getattr(e, "reason", "")):
        suffix = NO_LEADER_HINT + suffix
    return CliError(f"{prefix}{e}{suffix}", EXIT_INDETERMINATE if indeterminate else EXIT_DEFINITE,
                    response=getattr(e, "name", None))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    p.add_argument("--status", action="store_true",
                   help="accepted for old scripts: --json now always has each node's lag, "
                        "version, store_bytes and disk_usage_ratio (default: off)")


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError

    with open_client(args) as c:
        try:
            m = c.metadata()
        except DLedgerError as e:
            raise cli_error(e) from None
    if not any(n.alive for n in m.nodes):
        raise CliError(f"no node answered within {args.timeout:g}s "
                       f"({len(m.nodes)} asked: {', '.join(n.address for n in m.nodes)})")
    from tools.commands.group_status import node_extras

    # lag, version, disk: one more METADATA round (with the status trailer), for both outputs
    extras = node_extras(args.peers, args.group, min(args.timeout, 1.0), key_file_of(args))
    if args.json:
        d = m.to_dict()
        blank = {"lag": None, "version": None, "store_bytes": None, "disk_usage_ratio": None,
                 "config_index": None, "member": None}
        for n in d["nodes"]:  # added keys only: the documented keys stay as they were
            n.update({**blank, **extras.get(n["id"], {})})
        print(json.dumps(d))
        return 0
    _print_table(m, extras)
    return 0


def _print_table(m, extras: dict[str, dict] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    def v(x: object) -> str:
        return "-" if x is None else str(x)

    t = Table(title=f"group {m.group}: leader {v(m.leader_id)}, term {v(m.term)}",
              title_justify="left")
    for col in ("id", "address", "role", "member", "term", "leader", "begin", "end", "committed", "lag",
                "disk", "version", "alive"):
        t.add_column(col, justify="right" if col in ("term", "begin", "end", "committed", "lag", "disk")
                     else "left", no_wrap=True)
    for n in m.nodes:
        role = v(n.role)
        if n.role == "LEADER":
            role = f"[bold green]{role}[/]"
        x = (extras or {}).get(n.id, {})
        disk = "-" if x.get("store_bytes") is None else f"{x['store_bytes'] / (1 << 20):.0f}MiB"
        if x.get("disk_usage_ratio") is not None:
            disk += f" ({x['disk_usage_ratio']:.0%})"
        member = v(x.get("member"))
        if x.get("config_index") is not None and x["config_index"] >= 0:
            member += f" @{x['config_index']}"  # the configuration entry that node counts
        t.add_row(n.id, n.address, role, member, v(n.term), v(n.leader), v(n.ledger_begin_index),
                  v(n.ledger_end_index), v(n.committed_index), v(x.get("lag")), disk,
                  v(x.get("version")), "yes" if n.alive else "[bold red]NO[/]")
    Console(width=max(132, Console().width)).print(t)
