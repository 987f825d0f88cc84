"""The simulator's modules (tools/sim/) import cleanly each on its own, in a fresh interpreter,
and their import graph has no cycle: `Sim` in world.py composes the scheduler, network,
faults, invariants and trace parts, and no part reaches back into world.py or into another part
that reaches it. Imports under `if TYPE_CHECKING:` are left out of the graph: they only name
types for annotations and never run, so they cannot make an import order fail."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SIM = ROOT / "tools" / "sim"


def sim_modules() -> list[str]:
    """Every module under tools/sim/, dotted, found by walking the files (not by importing them)."""
    return sorted(f"tools.sim.{p.stem}" for p in SIM.glob("*.py") if p.stem != "__init__")


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def runtime_imports(path: Path) -> set[str]:
    """The tools.sim modules `path` imports at run time: at module level or inside functions,
    not under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    known = set(sim_modules())

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            for child in node.orelse:  # type: ignore[attr-defined]
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in known:
                found.add(node.module)
            elif node.module == "tools.sim":
                found.update(f"tools.sim.{a.name}" for a in node.names if f"tools.sim.{a.name}" in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(f"tools.sim.{path.stem}")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (c := dfs(n)) is not None:
                return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := dfs(m)) is not None:
            return c
    return None


def sim_graph() -> dict[str, set[str]]:
    return {m: runtime_imports(SIM / f"{m.rsplit('.', 1)[1]}.py") for m in sim_modules()}


def test_the_walk_finds_the_parts_of_the_simulator() -> None:
    graph = sim_graph()
    for part in ("world", "scheduler", "network", "faults", "invariants", "actors"):
        assert f"tools.sim.{part}" in graph
    assert {"tools.sim.scheduler", "tools.sim.network", "tools.sim.faults",
            "tools.sim.invariants"} <= graph["tools.sim.world"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_leaves_out_type_only_imports(tmp_path: Path) -> None:
    f = tmp_path / "mod.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tools.sim.world import Sim\n"
                 "def g():\n    from tools.sim import actors\n")
    assert runtime_imports(f) == {"tools.sim.actors"}


def test_the_simulator_modules_import_one_another_without_a_cycle() -> None:
    assert find_cycle(sim_graph()) is None


@pytest.mark.parametrize("module", sim_modules())
def test_each_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    r = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_world_still_offers_what_the_runner_and_the_tests_import() -> None:
    from tools.sim import world

    for name in ("run_seed", "SimConfig", "Result", "ALL_FAULTS", "OPT_IN_FAULTS", "_tmp_root", "Sim",
                 "Violation"):
        assert hasattr(world, name), name
