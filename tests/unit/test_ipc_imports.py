"""The wire side (`ipc/`) imports cleanly on its own: every module in any order, in a fresh
interpreter, `KVClient` reachable from `ipc.client` without an import cycle (ipc.kv_client
imports ipc.client; ipc.client reaches back only lazily), and nothing under ipc/ imports the
node (node/ imports ipc/, never the reverse: what both need lives in ipc/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
IPC = ROOT / "ipc"


def ipc_modules() -> list[str]:
    """Every module under ipc/, dotted, found by walking the files (not by importing them)."""
    out = []
    for path in sorted(IPC.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_walk_finds_the_client_package() -> None:
    mods = ipc_modules()
    assert "ipc.client" in mods and "ipc.client.sessions" in mods and "ipc.kv_client" in mods


@pytest.mark.parametrize("order", ["sorted", "reversed", "kv_first", "leaves_first"])
def test_every_ipc_module_imports_in_a_fresh_interpreter(order: str) -> None:
    mods = ipc_modules()
    if order == "reversed":
        mods = mods[::-1]
    elif order == "kv_first":
        mods = ["ipc.kv_client"] + [m for m in mods if m != "ipc.kv_client"]
    elif order == "leaves_first":  # submodules before the package that re-exports them
        mods = sorted(mods, key=lambda m: (-m.count("."), m))
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in mods)
    r = run_fresh(code)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("code", [
    "import ipc.kv_client",
    "import ipc.client; ipc.client.KVClient; ipc.client.KVError",
    "from ipc.client import DLedgerClient, DLedgerError, DLedgerIndeterminateError, AppendResult, "
    "QueryResult, KVClient, KVError, Entry, Metadata, NodeInfo, ClientClosedError",
    "from ipc.client import KVClient\nimport ipc.kv_client\nassert ipc.kv_client.KVClient is KVClient",
])
def test_public_client_imports_work_without_a_cycle(code: str) -> None:
    r = run_fresh(code)
    assert r.returncode == 0, r.stderr


def test_an_unknown_name_is_an_attribute_error() -> None:
    r = run_fresh("import ipc.client\ntry:\n    ipc.client.NoSuchThing\nexcept AttributeError as e:\n"
                  "    print(e)\nelse:\n    raise SystemExit('no error')")
    assert r.returncode == 0 and "NoSuchThing" in r.stdout, r.stderr


def node_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of `node` or a submodule in `source`, at any depth
    (inside functions too: a lazy import is still a dependency)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names = [n.module]
        else:
            continue
        found += [(n.lineno, m) for m in names if m == "node" or m.startswith("node.")]
    return found


def test_the_check_sees_node_imports_wherever_they_are() -> None:
    src = "import os\nimport node\ndef f():\n    from node.store import codec\n    import node.core.sessions as s\n"
    assert node_imports(src) == [(2, "node"), (4, "node.store"), (5, "node.core.sessions")]
    assert node_imports("from nodes import x\nfrom ipc import node_names\n") == []


def test_no_module_under_ipc_imports_node() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: {mod}"
                 for path in sorted(IPC.rglob("*.py"))
                 for line, mod in node_imports(path.read_text())]
    assert offenders == []
