"""The configured MCP servers of one process (``tools.mcpServers``).

The gateway starts them all, concurrently, before it reports READY; ``nanobot agent`` starts
them when its first turn begins (``ensure_started``). Each server's tools join the one tool
registry as ``<server>_<tool>`` when it connects (also after a restart). A name that clashes
with a built-in or another server's tool is refused, with an error in the log and in
``nanobot mcp list``. A server that fails keeps being retried (see ``connection.py``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from nanobot.eventloop import Changed
from nanobot.mcp.connection import McpConnection
from nanobot.mcp.tools import McpTool, make_tool

if TYPE_CHECKING:
    from nanobot.config import Config
    from nanobot.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

SLOW_START_S = 2.0  # a turn waiting longer than this for the servers' start says so


class McpServers:
    def __init__(self, config: Config, registry: ToolRegistry, log_dir: Path | None = None,
                 changed: Changed | None = None) -> None:
        self.registry = registry
        self.changed = changed or Changed()  # set whenever a server's state changes (the gateway's state file)
        self.connections = {name: McpConnection(name, server, log_dir, on_connect=self._reconnected,
                                                on_state=self.changed.set)
                            for name, server in config.tools.mcp_servers.items() if server.enabled}
        self.clashes: dict[str, list[str]] = {}  # server -> refused tool names
        self._started: asyncio.Task[None] | None = None

    async def ensure_started(self, waiting: Callable[[str], Awaitable[None]] | None = None) -> None:
        """Start every server once (concurrently); later calls wait for that same start. One that
        takes more than a moment is said to ``waiting`` (a chat would otherwise see nothing for
        up to a server's startTimeout)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start_all())
        if waiting is not None and not (await asyncio.wait({self._started}, timeout=SLOW_START_S))[0]:
            names = ", ".join(name for name, c in self.connections.items() if c.state == "starting")
            await waiting(f"(Waiting for MCP servers to start: {names}.)")
        await asyncio.shield(self._started)

    async def _start_all(self) -> None:
        await asyncio.gather(*(c.start() for c in self.connections.values()))
        for connection in self.connections.values():  # (one that failed said why, once)
            self.register(connection)

    def register(self, connection: McpConnection) -> None:
        """Put the server's listed tools into the registry, refusing name clashes."""
        refused = []
        for spec in connection.tools:
            tool = make_tool(connection, spec)
            existing = self.registry.get(tool.name)
            if existing is not None and not (isinstance(existing, McpTool) and existing.server == connection.name):
                owner = f"MCP server {existing.server!r}" if isinstance(existing, McpTool) else "a built-in"
                log.error("MCP server %s: tool %r is refused: %s is already %s's", connection.name, spec.name,
                          tool.name, owner)
                refused.append(f"{spec.name} (clashes with {owner} {tool.name})")
                continue
            self.registry.register(tool)
        self.clashes[connection.name] = refused
        self.changed.set()  # its tools are counted now (status)

    def _reconnected(self, connection: McpConnection) -> None:
        """A restart may bring a changed tool list (the first start registers them all at once)."""
        if self._started is not None and self._started.done():
            self.register(connection)

    def states(self) -> dict[str, str]:
        """Each server's state for a person: its tool count when running, why not when not."""
        return {name: f"{c.state}, {self.tool_count(name)} tools" if c.running
                else c.state if c.state == "starting" else f"down: {c.down_reason()}"
                for name, c in self.connections.items()}

    def tool_count(self, name: str) -> int:
        return sum(1 for t in self.registry.tools() if isinstance(t, McpTool) and t.server == name)

    def summary(self) -> list[str]:
        """One line per server: state and tool count (``nanobot mcp list``, ``status``)."""
        lines = []
        for (name, c), state in zip(self.connections.items(), self.states().values()):
            line = f"{name} ({c.config.transport}): {state}"
            if self.clashes.get(name):
                line += f"; refused: {', '.join(self.clashes[name])}"
            lines.append(line)
        return lines

    async def close(self) -> None:
        if self._started is not None and not self._started.done():
            self._started.cancel()
        await asyncio.gather(*(c.close() for c in self.connections.values()))
