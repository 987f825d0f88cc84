"""Shared fixtures. Integration fixtures that start node processes live in
tests/integration/conftest.py; this file only holds what every test may use."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYTHONHASHSEED", "0")

try:  # property tests: bounded by example counts, never by time (a busy CI machine is 2x slower)
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("dledger", deadline=None)
    _hypothesis_settings.load_profile("dledger")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


def pytest_runtest_logreport(report):
    """With DLEDGER_TEST_TIMES=FILE, one line per test phase as it ends ("setup|call|teardown
    seconds outcome nodeid"): the durations of a run that is stopped or times out are still
    on record, which `--durations` (printed at the end only) does not give."""
    path = os.environ.get("DLEDGER_TEST_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.when} {report.duration:.2f} {report.outcome} {report.nodeid}\n")
