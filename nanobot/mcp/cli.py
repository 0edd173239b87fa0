"""``nanobot mcp``: the configured servers, their functions, and one call by hand.

Each command starts the servers itself (a running gateway has its own connections), so
it works whether or not the gateway runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional

import typer

from nanobot.config import Config, load_config
from nanobot.utf8 import for_terminal, json_for_terminal

mcp_app = typer.Typer(name="mcp", no_args_is_help=True, rich_markup_mode=None, help="MCP servers: their state, functions, and a test call.")


def _config(ctx: typer.Context) -> Config:
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return load_config(obj.get("config"))[0]


def _some_configured(ctx: typer.Context) -> Config:
    """The config; with no server in it, that said and the command done."""
    config = _config(ctx)
    if not config.tools.mcp_servers:
        typer.echo("No MCP servers configured (tools.mcpServers).")
        raise typer.Exit(0)
    return config


@asynccontextmanager
async def _servers(config: Config, only: str | None = None) -> AsyncIterator[object]:
    from nanobot.mcp.servers import McpServers
    from nanobot.tools.builtin import default_registry

    if only is not None and only not in config.tools.mcp_servers:
        known = ", ".join(config.tools.mcp_servers) or "none configured (tools.mcpServers)"
        typer.echo(f"nanobot: no MCP server {only!r}; servers: {known}", err=True)
        raise typer.Exit(1)
    if only is not None:
        config = config.model_copy(deep=True)
        config.tools.mcp_servers = {only: config.tools.mcp_servers[only]}
    if logging.getLogger().level > logging.INFO:  # without -v: each command says a server's state itself
        logging.getLogger("nanobot.mcp").setLevel(logging.ERROR)
    servers = McpServers(config, default_registry(config), config.home / "logs")
    try:
        await servers.ensure_started()
        yield servers
    finally:
        await servers.close()


@mcp_app.command("list")
def list_servers(ctx: typer.Context) -> None:
    """Each server: transport, state, number of functions (exit 0 even when one is down)."""
    config = _some_configured(ctx)

    async def run() -> None:
        async with _servers(config) as servers:
            for line in servers.summary():
                typer.echo(for_terminal(line))  # a server's own words, when it is down
        for name, server in config.tools.mcp_servers.items():
            if not server.enabled:
                typer.echo(f"{name} ({server.transport}): disabled")

    asyncio.run(run())


@mcp_app.command("tools")
def list_tools(ctx: typer.Context, server: Optional[str] = typer.Argument(None, help="only this server")) -> None:
    """The functions the servers offer, as the Python stubs the model sees."""
    from nanobot.mcp.tools import McpTool

    config = _some_configured(ctx)

    async def run() -> None:
        async with _servers(config, server) as servers:
            for tool in servers.registry.tools():
                if isinstance(tool, McpTool):
                    typer.echo(for_terminal(tool.stub()))  # the server's words, shown
            for connection in servers.connections.values():
                if not connection.running:
                    typer.echo(f"# {connection.name}: {connection.state}", err=True)

    asyncio.run(run())


@mcp_app.command("call")
def call(ctx: typer.Context, server: str = typer.Argument(...), tool: str = typer.Argument(...),
         args: str = typer.Option("{}", "--args", metavar="JSON", help='arguments, e.g. \'{"query": "milk"}\'')) -> None:
    """Call one tool and print its result (exit 1 with the server's error)."""
    from nanobot.mcp.schema import ToolFailed, to_value

    try:
        arguments = json.loads(args)
        if not isinstance(arguments, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        typer.echo(f"nanobot: --args must be a JSON object ({exc})", err=True)
        raise typer.Exit(2)
    config = _config(ctx)

    async def run() -> int:
        async with _servers(config, server) as servers:
            connection = servers.connections[server]
            if not connection.running:
                why = connection.down_reason()
                typer.echo(for_terminal(f"nanobot: MCP server {server!r} is down: {why}"), err=True)
                return 1
            spec = next((t for t in connection.tools if t.name == tool), None)
            if spec is None:
                names = ", ".join(t.name for t in connection.tools) or connection.state
                typer.echo(f"nanobot: {server} has no tool {tool!r} ({names})", err=True)
                return 1
            try:
                value = to_value(await connection.call(tool, arguments), spec.output_schema)
            except (ToolFailed, RuntimeError, TimeoutError) as exc:
                typer.echo(for_terminal(f"nanobot: {server} {tool}: {exc}"), err=True)
                return 1
        typer.echo(for_terminal(value) if isinstance(value, str) else json_for_terminal(value, indent=2))
        return 0

    sys.exit(asyncio.run(run()))
