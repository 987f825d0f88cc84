"""Seed one node's store directory of a new group from a `dledger backup`.

The backup's store is copied into --store-dir (absent or empty), checked entry by entry (every
header and CRC), and its term/vote file set to the term after the backup's last one, with no
vote. Restore
every member of the new group from the same backup, then start them together with
`dledger server --store-dir DIR ...`: they hold the same committed log and elect a leader in the
next term (docs/operations.md "Backup and restore"). A node of a running group is not restored
this way: start it on an empty store and it catches up from the leader.

Prints one line: "restored entries F..L (last term T) into DIR"; --json prints backup.json's
object. Exit 0 on success, 1 when the backup is not usable (nothing is left in --store-dir), 2
on bad arguments.

Example:
  dledger restore --from /backups/dledger-2026-11-27 --store-dir /var/lib/dledger/n0
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from tools.cli import CliError
from tools.commands.metadata import EXIT_USAGE, add_json_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="backup_dir", required=True, metavar="DIR",
                   help="a directory `dledger backup` wrote (required)")
    p.add_argument("--store-dir", required=True, metavar="DIR",
                   help="the new node's store directory: absent or empty (required)")
    add_json_argument(p, "backup.json's object")


def run(args: argparse.Namespace) -> int:
    from tools.backup import BackupError, restore

    store = Path(args.store_dir)
    if store.exists() and not store.is_dir():
        raise CliError(f"--store-dir {store} exists and is not a directory", EXIT_USAGE)
    try:
        info = restore(Path(args.backup_dir), store)
    except BackupError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(asdict(info)))
    else:
        print(f"restored entries {info.first_index}..{info.last_index} (last term {info.last_term}) "
              f"into {store}")
    sys.stdout.flush()
    return 0
