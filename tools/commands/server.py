"""Run one node in the foreground until SIGTERM/SIGINT (clean stop, exit 0).

Every option can also come from --config FILE (TOML `.toml` or INI `.ini`, same names with
underscores or dashes, in a [node] table/section); command-line flags win. Sizes take units
(64MiB, 1GiB, 512KiB, or plain bytes). Invalid options are all reported, one line each, with
exit code 2, before anything starts; `dledger config check FILE` checks a file alone.

The data and index files default to DLedger's 1GiB and 160MiB (preallocated: a node reserves
about 1.2 GB of disk from its first entry); `dledger cluster` and the local groups of the tools
use 64MiB / 8MiB.

--print-config shows the effective configuration (defaults, the file and the flags merged, each
value marked with its source) as TOML that --config loads again, or as JSON, and exits.

Each node listens on its peers port (clients, pushes) and on port + 1 (elector): nodes on one
host need ports at least 2 apart.

Security: --keys-dir DIR makes both ports CurveZMQ (members and listed clients only, rights per
client key; `dledger keygen`, docs/operations.md "Security"). Without it the node runs in plain
mode, says so in its log, and binds a loopback address only, unless --insecure.

Example:
  dledger server --id n0 --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915" \\
                 --store-dir /var/lib/dledger/n0
  dledger server --config node.toml --heartbeat-interval-ms 50 --print-config
"""

from __future__ import annotations

import argparse
import sys

from node.config import (
    ConfigError,
    add_node_arguments,
    adopt_store_file_sizes,
    build_config_with_sources,
    cli_values,
    configure_logging,
    load_config_file,
    render_config,
)
from tools.cli import EXIT_USAGE, CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="TOML (.toml) or INI (.ini) file with the same option names (default: none)")
    p.add_argument("--print-config", nargs="?", const="toml", default=None, choices=("toml", "json"),
                   metavar="toml|json",
                   help="print the effective configuration and its sources, then exit "
                        "(format default: toml)")
    add_node_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        file_values = load_config_file(args.config_file) if args.config_file else {}
        cfg, sources = build_config_with_sources(file_values, cli_values(args),
                                                 check_paths=not args.print_config)
        cfg, sources, problems = adopt_store_file_sizes(cfg, sources)
        if problems:
            raise ConfigError(problems)
    except ConfigError as e:
        for problem in e.problems:
            print(f"dledger server: invalid option: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_config:
        print(render_config(cfg, sources, args.print_config))
        return 0
    debug = getattr(args, "debug", False)
    configure_logging(cfg.log_level, cfg.log_format, node=cfg.id, role="supervisor", debug=debug)
    from node.roles.supervisor import Supervisor, SupervisorError

    try:
        return Supervisor(cfg, debug=debug).run()
    except SupervisorError as e:
        raise CliError(str(e)) from None
