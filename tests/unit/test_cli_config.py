"""`dledger server --print-config`, `dledger config check`, sizes with units and the log line
formats (docs/operations.md "Config file"), through the real entry point and the real node.config."""

from __future__ import annotations

import json
import logging
import re

import pytest

from node.config import (
    LOCAL_DATA_FILE_SIZE,
    ConfigError,
    build_config,
    configure_logging,
    format_size,
    load_config_file,
    parse_size,
)
from tools import cli

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915"


@pytest.mark.parametrize("text, want", [
    ("64MiB", 64 << 20), ("1GiB", 1 << 30), ("512KiB", 512 << 10), ("4096", 4096), ("1_048_576", 1 << 20),
    ("64 mib", 64 << 20), ("1.5GiB", 3 << 29), ("2M", 2 << 20), ("1MB", 1_000_000), ("8k", 8192),
    (4096, 4096),
])
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "-1", "12XB", "1.3B", "MiB", "1 2"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_sizes_mean_the_same_on_the_command_line_and_in_a_file(tmp_path):
    f = tmp_path / "n.toml"
    f.write_text('data_file_size = "64MiB"\nindex_file_size = 8388608\n')
    a = build_config(load_config_file(f), {"id": "n0", "peers": PEERS, "store_dir": str(tmp_path)})
    b = build_config({}, {"id": "n0", "peers": PEERS, "store_dir": str(tmp_path),
                          "data_file_size": "64MiB", "index_file_size": "8MiB"})
    assert a.data_file_size == b.data_file_size == LOCAL_DATA_FILE_SIZE
    assert a.index_file_size == b.index_file_size == 8 << 20
    assert format_size(a.data_file_size) == "64MiB" and format_size(4097) == "4097"


def test_print_config_merges_and_loads_again(tmp_path, capsys):
    f = tmp_path / "node.toml"
    f.write_text(f'[node]\nid = "n0"\npeers = "{PEERS}"\nflush_mode = "sync"\nheartbeat_interval_ms = 80\n')
    argv = ["server", "--config", str(f), "--store-dir", str(tmp_path / "s"),
            "--heartbeat-interval-ms", "50", "--data-file-size", "64MiB", "--print-config"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r'^heartbeat_interval_ms = 50 +# flag$', out, re.M), out
    assert re.search(r'^flush_mode = "sync" +# file$', out, re.M), out
    assert re.search(r'^data_file_size = "64MiB" +# flag$', out, re.M), out
    assert re.search(r'^index_file_size = "160MiB" +# default$', out, re.M), out
    assert not (tmp_path / "s").exists()  # nothing started, nothing made
    again = tmp_path / "printed.toml"
    again.write_text(out)
    cfg = build_config(load_config_file(again), {})
    assert (cfg.heartbeat_interval_ms, cfg.flush_mode, cfg.data_file_size) == (50, "sync", 64 << 20)

    assert cli.main([*argv[:-1], "--print-config", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"]["heartbeat_interval_ms"] == 50 and doc["source"]["heartbeat_interval_ms"] == "flag"
    assert doc["source"]["flush_mode"] == "file" and doc["source"]["max_sessions"] == "default"


def test_config_check(tmp_path, capsys):
    good = tmp_path / "good.ini"
    good.write_text(f"[node]\nid = n1\npeers = {PEERS}\nflush-mode = sync\ndata-file-size = 1GiB\n")
    assert cli.main(["config", "check", str(good)]) == 0
    assert capsys.readouterr().out.strip() == "ok (store_dir to be given on the command line)"
    assert cli.main(["config", "check", str(good), "--strict"]) == 1
    assert capsys.readouterr().out.strip() == f"{good}: store_dir: required"

    bad = tmp_path / "bad.toml"
    bad.write_text('[node]\npeers = "n0-127.0.0.1:20911;n1-127.0.0.1:20912"\nmax_wait_ack_ms = 0\n'
                   'flush_mode = "fast"\n')
    assert cli.main(["config", "check", str(bad)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3, lines
    assert any("n1's port 20912 is n0's elector port" in ln for ln in lines)
    assert any("max_wait_ack_ms: must be > 0" in ln for ln in lines)
    assert any('flush_mode: must be one of async, sync (got "fast")' in ln for ln in lines)


def test_config_problems_are_all_reported_at_once():
    with pytest.raises(ConfigError) as e:
        build_config({"peers": ["x"], "stop_grace_ms": "soon"},
                     {"id": "n0", "store_dir": "/tmp/x", "flush_mode": "fast"}, check_paths=False)
    problems = e.value.problems
    assert "peers: expected a string, got a list" in problems
    assert 'stop_grace_ms: expected an integer, got "soon"' in problems
    assert any(p.startswith("flush_mode: must be one of") for p in problems)


ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(?:[+-]\d\d:\d\d|Z)"


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_log_lines_carry_an_iso_time_with_offset(capsys, restore_logging):
    configure_logging("info", "text", node="n0", role="elector")
    logging.getLogger("dledger.elector").info("n0 became LEADER term=%d", 3)
    logging.getLogger("dledger.elector").debug("not shown at info")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert re.fullmatch(ISO + r" INFO n0 elector\[\d+\] dledger.elector: n0 became LEADER term=3", err[0]), err


def test_json_log_lines(capsys, restore_logging):
    configure_logging("warning", "json", node="n2", role="handler")
    log = logging.getLogger("dledger.handler")
    log.info("not shown at warning")
    try:
        raise OSError("disk")
    except OSError:
        log.exception("write failed: %s", "x")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert re.fullmatch(ISO, rec["ts"])
    assert (rec["level"], rec["node"], rec["role"], rec["logger"], rec["msg"]) == (
        "ERROR", "n2", "handler", "dledger.handler", "write failed: x")
    assert "OSError: disk" in rec["exc"]
