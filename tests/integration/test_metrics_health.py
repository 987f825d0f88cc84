"""/metrics, `dledger health` and `dledger top` against a real 3-node group (docs/metrics.md).

Real processes on 127.0.0.1 with `--metrics-port`; faults are real signals (SIGKILL a node,
SIGSTOP/SIGCONT a follower). Every wait has a deadline; the fixture stops everything by PID and
checks that no shared-memory segment is left.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest

from tests.integration.cluster import ROOT, Cluster, wait_for

pytestmark = pytest.mark.integration

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_metrics(c: Cluster) -> dict[str, int]:
    """Give every node of a not yet started cluster its own --metrics-port."""
    ports = {}
    for n in c.nodes.values():
        ports[n.id] = _free_port()
        n.flags = ["--metrics-port", str(ports[n.id])]
    return ports


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(name, labels): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples: dict, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, ls), v in samples.items():
        if n == name and want <= ls:
            return v
    return None


def dledger(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


class Load:
    """Batches of appends in a thread until stopped (errors while a node is down are expected)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.c.client(timeout=3.0) as cl:
            while not self.stop.is_set():
                try:
                    cl.append_batch([b"m" * 256] * 32)
                except Exception:  # noqa: BLE001 - failover in progress
                    self.stop.wait(0.05)

    def __enter__(self) -> Load:
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join(timeout=15)


def test_metrics_move_under_load_kill_and_pause(make_cluster) -> None:
    c = make_cluster(3, start=False)
    ports = with_metrics(c)
    c.start()
    leader = c.wait_leader(20)
    with Load(c):
        first = scrape(ports[leader])
        c0 = value(first, "dledger_committed_index", node=leader)
        wait_for(lambda: value(scrape(ports[leader]), "dledger_committed_index") > c0 + 200, 20,
                 "committed index to grow under load")
        s = scrape(ports[leader])
        assert value(s, "dledger_is_leader") == 1.0
        assert value(s, "dledger_append_latency_seconds_count") > 0
        assert value(s, "dledger_requests_total", type="BATCH_APPEND", code="SUCCESS") > 0
        # Each follower gets entries; one may still be matching its log when the commit
        # index has grown (a quorum is the leader and one follower).
        wait_for(lambda: all(value(scrape(ports[leader]), "dledger_peer_pushed_entries_total", peer=p) > 0
                             for p in c.nodes if p != leader), 20, "entries pushed to every follower")
        assert value(s, "dledger_store_bytes") > 0

        # lag rises for a paused follower and falls after SIGCONT
        follower = next(n for n in c.nodes if n != leader)
        node = c.nodes[follower]
        node.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: value(scrape(ports[leader]), "dledger_peer_lag_entries", peer=follower) > 500,
                     20, f"lag of paused {follower} to rise")
            assert value(scrape(ports[leader]), "dledger_peer_lag_bytes", peer=follower) > 0
        finally:
            node.signal(signal.SIGCONT)
        wait_for(lambda: value(scrape(ports[leader]), "dledger_peer_lag_entries", peer=follower) < 500,
                 30, f"lag of {follower} to fall after SIGCONT")

        # a killed leader: the survivors count the leader change
        survivors = [n for n in c.nodes if n != leader]
        before = {n: value(scrape(ports[n]), "dledger_leader_changes_total") for n in survivors}
        c.nodes[leader].kill()
        new = c.wait_leader(20, among=survivors)
        assert new != leader
        wait_for(lambda: all(value(scrape(ports[n]), "dledger_leader_changes_total") > before[n]
                             for n in survivors), 10, "leader_changes_total to count the kill")
        assert value(scrape(ports[new]), "dledger_elections_won_total") >= 1


def test_health_exit_codes(make_cluster) -> None:
    c = make_cluster(3)
    c.wait_leader(20)
    with c.client() as cl:
        cl.append_batch([b"h"] * 10)
    r = dledger("health", "--peers", c.peers)
    assert r.returncode == 0, r
    assert r.stdout.startswith("ok: leader "), r.stdout

    # a lagging follower (paused while the leader appends)
    leader = c.wait_leader(10)
    follower = next(n for n in c.nodes if n != leader)
    c.nodes[follower].signal(signal.SIGSTOP)
    c.nodes[follower].stopped = True
    try:
        with c.client() as cl:
            for _ in range(10):
                cl.append_batch([b"l"] * 50)
        r = dledger("health", "--peers", c.peers, "--max-lag", "100", "--timeout", "1")
        # the paused node does not answer: it is down, and the live quorum is fine
        assert r.returncode == 0, r
        assert f"down: {follower}" in r.stdout
    finally:
        c.nodes[follower].signal(signal.SIGCONT)
        c.nodes[follower].stopped = False
    # resumed, it answers while still behind for a moment; or caught up: both are decided by lag
    r = dledger("health", "--peers", c.peers, "--max-lag", "0", "--json")
    doc = json.loads(r.stdout)
    assert (r.returncode == 0) == doc["healthy"]
    if r.returncode:
        assert "lags" in doc["reason"]

    # no quorum: two of three nodes down
    others = [n for n in c.nodes if n != leader]
    for n in others:
        c.nodes[n].kill()
    r = dledger("health", "--peers", c.peers, "--timeout", "1")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no quorum: 1/3" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_health_reports_a_lagging_follower_that_answers(make_cluster) -> None:
    """A follower whose dispatcher stopped (the leader's dispatcher for it is SIGSTOPped) still
    answers METADATA but falls behind: health names it with exit 1."""
    c = make_cluster(3)
    leader = c.wait_leader(20)
    follower = next(n for n in c.nodes if n != leader)
    pid = c.nodes[leader].role_pids()[f"dispatcher-{follower}"]
    import os

    os.kill(pid, signal.SIGSTOP)
    try:
        with c.client() as cl:
            for _ in range(10):
                cl.append_batch([b"l"] * 50)
        r = dledger("health", "--peers", c.peers, "--max-lag", "100")
        assert r.returncode == 1, r
        assert f"follower {follower} lags" in r.stderr and "(max 100)" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: dledger("health", "--peers", c.peers, "--max-lag", "0").returncode == 0, 20,
             "health to be ok once the follower caught up")


def test_top_once_json_and_table(make_cluster, tmp_path) -> None:
    c = make_cluster(3)
    leader = c.wait_leader(20)
    with Load(c):
        r = dledger("top", "--peers", c.peers, "--once", "--json")
    assert r.returncode == 0, r
    doc = json.loads(r.stdout)
    assert doc["leader"] == leader
    rows = {n["id"]: n for n in doc["nodes"]}
    assert rows[leader]["role"] == "LEADER" and rows[leader]["entries_per_s"] > 0
    assert rows[leader]["append_p99_ms"] is not None
    assert all(n["alive"] and n["version"] and n["store_bytes"] > 0 for n in doc["nodes"])
    assert all((n["member"], n["config_index"]) == ("voter", -1) for n in doc["nodes"])  # the --peers set
    r = dledger("metadata", "--peers", c.peers, "--json", "--status")
    assert r.returncode == 0, r
    nodes = {n["id"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes[leader]["lag"] is None and all(n["version"] and n["store_bytes"] > 0 for n in nodes.values())
    assert all(isinstance(n["lag"], int) for k, n in nodes.items() if k != leader)
    # a dead node is shown as such
    victim = next(n for n in c.nodes if n != leader)
    c.nodes[victim].kill()
    svg = tmp_path / "top.svg"
    r = dledger("top", "--peers", c.peers, "--once", "--save-svg", str(svg))
    assert r.returncode == 0, r
    assert "DOWN" in r.stdout and svg.read_text().startswith("<svg")


@pytest.mark.parametrize("port, code, text", [
    (70000, 2, "metrics_port: must be 0 (off) or a TCP port 1-65535"),
    (-1, 2, "metrics_port: must be 0 (off) or a TCP port 1-65535"),
    ("taken", 1, "(metrics port): Address already in use"),
])
def test_bad_metrics_port_is_one_line(tmp_path, port, code, text) -> None:
    from node.wiring.ports import free_port_pairs

    for attempt in range(3):  # another process may take the data or elector port meanwhile
        holder = socket.socket()
        try:
            metrics = port
            if port == "taken":
                holder.bind(("127.0.0.1", 0))
                holder.listen()
                metrics = holder.getsockname()[1]
            held = holder.getsockname()[1]  # 0 when nothing is held
            data = free_port_pairs(1)[0]  # the data port and the elector's, data + 1, both free
            while held and held in (data, data + 1):
                data = free_port_pairs(1)[0]
            r = dledger("server", "--id", "n0", "--peers", f"n0-127.0.0.1:{data}",
                        "--store-dir", str(tmp_path / f"n{attempt}"), "--metrics-port", str(metrics), timeout=60)
        finally:
            holder.close()
        if f"cannot listen on 127.0.0.1:{data}" not in r.stderr and f"127.0.0.1:{data + 1}" not in r.stderr:
            break
    assert r.returncode == code, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "INFO" not in ln]
    assert len(lines) == 1 and text in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cluster_gives_node_i_metrics_port_p_plus_i(tmp_path) -> None:
    base = _free_port()
    while any(_port_taken(base + i) for i in range(3)):
        base = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "cluster", "--nodes", "3", "--metrics-port",
                             str(base), "--store-dir", str(tmp_path / "c")], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def leaders() -> float | None:
            return sum(value(scrape(base + i), "dledger_is_leader", node=f"n{i}") for i in range(3))

        assert wait_for(leaders, 30, "every node's /metrics, one of them leading") == 1.0
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
