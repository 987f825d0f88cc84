"""`make run` installs the package alone; `make test` the test and spark extras, everything the
suite needs from a clean clone. Read from the real Makefile (`make -n -B`: what would run from
scratch) and setup.cfg, so a merge that puts pyspark back under `make run` fails here."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, str]:
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(ROOT / "setup.cfg")
    return dict(cp["options.extras_require"])


def _dry_run(target: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make here")
    r = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_run_installs_no_extra():
    installs = [ln for ln in _dry_run("run").splitlines() if "pip install" in ln and "-e" in ln]
    assert installs == [".venv/bin/python -m pip install --quiet -e '.'"], installs


def test_make_test_installs_the_test_and_spark_extras():
    installs = [ln for ln in _dry_run("test").splitlines() if "pip install" in ln and "-e" in ln]
    assert installs == [".venv/bin/python -m pip install --quiet -e '.[test,spark]'"], installs


def test_spark_is_its_own_extra_and_not_in_test():
    extras = _extras()
    assert "pyspark" in extras["spark"] and "pyarrow" in extras["spark"]
    assert "pyspark" not in extras["test"] and "spark" not in extras["test"]
    assert "pytest" in extras["test"]


def test_shtab_is_a_dependency():
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(ROOT / "setup.cfg")
    assert "shtab" in cp["options"]["install_requires"]
