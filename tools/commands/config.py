"""Check a node config file without starting anything: prints "ok" (exit 0) or one line per
problem (exit 1); a FILE that cannot be read is exit 2.

The file is read as `dledger server --config FILE` reads it: TOML (.toml) or INI (.ini, .cfg,
.conf), a [node] table/section or top-level keys, the option names of `dledger server --help`
with underscores or dashes, sizes with units (64MiB). Every value is checked for its type and
range, the peers string for collisions (an id or address given twice, a port on another
node's elector port), and store_dir/run_dir for being directories this user can write.
id, peers and store_dir may be left to the command line; --strict requires them in the file.
--json prints one object: {"ok", "problems": [lines], "missing": [options the command line
must give]}, with the same exit codes.

Examples:
  dledger config check node.toml
  dledger config check /etc/dledger/n0.ini --strict
"""

from __future__ import annotations

import argparse
import json

from tools.cli import EXIT_USAGE, CliError
from tools.commands.metadata import add_json_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_op", metavar="OP", required=True)
    check = sub.add_parser("check", help="check a config file", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("file", metavar="FILE", help="the config file (.toml or .ini)")
    check.add_argument("--strict", action="store_true",
                       help="id, peers and store_dir must be in the file (default: they may come "
                            "from the command line)")
    add_json_argument(check, 'one {"ok", "problems", "missing"} object')


def _verdict(args: argparse.Namespace, problems: list[str], missing: list[str]) -> int:
    if args.json:
        print(json.dumps({"ok": not problems, "problems": problems, "missing": missing}))
    elif problems:
        for problem in problems:
            print(problem)
    else:
        print("ok" + (f" ({', '.join(missing)} to be given on the command line)" if missing else ""))
    return 1 if problems else 0


def run(args: argparse.Namespace) -> int:
    from node.config import REQUIRED, ConfigError, build_config, load_config_file

    try:
        values = load_config_file(args.file)
    except ConfigError as e:
        unreadable = any(m.startswith("config: cannot read") for m in e.problems)
        if unreadable:
            raise CliError(e.problems[0], EXIT_USAGE) from None
        return _verdict(args, list(e.problems), [])
    given = {k.replace("-", "_") for k in values}
    placeholders: dict[str, str] = {}
    if not args.strict:
        # What the command line would add: a stand-in that never hides a problem of the file's.
        if "peers" not in given and "join" not in given:
            placeholders["peers"] = f"{values.get('id') or 'n0'}-127.0.0.1:20911"
        if "id" not in given and isinstance(values.get("peers"), str):
            placeholders["id"] = values["peers"].split(";")[0].partition("-")[0].strip()
        elif "id" not in given:
            placeholders["id"] = "n0"
        if "store_dir" not in given:
            placeholders["store_dir"] = "."
    try:
        build_config({**placeholders, **values}, {})
    except ConfigError as e:
        return _verdict(args, [f"{args.file}: {problem}" for problem in e.problems], [])
    return _verdict(args, [], [k for k in REQUIRED if k not in given
                               and not (k == "peers" and "join" in given)])
