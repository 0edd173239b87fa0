"""The registry of built-in tools, assembled from each tool family's module."""

from __future__ import annotations

from dataclasses import replace

from nanobot.config import Config
from nanobot.tools.registry import Tool, ToolRegistry

NO_NETWORK = "No network: use web_fetch."


def default_registry(config: Config) -> ToolRegistry:
    from nanobot.tools.cron_tools import CRON_TOOLS
    from nanobot.tools.files import FILE_TOOLS
    from nanobot.tools.messaging import MESSAGING_TOOLS
    from nanobot.tools.shell import SHELL_TOOLS
    from nanobot.tools.task_tools import TASK_TOOLS
    from nanobot.tools.web import WEB_TOOLS

    tools = [*FILE_TOOLS, *WEB_TOOLS, *MESSAGING_TOOLS, *CRON_TOOLS, *TASK_TOOLS]
    if config.tools.exec.enabled:
        tools += SHELL_TOOLS if config.tools.exec.network else [_without_network(t) for t in SHELL_TOOLS]
    return ToolRegistry(tools)


def _without_network(shell: Tool) -> Tool:
    """The shell tool saying, where the model reads first, that it cannot reach the network."""
    first, _, rest = shell.description.partition("\n\n")
    return replace(shell, description=f"{first} {NO_NETWORK}" + (f"\n\n{rest}" if rest else ""))
