"""Every `dledger ...` example in README.md, docs/*.md and the subcommands' --help parses with
the real parser (the peers string in the old --help examples put one node's data
port on another's elector port, and nothing noticed). A dry parse: argparse, the peers checks,
and for `server` the whole configuration check; nothing is started. The README's Python snippets
run against a real `dledger cluster` in tests/integration/test_docs_examples.py."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from node.config import build_config, cli_values, load_config_file
from tools import cli

ROOT = Path(__file__).resolve().parents[2]
PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915"
# What the docs write where a reader pastes the peers string `dledger cluster` printed.
PLACEHOLDERS = ("<the printed peers string>", "<peers>", "$NEW_PEERS", "$PEERS", "${PEERS}", "$P")
FENCE = re.compile(r"^```(\w*)\s*$")
PROMPT = re.compile(r"^(\$ )?((?:[A-Z_]+=\S+ )*)(\.venv/bin/)?dledger(?= |$)")


def _commands(lines: list[str]) -> list[str]:
    """`dledger ...` command lines (continuations joined, prompts and env prefixes dropped) in
    a block of shell text: lines indented at most 2 spaces (deeper ones are program output)."""
    out: list[str] = []
    joined: list[str] = []
    for raw in lines:
        if len(raw) - len(raw.lstrip()) > 2 and not joined:
            continue
        line = raw.strip()
        joined.append(line[:-1] if line.endswith("\\") else line)
        if line.endswith("\\"):
            continue
        text, joined = " ".join(joined), []
        for part in _split_pipes(text):
            m = PROMPT.match(part.strip())
            if m:
                out.append("dledger" + part.strip()[m.end():])
    return out


def _split_pipes(text: str) -> list[str]:
    """`seq 1000 | dledger append ...` -> its pieces (a `|` inside quotes is not a pipe)."""
    parts, cur, quote = [], "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "|":
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return [*parts, cur]


def _markdown_examples() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        block: list[str] | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            m = FENCE.match(line)
            if m and block is None:
                block = [] if m.group(1) in ("", "sh", "bash", "shell", "console") else None
                if block is None:  # a python/toml/json block: skip to its end
                    block = ["<skip>"]
                continue
            if m and block is not None:
                if block[:1] != ["<skip>"]:
                    found += [(path.name, c) for c in _commands(block)]
                block = None
                continue
            if block is not None:
                block.append(line)
    return found


def _help_examples() -> list[tuple[str, str]]:
    """The `Example:`/`Examples:` part of every subcommand's docstring (its --help)."""
    found = []
    for name, modname in cli.SUBCOMMANDS.items():
        try:
            doc = importlib.import_module(modname).__doc__ or ""
        except ModuleNotFoundError:
            continue
        lines = doc.splitlines()
        starts = [i for i, ln in enumerate(lines) if re.fullmatch(r"Examples?:", ln.strip())]
        if starts:
            found += [(f"dledger {name} --help", c) for c in _commands(lines[starts[0] + 1:])]
    return found


def _synopsis(command: str) -> bool:
    """A line that shows a command's shape, not a command: `[--opt X]`, `...`."""
    return " [" in command or "..." in command.split()


EXAMPLES = [(src, cmd) for src, cmd in _markdown_examples() + _help_examples() if not _synopsis(cmd)]


def _argv(command: str) -> list[str]:
    for p in PLACEHOLDERS:
        command = command.replace(p, PEERS)
    argv = shlex.split(command, comments=True)[1:]
    for i, token in enumerate(argv):  # shell redirections and job control end the command
        if token in ("&", "&&", ";") or re.match(r"^\d?[<>]", token):
            return argv[:i]
    return argv


def test_the_examples_are_found():
    sources = {src for src, _ in EXAMPLES}
    assert len(EXAMPLES) >= 60, EXAMPLES
    assert {"README.md", "operations.md", "client.md", "chaos.md", "dledger server --help",
            "dledger get --help", "dledger cluster --help", "dledger config --help"} <= sources


@pytest.mark.parametrize("source, command", EXAMPLES, ids=[f"{s}: {c[:70]}" for s, c in EXAMPLES])
def test_example_parses(source, command, tmp_path, capsys):
    argv = _argv(command)
    parser = cli.build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{source}: `{command}` does not parse: {capsys.readouterr().err.strip()}")
    if argv[0] == "server":  # the configuration a node would start with
        file_values = {}
        if args.config_file:
            pytest.skip("a config file of the reader's own")
        build_config(file_values, cli_values(args), check_paths=False)


def test_no_peers_example_collides():
    """The peers strings written anywhere in the docs pass the same check `--peers` gets."""
    from node.wiring.ports import peers_problems

    text = "\n".join(p.read_text(encoding="utf-8") for p in
                     [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tools" / "commands").glob("*.py"),
                      ROOT / "tools" / "cli.py"])
    strings = set(re.findall(r"n0-[\w.\[\]:]+:\d+(?:;n\d-[\w.\[\]:]+:\d+)+", text))
    assert len(strings) >= 3
    for s in strings:
        assert not peers_problems(s), (s, peers_problems(s))


def test_the_toml_example_in_operations_md_loads(tmp_path):
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block
    f = tmp_path / "node.toml"
    f.write_text(block.group(1))
    build_config(load_config_file(f), {}, check_paths=False)


def test_parser_class_is_used_for_every_subcommand():
    """One-line usage errors everywhere: every subparser is a cli.Parser."""
    for name in cli.SUBCOMMANDS:
        top = cli.build_parser([name])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        assert isinstance(sub.choices[name], cli.Parser)
