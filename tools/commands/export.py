"""PySpark: export a group's committed entries to Parquet, from a node's store files or over
the network.

`--store-dir DIR` reads DIR with the `dledger` data source (committed entries only: the
uncommitted tail may still be truncated) and writes Parquet with the columns node, index, term,
pos, size, type, body_crc, crc_ok, error, body. `--peers PEERS` reads the group's committed log
from its running members instead (columns node, index, term, pos, size, type, body; `--from`/
`--to` bound it). Refuses an existing --out unless --overwrite. Prints the number of rows
written (--json: {"rows", "out"}).

Examples:
  dledger export --store-dir /data/n0 --out /tmp/n0.parquet
  dledger export --store-dir /shared/n0 --out hdfs:///logs/n0 --master spark://host:7077
  dledger export --peers "n0-10.0.0.1:20911;n1-10.0.0.2:20911" --out /tmp/log.parquet

With --store-dir every executor must see DIR at the same path (a shared or replicated mount);
with --peers every executor must reach the members.
"""

from __future__ import annotations

import argparse
import json

from tools.cli import CliError, key_file_of
from tools.commands.dump import open_reader
from tools.commands.metadata import add_json_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--store-dir", metavar="DIR", help="the node's store directory (required: this or --peers)")
    src.add_argument("--peers", metavar="PEERS", help="the group's members (id-host:port;...): read over the network (required: this or --store-dir)")
    parser.add_argument("--group", default="default", help="group name, with --peers (default: default)")
    parser.add_argument("--key-file", default=None, metavar="FILE",
                        help="with --peers: this client's CurveZMQ secret key for a secure group (the "
                             "members' ID.key files beside it; default: $DLEDGER_KEY_FILE; none: plain)")
    parser.add_argument("--from", dest="from_index", type=int, metavar="N",
                        help="first index, with --peers (default: the group's begin)")
    parser.add_argument("--to", dest="to_index", type=int, metavar="N",
                        help="last index, with --peers (default: the committed end when the job starts)")
    parser.add_argument("--out", required=True, metavar="PATH", help="Parquet output path, local or URL (required)")
    parser.add_argument("--master", default="local[*]", metavar="URL",
                        help="Spark master URL, passed through (default: local[*])")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out (default: refuse)")
    parser.add_argument("--no-ship", dest="ship", action="store_false",
                        help="do not ship our packages to executors, they are installed there (default: ship)")
    parser.add_argument("--node", metavar="NAME",
                        help="value of the node column (default: the directory name)")
    add_json_argument(parser, 'one {"rows", "out"} object')


def run(args: argparse.Namespace) -> int:
    # Cheap checks first: a bad directory or an existing output must not cost a JVM start.
    if args.store_dir is not None:
        with open_reader(args.store_dir):
            pass
    else:
        from ipc.sockets import PeersError, parse_peers

        try:
            parse_peers(args.peers)
        except (PeersError, ValueError) as e:
            raise CliError(f"--peers: {e}", 2) from None
        for name in ("from_index", "to_index"):
            if getattr(args, name) is not None and getattr(args, name) < 0:
                raise CliError(f"--{name.split('_')[0]} must be >= 0", 2)
        key_file = key_file_of(args)
        _check_group(args.peers, args.group, key_file)
    from tools.pipeline.export import export_committed, export_network, output_exists

    if output_exists(args.out) and not args.overwrite:
        raise CliError(f"{args.out} exists (use --overwrite to replace it)", 2)
    from tools.pipeline.session import spark_session

    with spark_session(args.master, ship=args.ship, app_name="dledger-export") as spark:
        if args.store_dir is not None:
            n = export_committed(spark, args.store_dir, args.out, overwrite=args.overwrite,
                                 node=args.node)
        else:
            n = export_network(spark, args.peers, args.out, group=args.group, overwrite=args.overwrite,
                               from_index=args.from_index, to_index=args.to_index, key_file=key_file)
    print(json.dumps({"rows": n, "out": args.out}) if args.json else f"{n} rows written to {args.out}")
    return 0


def _check_group(peers: str, group: str, key_file: str | None) -> None:
    """One METADATA round before Spark starts: an unreachable group is one line, not a JVM
    start and a Python traceback from the planner."""
    from ipc.client import DLedgerClient, DLedgerError
    from tools.commands.metadata import cli_error
    from tools.pipeline.netclient import group_range

    try:
        with DLedgerClient(peers, group=group, sessions=False, key_file=key_file) as c:
            group_range(c)
    except DLedgerError as e:
        raise cli_error(e, f"group {group!r} at {peers}: ") from None
