"""Temporary directories reclaimed when their owner was killed (node/host/rundirs.py):
the run dirs of SIGKILLed nodes and the stores of SIGKILLed `dledger cluster`/`bench --local`
runs. The owner is a real child process, killed for real."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from node.host.rundirs import (
    LEGACY_MIN_AGE_S,
    OWNER_FILE,
    claim,
    legacy_run_dir_is_stale,
    make_owned_tempdir,
    release,
    sweep_stale,
)

ROOT = Path(__file__).resolve().parents[2]


def _owner(parent: Path, prefix: str) -> tuple[subprocess.Popen, Path]:
    """A child that makes and claims a directory, prints it, then sleeps."""
    code = ("import sys, time; from node.host.rundirs import make_owned_tempdir; "
            f"p, fd = make_owned_tempdir({prefix!r}, {str(parent)!r}); print(p, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    return child, Path(child.stdout.readline().strip())


def test_a_dead_owners_directory_is_swept_a_live_ones_is_not(tmp_path):
    dead, d_dead = _owner(tmp_path, "dledger-local-")
    live, d_live = _owner(tmp_path, "dledger-local-")
    try:
        assert (d_dead / OWNER_FILE).read_text().strip() == str(dead.pid)
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert sweep_stale("dledger-local-", tmp_path) == [d_dead]
        assert not d_dead.exists() and d_live.exists()
    finally:
        for p in (dead, live):
            p.kill()
            p.wait()


def test_what_is_not_clearly_abandoned_stays(tmp_path):
    plain = tmp_path / "dledger-local-plain"  # no owner file: not made by us
    plain.mkdir()
    being_made = tmp_path / "dledger-local-new"  # owner file created, not yet locked and written
    being_made.mkdir()
    (being_made / OWNER_FILE).touch()
    assert sweep_stale("dledger-local-", tmp_path) == []
    assert plain.exists() and being_made.exists()


def test_own_directory_claim_and_release(tmp_path):
    d, fd = make_owned_tempdir("dledger-cluster-", tmp_path)
    assert d.parent == tmp_path and (d / OWNER_FILE).read_text().strip() == str(os.getpid())
    assert sweep_stale("dledger-cluster-", tmp_path) == []  # we hold it
    release(d, fd)
    assert not d.exists()
    again = tmp_path / "dledger-cluster-x"
    again.mkdir()
    os.close(claim(again))  # claimed, then its owner let go without removing it
    assert sweep_stale("dledger-cluster-", tmp_path) == [again]


def _legacy(tmp_path: Path, name: str = "dl-n0-abcd1234", store: Path | None = None,
            age: float = LEGACY_MIN_AGE_S + 60) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"store_dir": str(store or tmp_path / "gone")}))
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "elector.ctl"))
    s.close()
    old = time.time() - age
    os.utime(d, (old, old))
    return d


def test_legacy_run_dirs_are_reclaimed_only_when_clearly_dead(tmp_path):
    stale = _legacy(tmp_path)
    assert legacy_run_dir_is_stale(stale)
    assert sweep_stale("dl-", tmp_path) == []  # only when asked to
    assert sweep_stale("dl-", tmp_path, legacy_run_dirs=True) == [stale]

    young = _legacy(tmp_path, "dl-n1-abcd1234", age=5)
    assert not legacy_run_dir_is_stale(young)
    checkout = tmp_path / "dl-baseline"  # a name we did not make
    checkout.mkdir()
    assert not legacy_run_dir_is_stale(checkout)
    other = _legacy(tmp_path, "dl-n2-abcd1234")
    (other / "notes.txt").write_text("not a run dir's file")
    os.utime(other, (time.time() - LEGACY_MIN_AGE_S - 60,) * 2)
    assert not legacy_run_dir_is_stale(other)

    store = tmp_path / "store"
    store.mkdir()
    live = _legacy(tmp_path, "dl-n3-abcd1234", store=store)
    (store / "run.json").write_text(json.dumps({"pid": os.getpid(), "run_dir": str(live)}))
    assert not legacy_run_dir_is_stale(live)  # its store's supervisor (this pid) is alive
    (store / "run.json").write_text(json.dumps({"pid": os.getpid(), "run_dir": "/tmp/dl-n3-other"}))
    assert legacy_run_dir_is_stale(live)  # that node runs with another run dir now


def test_cluster_removes_the_blocks_its_stopped_nodes_left(tmp_path):
    """A node killed by the cluster's SIGTERM before its supervisor registered its block with
    the resource tracker leaves the block behind: the cluster removes its own nodes' blocks
    once they have all exited (and nothing else: another store's block stays)."""
    from node.block.shared_state import segment_name
    from tools.commands.cluster import remove_left_segments

    ours = Path("/dev/shm", segment_name("g", "n1", tmp_path / "n1"))
    other = Path("/dev/shm", segment_name("g", "n1", tmp_path / "elsewhere"))
    try:
        ours.write_bytes(b"x")
        other.write_bytes(b"x")
        removed = remove_left_segments("g", {"n0": tmp_path / "n0", "n1": tmp_path / "n1"})
        assert removed == [ours.name] and not ours.exists() and other.exists()
    finally:
        ours.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
