"""Shared fixtures. Integration fixtures that start node processes live in
tests/integration/conftest.py; this file only holds what every test may use."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYTHONHASHSEED", "0")
