"""PySpark: export a node's committed entries to Parquet.

Reads DIR with the `dledger` data source (committed entries only: the uncommitted tail may
still be truncated) and writes Parquet with the columns node, index, term, pos, size, type,
body_crc, crc_ok, error, body. Refuses an existing --out unless --overwrite. Prints the number
of rows written (--json: {"rows", "out"}).

Examples:
  dledger export --store-dir /data/n0 --out /tmp/n0.parquet
  dledger export --store-dir /shared/n0 --out hdfs:///logs/n0 --master spark://host:7077

Every executor must see DIR at the same path (a shared or replicated mount).
"""

from __future__ import annotations

import argparse
import json

from tools.cli import CliError
from tools.commands.dump import open_reader
from tools.commands.metadata import add_json_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store-dir", required=True, metavar="DIR", help="the node's store directory (required)")
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
    with open_reader(args.store_dir):
        pass
    from tools.pipeline.export import export_committed, output_exists

    if output_exists(args.out) and not args.overwrite:
        raise CliError(f"{args.out} exists (use --overwrite to replace it)", 2)
    from tools.pipeline.session import spark_session

    with spark_session(args.master, ship=args.ship, app_name="dledger-export") as spark:
        n = export_committed(spark, args.store_dir, args.out, overwrite=args.overwrite,
                             node=args.node)
    print(json.dumps({"rows": n, "out": args.out}) if args.json else f"{n} rows written to {args.out}")
    return 0
