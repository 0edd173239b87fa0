"""Imports flow one way.

1. No module of nanobot reaches itself again through imports, those inside functions and
   type-only ones under ``TYPE_CHECKING`` included (a package's ``__init__`` aside).
2. Packages sit in a declared order (``LAYERS``, the lowest first): every import, at module
   level, inside a function or under ``TYPE_CHECKING``, points to the importer's layer or one
   below, and no two packages import each other, even through others. A lazy import for
   start-up speed is fine; it must point down like any other.
3. The channel adapters (``channels/``, installed as ``nanobot_channels``) use the plugin
   interface (``nanobot.channel_plugin``) and the foundation only, and nothing of nanobot
   imports them: they are found through their entry points.

A "package" is a folder of nanobot (``nanobot.agent``) or a module at its top
(``nanobot.config``); ``channels`` is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nanobot"
CHANNELS = ROOT / "channels"

FOUNDATION: list[list[str]] = [  # the top-level modules, in their own order (the lowest first)
    # Pieces that know no other module: names, the envelope, paths, small loops.
    ["nanobot", "nanobot.utf8", "nanobot.eventloop", "nanobot.filecache", "nanobot.listener", "nanobot.metrics",
     "nanobot.sdnotify", "nanobot.prompts", "nanobot.terminal_client", "nanobot.workspace_template",
     "nanobot.confine", "nanobot.chat_names", "nanobot.bus", "nanobot.beneath", "nanobot.workspace_quota",
     "nanobot.message_context", "nanobot.collector", "nanobot.chat_commands"],
    ["nanobot.config", "nanobot.backup"],  # the settings, and what needs only names
    # The process and its files: logging, the home's lock, the SQLite file, who does what once.
    ["nanobot.logs", "nanobot.tracing", "nanobot.gateway_lock", "nanobot.sqlite_file", "nanobot.coordination",
     "nanobot.periodic"],
    ["nanobot.postgres", "nanobot.database"],  # the stores' engines
    # Stores and the rules read from them: histories, access, trust, tasks, usage, health.
    ["nanobot.chat_state", "nanobot.session", "nanobot.session_files", "nanobot.session_rows", "nanobot.chat_names_legacy",
     "nanobot.tasks", "nanobot.usage", "nanobot.health", "nanobot.handles", "nanobot.access",
     "nanobot.trust", "nanobot.notices"],
]
LAYERS: list[list[str]] = [  # the lowest first
    *FOUNDATION,
    ["nanobot.providers"],  # the model, through the openai SDK
    ["nanobot.channel_plugin"],  # what a channel adapter is given and implements
    ["nanobot.delivery"],  # messages in and out, recorded
    ["nanobot.media", "nanobot.cron"],  # attachments; the cron store and schedules
    ["nanobot.tools"],  # the registry and the built-in functions
    ["nanobot.skills", "nanobot.mcp"],  # more functions
    ["nanobot.sandbox"],  # Monty runs programs with the functions
    ["nanobot.agent"],  # a turn
    ["nanobot.runtime"],  # everything a turn needs, started
    ["nanobot.cluster", "nanobot.heartbeat"],  # workers on PostgreSQL; the heartbeat's turns
    ["nanobot.api"],  # the API, the page, the terminal socket (through api.front_door)
    ["nanobot.gateway"],  # the daemon: channels, dispatcher, services
    ["channels"],  # the adapters (see ADAPTERS_MAY_USE)
    ["nanobot.cli", "nanobot.home_copy", "nanobot.entry", "nanobot.__main__"],  # the command
]
ADAPTERS_MAY_USE = {"nanobot.channel_plugin", *(module for layer in FOUNDATION for module in layer)}


def module_name(path: Path) -> str:
    if path.is_relative_to(CHANNELS):
        parts = ("nanobot_channels", *path.relative_to(CHANNELS).with_suffix("").parts)
    else:
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for root in (PACKAGE, CHANNELS) for p in root.rglob("*.py")}


def every_import(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of nanobot or its adapters in the file, wherever it is."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in ("nanobot", "nanobot_channels")]
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "nanobot_channels":
        return "channels"
    if len(parts) == 1:
        return "nanobot"
    return ".".join(parts[:2])


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def package_graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: where (file:line)}."""
    modules, graph = all_modules(), {}
    for name, path in modules.items():
        edges = graph.setdefault(package_of(name), {})
        for line, imported in every_import(path):
            module = imported if imported in modules else imported.rpartition(".")[0]  # a module, or a name in one
            if module in modules and (target := package_of(module)) != package_of(name):
                edges.setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth first)."""
    stack, seen = [(start, [start])], set[str]()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_two_modules_import_each_other_even_for_types() -> None:
    """A type-only import back is a circle too (a loop and its modes once imported each other
    so): what a module needs of its caller is a Protocol of its own, or a module both import."""
    modules = all_modules()
    graph = {}
    for name, path in modules.items():
        imported = {i if i in modules else i.rpartition(".")[0] for _, i in every_import(path)}
        graph[name] = {m for m in imported if m in modules and m != name and modules[m].name != "__init__.py"}
    assert "nanobot.agent.turn" in graph["nanobot.agent.loop"]  # the graph sees imports
    circles = [c for name in sorted(graph) if (c := circle_through(graph, name))]
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles[:3])


def test_every_package_has_a_layer() -> None:
    packages = {package_of(name) for name in all_modules()}
    declared = [p for layer in LAYERS for p in layer]
    assert len(declared) == len(set(declared)), "a package is declared twice"
    assert packages == set(declared), f"not declared: {packages - set(declared)}; gone: {set(declared) - packages}"


def test_imports_point_down_and_packages_form_no_circle() -> None:
    graph = package_graph()
    upward = [f"{where}: {package} imports {target} (a higher layer)"
              for package, edges in graph.items() for target, where in edges.items()
              if layer_of(target) > layer_of(package)]
    assert not upward, "\n".join(upward)
    circles = [c for p in sorted(graph) if (c := circle_through({k: set(v) for k, v in graph.items()}, p))]
    assert not circles, "package circles: " + "; ".join(" -> ".join(c) for c in circles[:3])


def test_adapters_use_the_plugin_interface_and_nothing_imports_them() -> None:
    graph = package_graph()
    beyond = {target: where for target, where in graph["channels"].items() if target not in ADAPTERS_MAY_USE}
    assert not beyond, f"channels/ reaches past the plugin interface: {beyond}"
    users = {package: edges["channels"] for package, edges in graph.items() if "channels" in edges}
    assert not users, f"nanobot imports an adapter (find it through its entry point): {users}"


def test_the_checks_see_an_upward_import(tmp_path: Path) -> None:
    """The order is checked over every kind of import: a lazy one and a type-only one count."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nanobot.gateway.app import Gateway\n"
                      "def later():\n    from nanobot.runtime import Runtime\n")
    assert [n for _, n in every_import(source)] == [
        "nanobot.gateway.app", "nanobot.gateway.app.Gateway", "nanobot.runtime", "nanobot.runtime.Runtime"]
    assert layer_of(package_of("nanobot.gateway.app")) > layer_of(package_of("nanobot.tools.web"))
