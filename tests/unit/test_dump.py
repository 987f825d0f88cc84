"""`dledger dump`: exact text and jsonl lines, ranges, damage shown, bad directories, live use."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_decoder import (
    REPO,
    LiveWriter,
    body_of,
    flip_body_byte,
    make_store,
    zero_index_record,
)

from node.store import codec
from tools.cli import main


def dump(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    rc = main(["dump", *args])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def test_text_lines_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = make_store(tmp_path / "n0", n=12, committed=5)
    rc, lines, err = dump(capsys, "--store-dir", str(tmp_path / "n0"), "--from", "2", "--to", "4",
                          "--preview", "8")
    assert rc == 0 and err == ""
    expected = []
    for i in (2, 3, 4):
        b = body_of(i)
        preview = repr(b[:8]) + ("..." if len(b) > 8 else "")
        expected.append(f"{i} {results[i].term} {results[i].pos} {48 + len(b)} NORMAL true {preview}")
    assert lines == expected
    assert lines[0] == f"2 1 {results[2].pos} 122 NORMAL true b'entry-2-'..."


def test_whole_log_by_default_including_uncommitted(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path / "n0", n=100, committed=10)
    rc, lines, _ = dump(capsys, "--store-dir", str(tmp_path / "n0"))
    assert rc == 0
    assert [int(x.split()[0]) for x in lines] == list(range(100))


def test_jsonl_keys_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = make_store(tmp_path / "n0", n=30, noop_at=7)
    rc, lines, _ = dump(capsys, "--store-dir", str(tmp_path / "n0"), "--format", "jsonl")
    assert rc == 0 and len(lines) == 30
    for i, line in enumerate(lines):
        obj = json.loads(line)
        assert set(obj) == {"index", "term", "pos", "size", "crc_ok", "body_b64", "type", "error"}
        body = b"" if i == 7 else body_of(i)
        assert obj == {
            "index": i, "term": results[i].term, "pos": results[i].pos, "size": 48 + len(body),
            "crc_ok": True, "body_b64": base64.b64encode(body).decode(), "error": None,
            "type": "NOOP" if i == 7 else "NORMAL",
        }


def test_damage_is_printed_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "n0"
    make_store(d, n=20)
    flip_body_byte(d, 3)
    zero_index_record(d, 5)
    rc, lines, _ = dump(capsys, "--store-dir", str(d), "--to", "6")
    assert rc == 0 and len(lines) == 7
    assert lines[3].split()[5] == "false"
    assert lines[5] == "5 - - - - - ! gap: index record is zero"
    rc, lines, _ = dump(capsys, "--store-dir", str(d), "--from", "3", "--to", "5", "--format", "jsonl")
    objs = [json.loads(x) for x in lines]
    assert objs[0]["crc_ok"] is False and objs[0]["error"] is None
    assert codec.crc32(base64.b64decode(objs[0]["body_b64"])) != codec.crc32(body_of(3))
    assert objs[2] == {"index": 5, "term": None, "pos": None, "size": None, "type": None,
                       "crc_ok": None, "error": "gap: index record is zero", "body_b64": None}


@pytest.mark.parametrize("name", ["missing", "plain", "file"])
def test_bad_directory_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         name: str) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    rc, lines, err = dump(capsys, "--store-dir", str(tmp_path / name))
    assert rc == 2 and lines == []
    assert len(err.strip().splitlines()) == 1 and err.startswith("dledger dump: error: ")


def test_dump_while_another_process_appends(tmp_path: Path) -> None:
    """The CLI as a separate process against a live store: exit 0, a clean prefix each time."""
    d = tmp_path / "live"
    writer = LiveWriter(d)
    try:
        counts = []
        for _ in range(4):
            writer.start_batch(200)
            p = subprocess.run([sys.executable, "-c", "import sys; from tools.cli import main; "
                                "sys.exit(main())", "dump", "--store-dir", str(d), "--format", "jsonl"],
                               env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                               text=True, timeout=60, check=False)
            written = writer.wait_batch()
            assert p.returncode == 0, p.stderr
            objs = [json.loads(x) for x in p.stdout.splitlines()]
            assert [o["index"] for o in objs] == list(range(len(objs)))
            assert len(objs) <= written
            assert all(o["crc_ok"] and o["error"] is None for o in objs)
            assert all(base64.b64decode(o["body_b64"]) == body_of(o["index"]) for o in objs)
            counts.append(len(objs))
        assert counts == sorted(counts) and counts[-1] >= 600, counts
    finally:
        writer.stop()
