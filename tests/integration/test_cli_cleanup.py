"""Footprint and clean-up (docs/operations.md), on real processes: the temporary stores of `dledger
cluster` and `dledger bench --local` go on SIGTERM and SIGINT, the stores of a cluster that was
SIGKILLed go at the next start, and so does the run directory (ipc sockets, config.json) of a
node that was SIGKILLed. Local groups use small segment files. Everything is stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import ROOT, wait_for

from node.host.rundirs import OWNER_FILE
from node.wiring.ports import free_port_pairs

pytestmark = pytest.mark.integration


def _start(args: list[str], tmp: Path, **kw: object) -> subprocess.Popen:
    """`dledger ARGS` in its own session, temporary directories under `tmp` (TMPDIR)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    return subprocess.Popen([sys.executable, "-m", "tools.cli", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True, **kw)


def _stop(p: subprocess.Popen) -> None:
    """Make sure nothing of `p`'s session outlives the test (by its process group id)."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _session_alive(sid: int) -> bool:
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            return True
    return False


def _temp_dirs(tmp: Path, prefix: str) -> list[Path]:
    return sorted(tmp.glob(prefix + "*"))


def _data_files(root: Path) -> list[Path]:
    return [f for f in root.glob("n*/data/*") if f.is_file() and not f.name.endswith(".tmp")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cluster_removes_its_temporary_stores_on_a_signal(tmp_path, sig):
    p = _start(["cluster", "--nodes", "1"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
               text=True)
    try:
        peers = p.stdout.readline().strip()
        assert peers.startswith("n0-127.0.0.1:")
        (root,) = wait_for(lambda: _temp_dirs(tmp_path, "dledger-cluster-"), 10, "the cluster's stores")
        files = wait_for(lambda: _data_files(root), 30, "the node's first data file")
        assert files[0].stat().st_size == 64 << 20  # small files for a local group
        p.send_signal(sig)
        assert p.wait(timeout=30) == 0
        assert not root.exists(), "the cluster left its temporary stores"
        wait_for(lambda: not _session_alive(p.pid), 10, "every node of the cluster to stop")
    finally:
        _stop(p)


def test_bench_local_removes_its_stores_on_sigterm(tmp_path):
    p = _start(["bench", "--local", "1", "--duration", "60", "--concurrency", "2"], tmp_path,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (root,) = wait_for(lambda: _temp_dirs(tmp_path, "dledger-local-"), 20, "the bench's group")
        wait_for(lambda: _data_files(root), 30, "the node's first data file")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) != 0  # interrupted: not a successful bench
        assert not root.exists(), "the bench left its temporary stores"
        wait_for(lambda: not _session_alive(p.pid), 15, "every node of the bench's group to stop")
    finally:
        _stop(p)


def test_stores_of_a_sigkilled_cluster_are_reclaimed_by_the_next(tmp_path):
    first = _start(["cluster", "--nodes", "1"], tmp_path, stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, text=True)
    second = None
    try:
        first.stdout.readline()
        (root,) = wait_for(lambda: _temp_dirs(tmp_path, "dledger-cluster-"), 10, "the stores")
        assert (root / OWNER_FILE).read_text().strip() == str(first.pid)
        os.kill(first.pid, signal.SIGKILL)  # the cluster only: its node gets SIGTERM (PDEATHSIG)
        first.wait()
        wait_for(lambda: not _session_alive(first.pid), 15, "the orphaned node to stop")
        assert root.exists()  # nobody could remove it ...
        second = _start(["cluster", "--nodes", "1"], tmp_path, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True)
        second.stdout.readline()
        assert not root.exists(), "the next cluster did not reclaim a dead cluster's stores"
        assert len(_temp_dirs(tmp_path, "dledger-cluster-")) == 1  # its own
    finally:
        _stop(first)
        if second is not None:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
            _stop(second)


def _server(tmp: Path, name: str) -> tuple[subprocess.Popen, Path]:
    port = free_port_pairs(1)[0]
    store = tmp / name
    p = _start(["server", "--id", "n0", "--peers", f"n0-127.0.0.1:{port}", "--store-dir", str(store),
                "--data-file-size", "8MiB", "--index-file-size", "64KiB"], tmp,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, store


def test_run_dir_of_a_sigkilled_node_is_reclaimed_at_the_next_start(tmp_path):
    a, store_a = _server(tmp_path, "a")
    b = None
    try:
        info = wait_for(lambda: json.loads((store_a / "run.json").read_text()), 20, "node a's run.json")
        run_dir = Path(info["run_dir"])
        assert run_dir.name.startswith("dl-n0-") and (run_dir / "config.json").exists()
        os.killpg(a.pid, signal.SIGKILL)  # the whole node: nobody cleans up
        a.wait()
        wait_for(lambda: not _session_alive(a.pid), 10, "node a's processes to die")
        assert run_dir.exists()
        b, store_b = _server(tmp_path, "b")
        wait_for(lambda: (store_b / "run.json").exists(), 20, "node b to start")
        assert not run_dir.exists(), "the next node start did not reclaim the dead node's run dir"
        # ... and a live node's run dir is never taken: b's survives a third start's sweep.
        b_run = Path(json.loads((store_b / "run.json").read_text())["run_dir"])
        c, store_c = _server(tmp_path, "c")
        try:
            c_info = wait_for(lambda: json.loads((store_c / "run.json").read_text()), 20, "node c's run.json")
            assert b_run.exists()
            # (its roles bind their sockets after its signal handlers are in place)
            wait_for(lambda: any(f.is_socket() for f in Path(c_info["run_dir"]).iterdir()), 20,
                     "node c's roles to start")
        finally:
            c.send_signal(signal.SIGTERM)
            assert c.wait(timeout=30) == 0
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            if p is not None:
                _stop(p)
    # the shared block of the SIGKILLed node a is the next start's on that store: remove it here
    from node.block.shared_state import segment_name

    Path("/dev/shm", segment_name("default", "n0", str(store_a))).unlink(missing_ok=True)
