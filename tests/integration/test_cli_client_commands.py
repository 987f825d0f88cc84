"""The client commands as an operator scripts them, through `python -m tools.cli` against a
real 3-node group with the KV state machine: --json on every command that prints (and a
failure under --json as an object on stdout), `append` in a pipeline whose reader goes away,
`kv put --value-file`, `health --wait` on a group that is still starting, a new group's first
leader within --timeout, and a refused transfer that says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cluster import ROOT, Cluster, interruptible, wait_after_signal, wait_for

pytestmark = pytest.mark.integration

ONE_MIB = 1024 * 1024


def dledger(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], input=stdin, capture_output=True,
                          timeout=timeout, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


def out_json(r: subprocess.CompletedProcess) -> object:
    assert r.stdout.strip(), (r.returncode, r.stderr)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cli"), 3, state_machine="kv", data_file_size=32 << 20,
                index_file_size=4 << 20)
    try:
        c.start()
        c.wait_leader(60)
        yield c
    finally:
        c.close()


def test_json_of_append_kv_snapshot_metadata_and_config(group, tmp_path):
    P = group.peers
    r = dledger("append", "--peers", P, "--json", "a", "b")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [sorted(x) for x in rows] == [["index", "term"]] * 2 and rows[1]["index"] == rows[0]["index"] + 1

    put = out_json(dledger("kv", "put", "--peers", P, "--json", "k", "v1"))
    assert isinstance(put["revision"], int) and put["revision"] > 0
    assert out_json(dledger("kv", "cas", "--peers", P, "--json", "k", "v1", "v2")) == {"swapped": True}
    r = dledger("kv", "cas", "--peers", P, "--json", "k", "v1", "v3")
    assert r.returncode == 1 and out_json(r) == {"swapped": False}
    assert out_json(dledger("kv", "del", "--peers", P, "--json", "k")) == {"deleted": True}
    assert out_json(dledger("kv", "del", "--peers", P, "--json", "k")) == {"deleted": False}

    snap = out_json(dledger("snapshot", "--peers", P, "--json"))
    assert sorted(n["id"] for n in snap["nodes"]) == ["n0", "n1", "n2"]
    assert all(isinstance(n["index"], int) and isinstance(n["term"], int) for n in snap["nodes"])

    # metadata --json: the keys it always had, plus what the table shows, without --status
    m = out_json(dledger("metadata", "--peers", P, "--json"))
    leader = m["leader"]
    for n in m["nodes"]:
        assert {"id", "address", "role", "term", "leader", "ledger_begin_index", "ledger_end_index",
                "committed_index", "alive", "lag", "version", "store_bytes", "disk_usage_ratio",
                "config_index", "member"} <= set(n)
        assert n["version"] and n["store_bytes"] > 0 and 0 <= n["disk_usage_ratio"] <= 1
        assert (n["config_index"], n["member"]) == (-1, "voter")  # no change yet: --peers
        assert (n["lag"] is None) == (n["id"] == leader)

    cfg = tmp_path / "node.toml"
    cfg.write_text('[node]\nheartbeat_interval_ms = "fast"\n')
    r = dledger("config", "check", str(cfg), "--json")
    doc = out_json(r)
    assert r.returncode == 1 and doc["ok"] is False and "heartbeat_interval_ms" in doc["problems"][0]
    cfg.write_text("[node]\nheartbeat_interval_ms = 50\n")
    r = dledger("config", "check", str(cfg), "--json")
    assert r.returncode == 0 and out_json(r) == {"ok": True, "problems": [],
                                                  "missing": ["id", "peers", "store_dir"]}


@pytest.mark.parametrize("argv, code, exit_code", [
    (["get", "--index", "999999999"], "INDEX_OUT_OF_RANGE", 1),
    (["kv", "get", "nosuchkey"], "NOT_FOUND", 1),
    (["kv", "put", "k", "--value-file", "/nonexistent/value"], None, 2),
    (["metadata", "--timeout", "1e308"], None, 2),
    (["transfer", "--to", "n9"], None, 2),
])
def test_a_failure_under_json_is_an_object_on_stdout(group, argv, code, exit_code):
    cmd = argv[:2] if argv[0] == "kv" else argv[:1]
    r = dledger(*cmd, "--peers", group.peers, "--json", *argv[len(cmd):])
    assert r.returncode == exit_code, (r.stdout, r.stderr)
    doc = out_json(r)
    assert set(doc) == {"error", "code", "exit_code"} and doc["exit_code"] == exit_code
    assert doc["code"] == code and doc["error"]
    assert len(r.stderr.decode().strip().splitlines()) == 1  # the line for people stays


def test_timeout_out_of_range_says_the_range(group):
    r = dledger("append", "--peers", group.peers, "--timeout", "1e308", "x")
    err = r.stderr.decode()
    assert r.returncode == 2 and "--timeout: must be > 0 and <= 31536000 seconds, got 1e308" in err
    assert "time_t" not in err


def test_bench_refuses_a_size_over_the_body_limit_before_sending(group):
    r = dledger("bench", "--peers", group.peers, "--size", "5MiB", "--duration", "5")
    err = r.stderr.decode()
    assert r.returncode == 2 and "over the largest body a node accepts (4194304 bytes" in err, err
    assert r.stdout == b""


def _pipeline(peers: str, lines: int, batch: int) -> tuple[int, str, int]:
    """`seq LINES | dledger append --peers P --batch K - | head -1`: (append's exit code, its
    stderr, the entries the group gained)."""
    with dledger_client(peers) as c:
        before = c.metadata().node(c.metadata().leader_id).ledger_end_index
    seq = subprocess.Popen(["seq", str(lines)], stdout=subprocess.PIPE)
    app = subprocess.Popen([sys.executable, "-m", "tools.cli", "append", "--peers", peers, "--batch",
                            str(batch), "-"], stdin=seq.stdout, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, cwd=str(ROOT),
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    seq.stdout.close()
    head = subprocess.run(["head", "-1"], stdin=app.stdout, capture_output=True)
    app.stdout.close()
    _, err = app.communicate(timeout=120)
    seq.wait(timeout=30)
    assert head.stdout.strip().split()[0].isdigit()
    with dledger_client(peers) as c:
        m = c.metadata()
        after = m.node(m.leader_id).ledger_end_index
    return app.returncode, err.decode(), after - before


def dledger_client(peers: str):  # noqa: ANN201
    from ipc.client import DLedgerClient

    return DLedgerClient(peers, timeout=10.0)


@pytest.mark.parametrize("lines, batch", [(3000, 100), (2000, 1)])
def test_append_into_a_closed_pipe_says_how_many_and_fails(group, lines, batch):
    rc, err, gained = _pipeline(group.peers, lines, batch)
    assert rc == 1, err
    assert gained < lines  # it stopped: the rest of the input was not appended ...
    (line,) = err.strip().splitlines()  # ... and said so, with the count the group gained
    assert f"stdout was closed (broken pipe): {gained} entries appended" in line, (line, gained)
    assert "the rest of the input was not appended" in line and "Traceback" not in err


def test_kv_put_value_file_and_stdin_up_to_the_limit(group, tmp_path):
    P = group.peers
    value = bytes(range(256)) * (ONE_MIB // 256)  # exactly 1 MiB, not UTF-8
    f = tmp_path / "value.bin"
    f.write_bytes(value)
    r = dledger("kv", "put", "--peers", P, "--timeout", "20", "big", "--value-file", str(f))
    assert r.returncode == 0, r.stderr
    r = dledger("kv", "get", "--peers", P, "--timeout", "20", "big", "--json")
    got = out_json(r)["value"].encode("utf-8", "surrogateescape")
    assert got == value
    r = dledger("kv", "put", "--peers", P, "from-stdin", "--value-file", "-", stdin=b"line1\nline2\n")
    assert r.returncode == 0, r.stderr
    assert dledger("kv", "get", "--peers", P, "from-stdin").stdout == b"line1\nline2\n\n"
    f.write_bytes(value + b"x")
    r = dledger("kv", "put", "--peers", P, "big", "--value-file", str(f))
    assert r.returncode == 2 and b"more than the value limit of 1048576 bytes" in r.stderr
    r = dledger("kv", "put", "--peers", P, "k")
    assert r.returncode == 2 and b"required: VALUE (or --value-file PATH" in r.stderr


def test_health_wait_and_the_first_leader_of_a_new_group(tmp_path):
    """A group just started: `health --wait` exits 0 once it has a leader, and `append
    --timeout` long enough waits for that first leader instead of failing. A too-short
    timeout says what to do."""
    c = Cluster(tmp_path / "new", 3)
    try:
        r = dledger("health", "--peers", c.peers, "--timeout", "0.3")  # nothing runs yet
        assert r.returncode == 1 and b"no quorum" in r.stderr
        c.start()
        r = dledger("append", "--peers", c.peers, "--timeout", "0.2", "early")
        if r.returncode != 0:  # no leader yet (the usual case): the line says what to do
            assert r.returncode == 1 and b"health --wait" in r.stderr, r.stderr
        r = dledger("health", "--peers", c.peers, "--wait", "120", "--json", timeout=150)
        assert r.returncode == 0, r.stderr
        assert out_json(r)["healthy"] is True
        r = dledger("append", "--peers", c.peers, "--timeout", "30", "hello")
        assert r.returncode == 0, r.stderr
    finally:
        c.close()


def test_a_refused_transfer_says_why(group):
    """Last in this module: it stops n2 (and starts it again)."""
    P = group.peers
    leader = group.wait_leader(30)
    target = next(n for n in group.nodes if n != leader)
    r = dledger("transfer", "--peers", P, "--to", target, "--json", "--timeout", "30")
    assert r.returncode == 0, r.stderr
    assert out_json(r)["leader"] == target
    leader = group.wait_leader(30)
    victim = next(n for n in group.nodes if n != leader)
    group.nodes[victim].kill()
    try:
        r = dledger("transfer", "--peers", P, "--to", victim, "--json", "--timeout", "10")
        assert r.returncode == 1, (r.stdout, r.stderr)
        doc = out_json(r)
        assert doc["code"] == "TAKE_LEADERSHIP_FAILED"
        assert f"{victim} did not answer: it is down or unreachable" in doc["error"], doc
        assert f"{victim} did not answer" in r.stderr.decode()
    finally:
        group.nodes[victim].start()  # its next start removes the segment the kill left
        wait_for(lambda: group.converged(), 60, "the group to converge again")


def _follow(peers: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools.cli", "get", "--peers", peers, "--follow", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=interruptible)


def test_get_follow_prints_entries_as_they_commit_and_stops_on_ctrl_c(group):
    """`get --follow --from latest` sees only what commits after it started, one jsonl line per
    entry with dump's keys; SIGINT ends it with exit 0 and nothing on stderr."""
    import signal

    P = group.peers
    with dledger_client(P) as c:
        before = c.append(b"before").index
    proc = _follow(P, "--from", str(before + 1), "--format", "jsonl")
    try:
        with dledger_client(P) as c:
            idx = [c.append(b"live-%d" % i).index for i in range(3)]
        lines: list[dict] = []
        while len(lines) < 3:
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode()
            row = json.loads(line)
            if row["type"] == "NORMAL":
                lines.append(row)
        assert [r["index"] for r in lines] == idx
        assert [r["body"] for r in lines] == ["live-0", "live-1", "live-2"]
        assert {"index", "term", "pos", "type", "body_b64"} <= set(lines[0])
        proc.send_signal(signal.SIGINT)
        rc, err = wait_after_signal(proc, 30, "get --follow after SIGINT")
        assert rc == 0 and b"Traceback" not in err, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_get_follow_into_head_exits_0_and_a_start_below_begin_says_so(group):
    P = group.peers
    with dledger_client(P) as c:
        c.append_batch([b"h1", b"h2", b"h3"])
    proc = _follow(P, "--from", "earliest")
    head = subprocess.run(["head", "-2"], stdin=proc.stdout, capture_output=True, timeout=60)
    proc.stdout.close()
    try:
        # The next entry written is what makes the closed pipe felt.
        with dledger_client(P) as c:
            wait_for(lambda: c.append(b"poke") and proc.poll() is not None, 30, "get --follow to see the closed pipe")
        assert proc.returncode == 0
        assert len(head.stdout.splitlines()) == 2
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = dledger("get", "--peers", P, "--follow", "--from", "bogus")
    assert r.returncode == 2 and "earliest, latest or an index" in r.stderr.decode()
    r = dledger("get", "--peers", P, "--from", "3", "--index", "0")
    assert r.returncode == 2 and "--follow" in r.stderr.decode()
