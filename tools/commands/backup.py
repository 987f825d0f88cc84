"""Back up a group's committed log over the network, from any member, into a directory.

The backup holds every committed entry from the lowest log begin of the members to the leader's
committed index when it starts (a committed prefix: a consistent state), as a store directory
(OUT/store: `dledger dump --store-dir OUT/store` reads it) and OUT/backup.json saying what it
holds. `dledger restore` seeds the nodes of a new group from it (docs/operations.md "Backup and
restore"). A group with a state machine whose log no longer begins at its first entry cannot be
backed up this way (its state is in a snapshot): the command says so and exits 1.

Prints one line: "backup of group G: entries F..L (N entries, last term T) in OUT"; --json
prints backup.json's object. Exit 0 on success, 1 on failure (nothing is left in OUT then), 2
on bad arguments.

Example:
  dledger backup --peers "$PEERS" --out /backups/dledger-2026-11-27
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from tools.cli import CliError, size_arg
from tools.commands.metadata import (
    EXIT_USAGE,
    add_client_arguments,
    add_json_argument,
    cli_error,
    open_client,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from node.config import NodeConfig

    add_client_arguments(p, timeout=10.0)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the backup directory: absent or empty (required)")
    p.add_argument("--data-file-size", type=size_arg, default=NodeConfig.data_file_size, metavar="SIZE",
                   help="data file size of the backup's store, and so of the restored nodes' stores "
                        "(default: the server's, 1GiB; files are sparse)")
    p.add_argument("--index-file-size", type=size_arg, default=NodeConfig.index_file_size, metavar="SIZE",
                   help="index file size of the backup's store (default: the server's, 160MiB)")
    add_json_argument(p, "backup.json's object")


def run(args: argparse.Namespace) -> int:
    from ipc.client import DLedgerError
    from tools.backup import BackupError, backup

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a directory", EXIT_USAGE)
    with open_client(args) as c:
        try:
            info = backup(c, out, args.data_file_size, args.index_file_size)
        except BackupError as e:
            raise CliError(str(e)) from None
        except DLedgerError as e:
            raise cli_error(e) from None
    if args.json:
        print(json.dumps(asdict(info)))
    else:
        print(f"backup of group {info.group}: entries {info.first_index}..{info.last_index} "
              f"({info.entries} entries, last term {info.last_term}) in {out}")
    sys.stdout.flush()
    return 0
