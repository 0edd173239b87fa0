"""The registry of built-in tools, assembled from each tool family's module."""

from __future__ import annotations

from nanobot.config import Config
from nanobot.tools.registry import ToolRegistry


def default_registry(config: Config) -> ToolRegistry:
    from nanobot.tools.cron_tools import CRON_TOOLS
    from nanobot.tools.files import FILE_TOOLS
    from nanobot.tools.messaging import MESSAGING_TOOLS
    from nanobot.tools.shell import SHELL_TOOLS
    from nanobot.tools.web import WEB_TOOLS

    tools = [*FILE_TOOLS, *WEB_TOOLS, *MESSAGING_TOOLS, *CRON_TOOLS]
    if config.tools.exec.enabled:
        tools += SHELL_TOOLS
    return ToolRegistry(tools)
