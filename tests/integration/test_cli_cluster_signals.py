"""`dledger cluster` as an operator meets it, on real processes: a node that cannot bind its
port stops the whole group with one line naming it and why; Ctrl-C at any point of start-up is
quiet (no traceback, no process, no shared-memory segment left); a node killed with SIGKILL is
one line from the cluster, not a resource_tracker warning. Ctrl-C is emulated as the terminal
sends it: SIGINT to the cluster's whole process group. Points in start-up are counted in lines
of output, never in seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from cluster import ROOT, wait_for

from node.block.shared_state import segment_name
from node.wiring.ports import free_port_pairs

pytestmark = pytest.mark.integration

NOISE = ("Traceback", "KeyboardInterrupt", "Fatal Python error", "resource_tracker", "leaked")


class ClusterRun:
    """`dledger cluster ARGS` in its own session (so the test can signal its process group as
    a terminal would), temporary stores under `tmp`, stderr collected line by line."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.tmp = tmp
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
        self.p = subprocess.Popen([sys.executable, "-m", "tools.cli", "cluster", *args], cwd=ROOT,
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self.peers = self.p.stdout.readline().strip()

    def _read(self) -> None:
        for line in self.p.stderr:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append("<eof>")
            self._cv.notify_all()

    def wait_lines(self, pred, timeout: float, what: str) -> None:  # noqa: ANN001
        with self._cv:
            if not self._cv.wait_for(lambda: pred(self.lines), timeout):
                raise AssertionError(f"timed out waiting for {what}: {self.lines[-20:]}")

    def stores(self) -> list[Path]:
        ids = [x.partition("-")[0] for x in self.peers.split(";") if x]
        roots = sorted(self.tmp.glob("dledger-cluster-*"))
        return [roots[0] / nid for nid in ids] if roots else []

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        rc = self.p.wait(timeout=timeout)
        self._t.join(timeout=10)
        return rc, "\n".join(self.lines)

    def kill_all(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def _session_alive(sid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _segments(stores: list[Path]) -> list[str]:
    names = [segment_name("default", s.name, os.path.abspath(s)) for s in stores]
    return [n for n in names if Path("/dev/shm", n).exists()]


def _no_leftovers(run: ClusterRun, stores: list[Path]) -> None:
    wait_for(lambda: not _session_alive(run.p.pid), 20, "every process of the cluster to stop")
    wait_for(lambda: not _segments(stores), 10, f"the nodes' shared-memory segments to go: {_segments(stores)}")


def _free_base(n: int) -> int:
    """A base port with 2n consecutive free ports (outside the ephemeral range)."""
    for _ in range(50):
        base = free_port_pairs(1)[0]
        socks = []
        try:
            for port in range(base, base + 2 * n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports found")


def test_a_node_that_cannot_bind_stops_the_group_with_one_line(tmp_path):
    base = _free_base(3)
    holder = socket.socket()
    holder.bind(("127.0.0.1", base + 3))  # n1's elector port
    holder.listen()
    run = ClusterRun(tmp_path, "--nodes", "3", "--base-port", str(base))
    try:
        stores = run.stores()
        rc, err = run.finish(timeout=90)
        assert rc == 1, err
        last = [ln for ln in err.splitlines() if ln != "<eof>"][-1]
        assert last.startswith("dledger cluster: error: node n1 stopped: cannot listen on "
                               f"127.0.0.1:{base + 3} (elector port): Address already in use"), last
        assert [ln for ln in err.splitlines() if "error" in ln] == [last], err
        assert not any(w in err for w in NOISE), err
        _no_leftovers(run, stores)
        assert not list(tmp_path.glob("dledger-cluster-*")), "the temporary stores were left"
    finally:
        holder.close()
        run.kill_all()


# Points of start-up: (a piece of a log line, how many such lines the nodes have logged by
# then). Supervisors log "started ROLE pid=..." as each of their 5 roles starts (15 in all):
# in between, role processes are importing, where the nodes, then in the cluster's process
# group, printed KeyboardInterrupt tracebacks (in about half of the runs from the 7th line on:
# hence eight points of it).
POINTS = [("", 0), *((" started ", k) for k in range(1, 16, 2)), ("became LEADER", 1)]


@pytest.mark.parametrize("piece, count", POINTS, ids=[f"{p.strip() or 'peers'}-{n}" for p, n in POINTS])
def test_ctrl_c_during_start_up_is_quiet_and_leaves_nothing(tmp_path, piece, count):
    run = ClusterRun(tmp_path, "--nodes", "3")
    try:
        assert run.peers.startswith("n0-127.0.0.1:")
        stores = run.stores()
        run.wait_lines(lambda ls: sum(piece in ln for ln in ls) >= count, 120,
                       f"{count} log lines with {piece!r}")
        os.killpg(run.p.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        rc, err = run.finish()
        assert rc == 0, err
        assert not any(w in err for w in NOISE), err
        _no_leftovers(run, stores)
        assert not list(tmp_path.glob("dledger-cluster-*")), "the temporary stores were left"
    finally:
        run.kill_all()


def test_sigkill_of_a_node_is_one_line_and_no_tracker_warning(tmp_path):
    run = ClusterRun(tmp_path, "--nodes", "3")
    try:
        stores = run.stores()
        run.wait_lines(lambda ls: any("became LEADER" in ln for ln in ls), 120, "a leader")
        nodes = {c.cmdline()[c.cmdline().index("--id") + 1]: c for c in psutil.Process(run.p.pid).children()}
        victim = nodes["n1"]
        tracker_gone = [c for c in victim.children() if "resource_tracker" in " ".join(c.cmdline())]
        victim.send_signal(signal.SIGKILL)
        run.wait_lines(lambda ls: any("node n1 was killed by SIGKILL" in ln for ln in ls), 30,
                       "the cluster's line about n1")
        # The killed node's tracker removes its segment (and would have warned by then).
        psutil.wait_procs(tracker_gone, timeout=20)
        wait_for(lambda: not _segments(stores[1:2]), 20, "n1's segment to be removed")
        assert run.p.poll() is None, "the others keep running"
        os.killpg(run.p.pid, signal.SIGINT)
        rc, err = run.finish()
        assert rc == 0, err
        assert not any(w in err for w in NOISE), err
        assert sum("n1 was killed" in ln for ln in err.splitlines()) == 1
        _no_leftovers(run, stores)
    finally:
        run.kill_all()
