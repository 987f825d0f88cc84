"""`dledger server` refuses, in one line and before starting any role, what it cannot run:
a taken data or elector port, and a store directory another node holds."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import ROOT

from node.ports import free_port_pairs
from node.shared_state import segment_name


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
