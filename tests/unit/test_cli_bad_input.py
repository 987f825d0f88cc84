"""Bad input is one line and the right exit code: 2 for usage, 1 for a run-time failure; never
a traceback, an `[Errno N]` or a Python repr (docs/contracts.md C23). Every case goes through the real
entry point, `tools.cli.main`, in this process, and fails before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.wiring.ports import free_port_pairs
from tools import cli

GOOD = "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915"
COLLIDING = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"  # the old --help example
COLLIDING2 = "n0-127.0.0.1:20911;n1-127.0.0.1:20912"
DUP_ID = "n0-127.0.0.1:20911;n0-127.0.0.1:20913"
DUP_ADDR = "n0-127.0.0.1:20911;n1-127.0.0.1:20911"
SERVER = ["server", "--id", "n0", "--peers", GOOD]


def _files(tmp: Path) -> dict[str, str]:
    """Config files and paths the cases name ({name} in an argument is replaced by its path)."""
    made = {
        "peers_list.toml": '[node]\nid = "n0"\npeers = ["n0-127.0.0.1:20911"]\n',
        "node.yaml": "node:\n  id: n0\n  peers: n0-127.0.0.1:20911\n",
        "hb_text.toml": 'heartbeat_interval_ms = "fast"\n',
        "size_neg.toml": "data_file_size = -1\n",
        "ratio.ini": "[node]\ndisk_full_ratio = 2\n",
        "bool.ini": "[node]\nenable_batch_push = maybe\n",
        "unknown.toml": "[node]\nheartbeat_ms = 10\n",
        "broken.toml": "[node\n",
        "float_int.toml": "max_heartbeat_leak = 2.5\n",
        "table.toml": "[node]\ngroup = { a = 1 }\n",
        "a_file": "x",
    }
    for name, text in made.items():
        (tmp / name).write_text(text)
    (tmp / "dir.toml").mkdir()
    paths = {name: str(tmp / name) for name in [*made, "dir.toml"]}
    paths["store"] = str(tmp / "store")
    return paths


# (argv, exit code, a piece of the one line)
CASES = [
    # the list
    (["bench", "--local", "3", "--duration", "-1"], 2, "--duration: must be > 0"),
    (["bench", "--local", "0"], 2, "--local: must be >= 1"),
    ([*SERVER, "--store-dir", "/etc/passwd"], 2, "/etc/passwd exists and is not a directory"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{peers_list.toml}"], 2,
     "peers: expected a string, got a list"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{node.yaml}"], 2, "unsupported format .yaml"),
    (["get", "--peers", GOOD, "--index", "99999999999999999999999"], 2, "--index: must be between 0"),
    (["server", "--bogus"], 2, "dledger server: error: unrecognized arguments: --bogus"),
    # a duration beyond any wait: the valid range, not "timestamp out of range for platform time_t"
    (["append", "--peers", GOOD, "--timeout", "1e308", "x"], 2,
     "--timeout: must be > 0 and <= 31536000 seconds, got 1e308"),
    (["health", "--peers", GOOD, "--wait", "1e12"], 2, "--wait: must be >= 0 and <= 31536000 seconds"),
    # a body no node accepts: refused before thousands of doomed requests
    (["bench", "--local", "3", "--size", "5MiB"], 2,
     "--size 5242880 bytes is over the largest body a node accepts (4194304 bytes"),
    (["bench", "--local", "3", "--size", "5MiB", "--server-arg=--max-body-size=4MiB"], 2,
     "over the largest body a node accepts (4194304 bytes"),
    # negative / zero counts, durations, sizes
    (["bench", "--local", "3", "--duration", "0"], 2, "--duration: must be > 0"),
    (["bench", "--local", "3", "--duration", "nan"], 2, "--duration: expected a finite number"),
    (["bench", "--local", "3", "--count", "0"], 2, "--count: must be >= 1"),
    (["bench", "--local", "3", "--concurrency", "-4"], 2, "--concurrency: must be >= 1"),
    (["bench", "--local", "3", "--batch", "0"], 2, "--batch: must be >= 1"),
    (["bench", "--local", "3", "--size", "-1"], 2, "--size: expected a size"),
    (["bench", "--local", "3", "--size", "12XB"], 2, "--size: expected a size"),
    (["bench", "--local", "3", "--warmup", "-1"], 2, "--warmup: must be >= 0"),
    (["bench", "--local", "3", "--timeout", "0"], 2, "--timeout: must be > 0"),
    (["bench", "--local", "3", "--max-error-rate", "1.5"], 2, "--max-error-rate: must be between 0 and 1"),
    (["bench", "--local", "3", "--kv", "--keys", "0"], 2, "--keys: must be >= 1"),
    (["bench", "--local", "3", "--kv", "--batch", "2"], 2, "--batch must be 1"),
    (["bench", "--peers", COLLIDING], 2, "n1's port 20912 is n0's elector port"),
    (["get", "--peers", GOOD, "--index", "-1"], 2, "--index: must be between 0"),
    (["get", "--peers", GOOD, "--index", "x"], 2, "--index: expected an integer"),
    (["get", "--peers", GOOD, "--index", "0", "--count", "0"], 2, "--count: must be >= 1"),
    (["append", "--peers", GOOD, "--batch", "0", "x"], 2, "--batch: must be >= 1"),
    (["metadata", "--peers", GOOD, "--timeout", "-3"], 2, "--timeout: must be > 0"),
    (["dump", "--store-dir", "{store}", "--from", "-1"], 2, "--from: must be between 0"),
    (["dump", "--store-dir", "{store}", "--preview", "-1"], 2, "--preview: must be >= 0"),
    (["kv", "scan", "--peers", GOOD, "--limit", "0"], 2, "--limit: must be >= 1"),
    (["cluster", "--nodes", "0"], 2, "--nodes: must be between 1 and 15"),
    (["cluster", "--nodes", "16"], 2, "--nodes: must be between 1 and 15"),
    (["cluster", "--base-port", "70000"], 2, "--base-port: must be between 1 and 65534"),
    (["cluster", "--base-port", "65530", "--nodes", "3"], 2, "leaves no room for 3 nodes"),
    (["cluster", "--heartbeat-interval-ms", "-5"], 2, "heartbeat_interval_ms=-5: must be >= 10"),
    ([*SERVER, "--store-dir", "{store}", "--data-file-size", "0"], 2, "data_file_size: must be >= 4096"),
    ([*SERVER, "--store-dir", "{store}", "--data-file-size", "1.5KiB"], 2, "data_file_size: must be >= 4096"),
    ([*SERVER, "--store-dir", "{store}", "--max-pending-requests", "0"], 2, "max_pending_requests: must be > 0"),
    ([*SERVER, "--store-dir", "{store}", "--stop-grace-ms", "soon"], 2, 'stop_grace_ms: expected an integer, got "soon"'),
    ([*SERVER, "--store-dir", "{store}", "--log-format", "xml"], 2, 'log_format: must be one of text, json (got "xml")'),
    # peers strings: collisions name both nodes
    (["server", "--id", "n0", "--peers", COLLIDING2, "--store-dir", "{store}"], 2,
     "n1's port 20912 is n0's elector port"),
    (["server", "--id", "n0", "--peers", DUP_ID, "--store-dir", "{store}"], 2,
     "id n0 is given twice (n0-127.0.0.1:20911 and n0-127.0.0.1:20913)"),
    (["append", "--peers", DUP_ADDR, "x"], 2, "n0 and n1 have the same address"),
    (["metadata", "--peers", "n0-127.0.0.1"], 2, "missing HOST:PORT"),
    (["kv", "get", "--peers", COLLIDING, "k"], 2, "n0's elector port"),
    (["transfer", "--peers", DUP_ID, "--to", "n0"], 2, "id n0 is given twice"),
    (["snapshot", "--peers", "n0-h:0"], 2, "outside 1..65534"),
    # files that are directories, or are not directories
    ([*SERVER, "--store-dir", "{a_file}/sub"], 2, "is not a directory"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{dir.toml}"], 2, "it is a directory, not a file"),
    ([*SERVER, "--store-dir", "{store}", "--config", "/nonexistent/n0.toml"], 2, "No such file or directory"),
    ([*SERVER, "--store-dir", "{store}", "--run-dir", "{a_file}"], 2, "run_dir: "),
    (["dump", "--store-dir", "{a_file}"], 2, "not a directory"),
    # wrong config types
    ([*SERVER, "--store-dir", "{store}", "--config", "{hb_text.toml}"], 2,
     'heartbeat_interval_ms: expected an integer, got "fast"'),
    ([*SERVER, "--store-dir", "{store}", "--config", "{size_neg.toml}"], 2, "data_file_size: must be >= 4096"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{ratio.ini}"], 2, "disk_full_ratio: must be in (0, 1]"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{bool.ini}"], 2,
     'enable_batch_push: expected true or false, got "maybe"'),
    ([*SERVER, "--store-dir", "{store}", "--config", "{unknown.toml}"], 2, "heartbeat_ms: unknown option"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{broken.toml}"], 2, "not valid TOML"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{float_int.toml}"], 2,
     "max_heartbeat_leak: expected an integer, got 2.5"),
    ([*SERVER, "--store-dir", "{store}", "--config", "{table.toml}"], 2, "group: expected a string, got a table"),
    # config check: a bad file is exit 1 (its verdict), an unreadable one exit 2
    (["config", "check", "{table.toml}"], 1, "group: expected a string, got a table"),
    (["config", "check", "{node.yaml}"], 1, "unsupported format .yaml"),
    (["config", "check", "{dir.toml}"], 2, "it is a directory"),
    (["config", "check", "/nonexistent.toml"], 2, "No such file or directory"),
    # usage errors name the subcommand that was used
    (["kv", "put", "--peers", GOOD, "k"], 2, "dledger kv put: error: the following arguments are required: VALUE"),
    (["transfer", "--peers", GOOD], 2, "dledger transfer: error: the following arguments are required: --to"),
    (["nosuch"], 2, "dledger: error: argument COMMAND: invalid choice"),
    ([], 2, "dledger: error: the following arguments are required: COMMAND"),
]

REPR = re.compile(r"<[\w.]+ object at 0x|NoneType|Traceback|\[Errno|\(\[|\{'")


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, code, piece", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line(argv, code, piece, tmp_path, capsys):
    paths = _files(tmp_path)
    for name, path in paths.items():
        argv = [a.replace("{" + name + "}", path) for a in argv]
    rc, out, err = _run(argv, capsys)
    text = err if code == 2 or not out else out + err
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert rc == code, (rc, text)
    assert len(lines) == 1, text
    assert piece in lines[0], lines[0]
    assert not REPR.search(text), text
    assert not (tmp_path / "store").exists(), "nothing may start on bad input"


def test_runtime_failure_is_exit_1(capsys):
    """Good arguments, nobody listening: a run-time failure, one line, exit 1."""
    port = free_port_pairs(1)[0]
    rc, _out, err = _run(["metadata", "--peers", f"n0-127.0.0.1:{port}", "--timeout", "0.3"], capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "no node answered" in err


def test_os_errors_lose_their_errno(capsys):
    assert cli.one_line(FileExistsError(17, "File exists", "/etc/passwd")) == "/etc/passwd: File exists"
    assert cli.one_line(ValueError("two\nlines")) == "two lines"
