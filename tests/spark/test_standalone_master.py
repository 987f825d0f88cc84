"""`dledger verify` through a real standalone Spark cluster on 127.0.0.1.

A Master and a Worker are started from pyspark's bundled jars (no Spark install needed), the
verify command runs as its own process with `--master spark://127.0.0.1:PORT` (so our code is
shipped to the executor as a zip), and both daemons are stopped by PID whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest
from spark_stores import write_store

from node.wiring.ports import free_port_pairs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from cluster import Cluster  # noqa: E402

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return int(json.load(resp).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the daemons' shutdown hooks stop their executors), then SIGKILL. By PID."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_verify_on_a_standalone_cluster(tmp_path: Path, healthy_replicas: list[Path]) -> None:
    diverged = tmp_path / "n3"
    write_store(diverged, overrides={130: b"not what n0 has"})
    port, ui_port, worker_ui = free_port_pairs(3)  # outside the ephemeral range: see node.wiring.ports
    # C1-only JIT: these JVMs live for seconds, so start-up speed is all that counts.
    fast_jvm = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_SCALA_VERSION="2.13",
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, **fast_jvm)
    java = ["java", "-Xmx256m", "-cp", f"{SPARK_HOME}/jars/*", "-Dspark.master.rest.enabled=false"]
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs / "master.log", "wb") as mlog, open(logs / "worker.log", "wb") as wlog:
            procs.append(subprocess.Popen(
                [*java, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(ui_port)],
                env=env, stdout=mlog, stderr=subprocess.STDOUT))
            # The worker retries registration on its own, so it can start alongside the master.
            procs.append(subprocess.Popen(
                [*java, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui),
                 "--work-dir", str(tmp_path / "work"), f"spark://127.0.0.1:{port}"],
                env=env, stdout=wlog, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 90
        while _alive_workers(ui_port) < 1:
            for p, name in zip(procs, ("master", "worker"), strict=True):
                assert p.poll() is None, f"{name} exited: {(logs / f'{name}.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "worker did not register with the master"
            time.sleep(0.2)  # polling a condition (the master's worker count), with a deadline

        cmd = [sys.executable, "-m", "tools.cli", "verify", "--json", "--partition-entries", "32",
               "--master", f"spark://127.0.0.1:{port}",
               "--store-dir", str(healthy_replicas[0]), "--store-dir", str(diverged)]
        res = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), **fast_jvm),
                             capture_output=True, text=True, timeout=240, check=False)
        assert res.returncode == 1, res.stderr[-3000:]
        rep = json.loads(res.stdout)
        assert rep["first_divergent_index"] == 130 and rep["ranges_diverged"] == 1
        assert [n["count"] for n in rep["nodes"]] == [180, 180]
        apps = list((tmp_path / "work").glob("app-*/0/stderr"))
        assert apps, "the job must have run on the standalone worker's executor"

        # The network source on the same cluster: executors read a running group's committed
        # log over ZeroMQ (no shared files) and export it.
        group = Cluster(tmp_path / "group", 1, data_file_size=32 << 20, index_file_size=4 << 20)
        group.start()
        try:
            group.wait_leader(30)
            with group.client() as cl:
                cl.append_batch([b"net-%d" % i for i in range(300)])
            out = tmp_path / "net.parquet"
            res = subprocess.run(
                [sys.executable, "-m", "tools.cli", "export", "--json", "--peers", group.peers,
                 "--from", "1", "--out", str(out), "--master", f"spark://127.0.0.1:{port}"],
                cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), **fast_jvm),
                capture_output=True, text=True, timeout=240, check=False)
            assert res.returncode == 0, res.stderr[-3000:]
            assert json.loads(res.stdout)["rows"] == 300
            assert len(list((tmp_path / "work").glob("app-*/0/stderr"))) == len(apps) + 1
        finally:
            group.close()
    finally:
        for p in reversed(procs):
            _stop(p)
