"""`dledger server` refuses, in one line, what it cannot run: a taken data or elector port and a
store directory another node holds (before starting any role); and a damaged term/vote file is
replaced, never trusted."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import ROOT, wait_for

from node.block.shared_state import segment_name
from node.wiring.ports import free_port_pairs


def _server(node_id: str, peers: str, store_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", "server", "--id", node_id, "--peers", peers,
                           "--store-dir", str(store_dir)], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("which, offset", [("data", 0), ("elector", 1)])
def test_a_taken_port_is_refused_in_one_line(tmp_path, which, offset):
    port = free_port_pairs(1)[0]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + offset))
        squatter.listen()
        done = _server("n0", f"n0-127.0.0.1:{port}", tmp_path / "n0")
    assert done.returncode == 1
    want = f"cannot listen on 127.0.0.1:{port + offset} ({which} port)"
    assert want in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "started handler" not in done.stderr  # refused before any role ran
    assert not Path("/dev/shm", segment_name("default", "n0", str(tmp_path / "n0"))).exists()


def test_second_server_on_one_store_dir_is_refused(make_cluster):
    c = make_cluster(1)
    c.wait_leader(timeout=15)
    node = c.nodes["n0"]
    done = _server("n0", c.peers, node.store_dir)
    assert done.returncode == 1
    assert f"store dir {node.store_dir} is in use by another node (pid {node.proc.pid})" in done.stderr
    assert "Traceback" not in done.stderr
    assert c.metadata("n0") is not None  # the running node is untouched


def _session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (the server was started as its leader)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: session id
            out.append(int(d.name))
    return out


def _term_file_loads_as_damaged(content: bytes, tmp_path: Path) -> bool:
    from node.store.term_vote import TermVoteFile

    d = tmp_path / "probe"
    d.mkdir()
    (d / "currterm").write_bytes(content)
    try:
        TermVoteFile(d)
    except ValueError:  # LayoutError, UnicodeDecodeError
        return True
    return False


@pytest.mark.parametrize("content", [
    b"\xff\xfecurrTerm=3\n",
    b"currTerm=three\nvoteLeader=\n",
    b"garbage without any key\n",
], ids=["not-utf8", "bad-term", "no-keys"])
def test_a_damaged_term_file_is_replaced_not_trusted(tmp_path, content):
    """A currterm file the elector cannot trust used to crash the elector on every restart
    (a half-alive node stuck in term 0), then stopped the node. Now it is never read as term
    0: the node records the highest term it can know of (here, alone, its log's last term)
    with a vote it cannot give, and leads only from the next term (docs/election.md
    "Non-voting members"). The one-member case: no peer to ask."""
    assert _term_file_loads_as_damaged(content, tmp_path)
    store = tmp_path / "n0"
    from node.store.segment_store import SegmentStore, StoreConfig
    with SegmentStore(StoreConfig(str(store))) as s:
        s.append_leader(b"x", 5)
        s.set_committed_index(0)
    (store / "currterm").write_bytes(content)
    port = free_port_pairs(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "server", "--id", "n0", "--peers",
                             f"n0-127.0.0.1:{port}", "--store-dir", str(store)], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        def term_file() -> str:
            text = (store / "currterm").read_bytes()
            return text.decode() if b"voteLeader=n0" in text else ""

        text = wait_for(term_file, 60, "the node to lead again")
        assert "currTerm=6\n" in text, text  # the first term after its log's last one
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert "recorded term 5 with no vote to give in it" in err, err[-3000:]
    assert "Traceback" not in err
    wait_for(lambda: not _session_pids(proc.pid), 5, "no process of the server's session left")


def test_a_server_takes_the_file_sizes_of_the_store_it_opens(tmp_path):
    """A store made with other segment sizes (by `dledger cluster`, or by hand) is served with
    its own sizes when none is given, and a flag that contradicts it is one line, exit 2 — not
    a crash loop of tracebacks."""
    port = free_port_pairs(1)[0]
    peers = f"n0-127.0.0.1:{port}"
    store = tmp_path / "n0"
    from node.store.base import StoreConfig
    from node.store.segment_store import SegmentStore

    s = SegmentStore(StoreConfig(store_dir=str(store), data_file_size=8 << 20, index_file_size=64 << 10))
    s.open()
    s.append_leader(b"made elsewhere", 1)
    s.set_committed_index(0)
    s.close()

    bad = subprocess.run([sys.executable, "-m", "tools.cli", "server", "--id", "n0", "--peers", peers,
                          "--store-dir", str(store), "--data-file-size", "64MiB"], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2, bad.stderr
    assert "created with 8388608-byte files" in bad.stderr and "Traceback" not in bad.stderr
    assert "started handler" not in bad.stderr

    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "server", "--id", "n0", "--peers", peers,
                             "--store-dir", str(store)], cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        from ipc.client import DLedgerClient

        with DLedgerClient(peers, timeout=5.0) as c:
            got = wait_for(lambda: c.get_range(0, 10), 60, "the node to serve its store")
            assert got[0].body == b"made elsewhere"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert "Traceback" not in proc.stderr.read()


def test_health_fails_when_a_node_was_started_with_another_member_set(make_cluster, tmp_path):
    """A 4th node started with a peers string naming a member the group does not have: `health`
    with that string fails and names the disagreement (it used to say "ok ... 4/4 alive")."""
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    port = free_port_pairs(1)[0]
    peers4 = f"{c.peers};n3-127.0.0.1:{port}"
    log = open(tmp_path / "n3.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "server", "--id", "n3", "--peers", peers4,
                             "--store-dir", str(tmp_path / "n3")], cwd=str(ROOT), stdout=log,
                            stderr=log, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        def health() -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "tools.cli", "health", "--peers", peers4],
                                  cwd=str(ROOT), capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        r = wait_for(lambda: (h := health()) and "members disagree" in h.stderr and h, 60,
                     "health to see the 4th node's member set")
        assert r.returncode == 1
        assert f"n3 list {peers4.replace(';', ', ')}" in r.stderr, r.stderr
        # ... and the stranger says so in its log (it asked the members' term and saw their set)
        wait_for(lambda: "configuration does not hold this node" in (tmp_path / "n3.log").read_text(errors="replace"),
                 30, "n3 to log that the group's members do not include it")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()
