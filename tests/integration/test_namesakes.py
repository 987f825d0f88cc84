"""Our import names are short and common (`node`, `ipc`, `tools`): a user's project may have
packages of the same names. `dledger cluster` run from such a project's directory, through the
installed `dledger` command, must start our nodes and roles, never the project's namesakes
(`python -m` puts the current directory first on sys.path; the children run with `-P` and our
packages first on PYTHONPATH: node/host/interpreter.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import wait_for

pytestmark = pytest.mark.integration

NAMESAKE = """import os, pathlib
pathlib.Path(os.environ["NAMESAKE_MARKER"]).write_text(__name__)
raise SystemExit(3)
"""


def _project_with_namesakes(tmp_path: Path) -> Path:
    """A directory holding `node`, `ipc` and `tools` packages that are not ours: importing any
    of them leaves a marker file and exits 3."""
    project = tmp_path / "project"
    for pkg in ("node", "ipc", "tools"):
        (project / pkg).mkdir(parents=True)
        (project / pkg / "__init__.py").write_text(NAMESAKE)
    return project


def test_a_cluster_started_from_a_project_with_namesake_packages_runs_ours(tmp_path):
    project = _project_with_namesakes(tmp_path)
    marker = tmp_path / "namesake-imported"
    dledger = Path(sys.executable).parent / "dledger"
    assert dledger.exists(), "the dledger console script is not installed in this environment"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(NAMESAKE_MARKER=str(marker), TMPDIR=str(tmp_path))
    p = subprocess.Popen([str(dledger), "cluster", "--nodes", "1"], cwd=project, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        peers = p.stdout.readline().strip()
        assert peers.startswith("n0-127.0.0.1:"), (peers, p.stderr.read() if p.poll() is not None else "")
        key_line = p.stdout.readline().strip()  # a secure group: the admin client's key file
        assert key_line.startswith("key-file: "), key_line
        env["DLEDGER_KEY_FILE"] = key_line.split(": ", 1)[1]

        def leader() -> bool:
            assert not marker.exists(), f"a namesake package was imported as {marker.read_text()!r}"
            r = subprocess.run([str(dledger), "metadata", "--peers", peers, "--json", "--timeout", "2"],
                               cwd=project, env=env, capture_output=True, text=True, timeout=60)
            return r.returncode == 0 and json.loads(r.stdout)["leader"] == "n0"

        wait_for(leader, 60, "n0 leading")
        assert not marker.exists(), f"a namesake package was imported as {marker.read_text()!r}"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        p.communicate(timeout=60)
    assert p.returncode == 0
    assert not marker.exists()
