"""Imports flow one way: no module of nanobot reaches itself again through imports that run
(type-only imports under ``TYPE_CHECKING`` are left out; imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nanobot"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class RuntimeImports(ast.NodeVisitor):
    def __init__(self, known: set[str]) -> None:
        self.known, self.found = known, set[str]()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module in self.known:
            self.found.add(node.module)
            self.found.update(f"{node.module}.{a.name}" for a in node.names
                              if f"{node.module}.{a.name}" in self.known)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name in self.known)


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        visitor = RuntimeImports(set(paths))
        visitor.visit(ast.parse(path.read_text()))
        graph[name] = visitor.found - {name}
    return graph


def circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth first)."""
    stack, seen = [(start, [start])], set[str]()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert "nanobot.agent.loop" in graph and graph["nanobot.agent.loop"]
    circles = [c for name in sorted(graph) if (c := circle_through(graph, name))]
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles[:3])
