"""The README's examples run against the group `dledger cluster` starts (the
README's Python snippet once hard-coded ports `dledger cluster` never uses, and a newcomer's
first script ended in a TIMEOUT traceback). The cluster picks free ports; its first line is the
peers string the README tells the reader to paste where it says `<peers>`. The dry parse of
every example is tests/unit/test_cli_docs_examples.py."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
from cluster import ROOT, wait_for

from tools import cli

pytestmark = pytest.mark.integration

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def _client_commands() -> list[list[str]]:
    """The README's shell lines that talk to the group (`--peers "<peers>"`), as argv."""
    out = []
    for block in re.findall(r"```\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.strip()
            if line.startswith(".venv/bin/dledger ") and '"<peers>"' in line:
                out.append(shlex.split(line, comments=True)[1:])
    return out


@pytest.fixture
def readme_cluster(tmp_path):
    """`dledger cluster --nodes 3 --state-machine kv` (both README groups in one: the KV store
    takes plain appends as entries it refuses to apply, the log keeps them); stopped by PID."""
    p = subprocess.Popen([sys.executable, "-m", "tools.cli", "cluster", "--nodes", "3",
                          "--state-machine", "kv"], cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    try:
        peers = p.stdout.readline().strip()
        assert re.fullmatch(r"n0-127\.0\.0\.1:\d+;n1-127\.0\.0\.1:\d+;n2-127\.0\.0\.1:\d+", peers), peers
        second = p.stdout.readline().strip()  # secure by default: the admin client's key
        assert second.startswith("key-file: "), second
        key_file = second.removeprefix("key-file: ")
        from ipc.client import DLedgerClient

        with DLedgerClient(peers, timeout=2.0, key_file=key_file) as c:
            wait_for(lambda: c.metadata().leader_id, 60, "a leader")
        yield peers, key_file
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_readme_examples_run_against_dledger_cluster(readme_cluster, capsys, monkeypatch):
    peers, key_file = readme_cluster
    snippets = _python_snippets()
    assert len(snippets) >= 2 and all("<peers>" in s for s in snippets), \
        "the README's snippets must take the peers string `dledger cluster` prints"
    printed = []
    for code in snippets:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = code.replace("<peers>", peers).replace("<key-file>", key_file)
            exec(compile(code, "README.md", "exec"), {})  # noqa: S102
        printed.append(out.getvalue())
    assert any("b'w'" in p for p in printed), printed  # the KV snippet: the value after the cas
    # the log snippet: the body read back, then the log followed up to that entry
    assert any(p.startswith("b'body'\n") and p.strip().endswith("NORMAL b'body'") for p in printed), printed

    monkeypatch.setenv("DLEDGER_KEY_FILE", key_file)  # the README's `export DLEDGER_KEY_FILE=...`
    assert 'export DLEDGER_KEY_FILE="<key-file>"' in README
    commands = _client_commands()
    assert {c[0] for c in commands} >= {"metadata", "append", "get", "kv"}
    for argv in commands:
        argv = [peers if a == "<peers>" else a for a in argv]
        assert cli.main(argv) == 0, (argv, capsys.readouterr().err)
    out = capsys.readouterr().out
    assert "hello" in out  # `kv get greeting` (and `get` shows the appended hello)
