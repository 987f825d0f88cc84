"""PySpark: cross-replica check of committed prefixes; exit 1 on any divergence, CRC failure or gap.

Reads every --store-dir (one per node) without bodies. Per node: begin/end/committed index,
entries, gaps, CRC failures, structural errors. Over the range all nodes have committed, it
compares per-range digests and, only where they differ, rows, and names the first divergent
index. Exit 0 when all is well, 1 on any divergence, CRC failure, gap or error, 2 when a
directory is not a store.

Examples:
  dledger verify --store-dir /data/n0 --store-dir /data/n1 --store-dir /data/n2
  dledger verify --store-dir /shared/n0 --store-dir /shared/n1 --master spark://host:7077 --json

Every executor must see the directories at the same paths.
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.cli import CliError, positive_int
from tools.commands.dump import open_reader


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store-dir", action="append", required=True, metavar="DIR",
                        help="a node's store directory; repeat once per node (required)")
    parser.add_argument("--master", default="local[*]", metavar="URL",
                        help="Spark master URL, passed through (default: local[*])")
    parser.add_argument("--json", action="store_true", help="print one JSON summary object (default: a table)")
    parser.add_argument("--no-ship", dest="ship", action="store_false",
                        help="do not ship our packages to executors, they are installed there (default: ship)")
    parser.add_argument("--partition-entries", type=positive_int, metavar="P",
                        help="entries per compared range (default: from 128 MiB partitions)")


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def render(report: object, out: object = None) -> None:
    """The human-readable report: a table per node, then the verdict lines."""
    from rich.console import Console
    from rich.table import Table

    from tools.pipeline.verify import VerifyReport

    assert isinstance(report, VerifyReport)
    console = Console(file=out or sys.stdout, highlight=False, soft_wrap=True)
    table = Table(title="dledger verify")
    for col in ("node", "begin", "end", "committed", "entries", "gaps", "crc failures",
                "errors", "status"):
        table.add_column(col, justify="left" if col in ("node", "status") else "right")
    for n in report.nodes:
        table.add_row(n.node, str(n.begin_index), str(n.end_index), str(n.committed_index),
                      str(n.count), str(n.gaps), str(n.crc_failures), str(n.errors),
                      "ok" if n.ok else "FAIL")
    console.print(table)
    for n in report.nodes:
        if n.first_gap_index is not None:
            console.print(f"{n.node}: gap at index {n.first_gap_index} "
                          f"({_entries(n.gaps)} missing)")
        if n.first_crc_failure_index is not None:
            console.print(f"{n.node}: CRC failure at index {n.first_crc_failure_index} "
                          f"({_entries(n.crc_failures)})")
        if n.first_error_index is not None:
            console.print(f"{n.node}: damaged entry at index {n.first_error_index} "
                          f"({_entries(n.errors)})")
        for p in n.problems:
            console.print(f"{n.node}: {p}")
    if report.common_from is None:
        console.print("no index range committed on every node: nothing to compare")
    else:
        console.print(f"common committed range [{report.common_from}, {report.common_to}]: "
                      f"{report.ranges_compared} range(s) of {report.partition_entries} "
                      f"entries compared, {report.ranges_diverged} differ")
    if report.first_divergent_index is not None:
        console.print(f"first divergent index: {report.first_divergent_index}")
        for node, held in report.divergent_entries.items():
            console.print(f"  {node}: {held if held is not None else 'missing'}")
    console.print("OK" if report.ok else "FAILED")


def run(args: argparse.Namespace) -> int:
    if args.partition_entries is not None and args.partition_entries < 1:
        raise CliError("--partition-entries must be >= 1", 2)
    for d in args.store_dir:  # fail fast, before a JVM starts
        with open_reader(d):
            pass
    from tools.pipeline.session import spark_session
    from tools.pipeline.verify import verify_stores

    with spark_session(args.master, ship=args.ship, app_name="dledger-verify") as spark:
        report = verify_stores(spark, args.store_dir,
                               partition_entries_option=args.partition_entries)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        render(report)
    return 0 if report.ok else 1
