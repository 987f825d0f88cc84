"""How the node and the tools start a Python child of their own: with our packages, never a
namesake's.

Our import names are short and common (`node`, `ipc`, `tools`). `python -m tools.cli` puts the
current directory first on `sys.path`, so a `dledger cluster` run from a project that has a
`tools/` package of its own would start that project's `tools.cli` as its nodes. Every child we
start with `-m` therefore runs with `-P` (Python 3.11: no unsafe path prepended) and with the
directory that holds our packages first on PYTHONPATH (the checkout, or site-packages when
installed), which is where the parent's own `node` package was imported from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds `node/`, `ipc/` and `tools/` (this file is node/host/interpreter.py)."""


def module_command(module: str, *args: str) -> list[str]:
    """`python -P -m module args...` with this interpreter."""
    return [sys.executable, "-P", "-m", module, *args]


def child_env(base: Mapping[str, str] | None = None, root: Path | str | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `root` (default: our packages' directory)
    first on PYTHONPATH, so that a `-P -m` child imports the same packages this process did."""
    env = dict(os.environ if base is None else base)
    first = str(root if root is not None else PACKAGE_ROOT)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != first]
    env["PYTHONPATH"] = os.pathsep.join([first, *rest])
    return env
