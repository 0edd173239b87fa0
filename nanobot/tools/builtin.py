"""The registry of built-in tools, assembled from each tool family's module."""

from __future__ import annotations

from nanobot.config import Config
from nanobot.tools.registry import ToolRegistry


def default_registry(config: Config) -> ToolRegistry:
    from nanobot.tools.files import FILE_TOOLS
    from nanobot.tools.shell import SHELL_TOOLS
    from nanobot.tools.web import WEB_TOOLS

    tools = [*FILE_TOOLS, *WEB_TOOLS]
    if config.tools.exec.enabled:
        tools += SHELL_TOOLS
    return ToolRegistry(tools)
