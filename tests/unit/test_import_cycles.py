"""No runtime import cycle among the project's modules (node/, ipc/, tools/).

A cycle makes a module's names depend on which module was imported first (a half-initialised
module raises ImportError for one order only). Counted: imports that run when a module is
imported (module level, including inside `try`/`if` blocks); not counted: imports under
`if TYPE_CHECKING:` (annotations only) and imports inside functions (run later, when every
module is complete)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "ipc", "tools")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_imports(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_imports(node.body)
            yield from _import_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_time_imports(block)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if ".venv" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in _import_time_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # importing a.b.c runs a, a.b and a.b.c (those not yet imported)
                parts = t.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    # A package is already initialising when its own submodules import
                    # through it: that edge is not a cycle.
                    if name in modules and name != mod and not mod.startswith(name + "."):
                        graph[mod].add(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_the_project() -> None:
    g = _graph()
    assert "node.roles.handler" in g and "ipc.client.api" in g and "tools.cli" in g
    assert "node.core.leader" in g["node.roles.handling.appends"] or any(
        d.startswith("node.core") for d in g["node.roles.handling.appends"])


def test_no_runtime_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "runtime import cycle: " + " -> ".join(cycle)
