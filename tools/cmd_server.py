"""Run one node in the foreground until SIGTERM/SIGINT (clean stop, exit 0).

Every option can also come from --config FILE (TOML or INI, same names with underscores or
dashes, in a [node] table/section); command-line flags win. Invalid options are all reported,
one line each, before anything starts.

Example:
  dledger server --id n0 --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913" \\
                 --store-dir /var/lib/dledger/n0
"""

from __future__ import annotations

import argparse
import sys

from node.config import ConfigError, add_node_arguments, build_config, cli_values, load_config_file
from tools.cli import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="TOML or INI file with the same option names")
    add_node_arguments(p)


def run(args: argparse.Namespace) -> int:
    from node.roles.supervisor import Supervisor, SupervisorError

    try:
        file_values = load_config_file(args.config_file) if args.config_file else {}
        cfg = build_config(file_values, cli_values(args))
    except ConfigError as e:
        for problem in e.problems:
            print(f"dledger server: invalid option: {problem}", file=sys.stderr)
        return 2
    try:
        return Supervisor(cfg, debug=getattr(args, "debug", False)).run()
    except SupervisorError as e:
        raise CliError(str(e)) from None
