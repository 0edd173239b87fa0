"""The execution modes by name: tools (modes.py), code and hybrid (code_mode.py).

Lives above both modules so that each imports only downwards."""

from __future__ import annotations

from nanobot.agent.code_mode import CodeMode, HybridMode
from nanobot.agent.modes import ToolsMode
from nanobot.agent.turn import Mode


def get_mode(name: str) -> Mode:
    if name == "tools":
        return ToolsMode()
    if name == "code":
        return CodeMode()
    if name == "hybrid":
        return HybridMode()
    raise ValueError(f"unknown execution mode {name!r} (tools, code or hybrid)")
