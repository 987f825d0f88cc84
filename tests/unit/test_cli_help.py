"""Every option of every `dledger` subcommand explains itself: a help line, and its default
where it has one (docs/operations.md "Every option"). Walks the real parsers that `dledger COMMAND
--help` prints."""

from __future__ import annotations

import argparse

import pytest

from tools import cli


def _walk(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) for `parser` and every nested subcommand parser (`kv put`)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def _command_parsers():
    for name in cli.SUBCOMMANDS:
        top = cli.build_parser([name])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        child = sub.choices[name]
        if "_missing" in child._defaults:
            continue  # an optional dependency (pyspark) is not installed here
        yield from _walk(child, name)


PARSERS = list(_command_parsers())


def _has_default(action: argparse.Action) -> bool:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction
                  | argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
        return False
    return action.default not in (None, argparse.SUPPRESS, [])


@pytest.mark.parametrize("path, parser", PARSERS, ids=[p for p, _ in PARSERS])
def test_every_option_has_help_and_its_default(path, parser):
    missing, no_default = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(name)
            continue
        # Options that take a value say what happens when they are not given: the default
        # (argparse's %(default)s, or node.config's help line for server options) or "required".
        # A flag's default is being off.
        takes_value = action.nargs != 0
        if action.option_strings and takes_value and not action.required \
                and "default" not in action.help and "required" not in action.help:
            no_default.append(name)
        elif _has_default(action) and "default" not in action.help:
            no_default.append(name)
    assert not missing, f"dledger {path}: options without help: {missing}"
    assert not no_default, f"dledger {path}: options whose help does not give the default: {no_default}"


def test_every_subcommand_is_walked():
    walked = {p.split()[0] for p, _ in PARSERS}
    assert {"server", "cluster", "append", "get", "metadata", "transfer", "dump", "bench",
            "kv", "snapshot", "config", "chaos"} <= walked


def test_server_help_gives_units_and_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["server", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--data-file-size SIZE data segment file size, fixed once the store exists [bytes] (default: 1GiB)" in out
    assert "--heartbeat-interval-ms MS leader -> follower heartbeat period [ms] (default: 100)" in out
    assert "--log-format {text,json}" in out and "--print-config" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("dledger ") and out.split()[1][0].isdigit()


def test_operations_md_lists_every_server_option_with_its_default():
    """docs/operations.md "Every option" is the --help of `dledger server` for readers: the
    same options, the same defaults (it once said 200 ms heartbeats after the code said 100)."""
    from pathlib import Path

    from node.config import _DEFAULTS, _FIELDS, REQUIRED, SIZE_FIELDS, format_size

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    for name in _FIELDS:
        flag = name.replace("_", "-")
        assert flag in rows, f"docs/operations.md does not list --{flag}"
        d = getattr(_DEFAULTS, name)
        if name in REQUIRED:
            want = "—"
        elif name in SIZE_FIELDS:
            want = format_size(d)
        elif isinstance(d, bool):
            want = "true" if d else "false"
        else:
            want = str(d) if d != "" else "(none)"
        assert rows[flag] == want, f"--{flag}: docs/operations.md says {rows[flag]}, the code {want}"


@pytest.mark.parametrize("command", ["server", "cluster"])
def test_a_true_false_option_alone_means_true(command):
    """docs/operations.md writes `dledger cluster --insecure`: a BOOL option given alone is
    true, and the full form still parses (it was "expected one argument" before)."""
    parser = cli.build_parser([command])
    alone = parser.parse_args([command, "--insecure"])
    assert alone.insecure == "true"
    spelled = parser.parse_args([command, "--insecure", "false"])
    assert spelled.insecure == "false"
    assert parser.parse_args([command]).insecure is None
