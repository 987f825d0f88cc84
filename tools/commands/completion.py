"""Print a shell completion script for `dledger` (bash or zsh), generated from the same
argparse parsers `dledger COMMAND --help` prints, by shtab: every command, subcommand
(`kv put`, `config check`) and option completes, and a new option completes once it exists.

Install it once per shell:
  bash: dledger completion bash > ~/.local/share/bash-completion/completions/dledger
  zsh:  dledger completion zsh > "${fpath[1]}/_dledger"   (then restart zsh)

Example:
  dledger completion bash > /tmp/dledger.bash
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh (required)")


def run(args: argparse.Namespace) -> int:
    import shtab

    from tools.cli import build_parser

    # Every subcommand's real parser (a plain `dledger ...` builds only the chosen one).
    print(shtab.complete(build_parser(full=True), shell=args.shell))
    return 0
