"""One MCP server: connect, list its tools, call them, survive its crashes.

The SDK's ``Client`` is an async context whose task group must be entered and left by the
same task, so each server has a holder task that keeps the connection open; calls come
from any task (turns, cron jobs) and share it. A call that finds the connection closed (the
process died, the HTTP server went away) wakes the holder, which reconnects with backoff
(1 s doubling to 60 s) while the functions raise "not available". A call past its timeout
is cancelled, which the SDK forwards to the server as ``notifications/cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from nanobot.config import McpServer
from nanobot.eventloop import Background

log = logging.getLogger(__name__)

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 60.0
# A stdio server's stderr file past this is kept as ``.1`` and emptied: the server writes to it
# itself, for the months the daemon runs.
MAX_LOG_BYTES = 5_000_000


class ServerUnavailable(RuntimeError):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"MCP server {name!r} is not available: {why}")


class McpConnection:
    def __init__(self, name: str, config: McpServer, log_dir: Path | None = None, *,
                 on_connect: Callable[[McpConnection], None] = lambda connection: None,
                 on_state: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.config = config
        self.log_dir = log_dir
        self.tools: list[Any] = []  # mcp.types.Tool, as listed at the last connect
        self.state = "not started"
        self.error = ""
        self._repeating = False  # failing again as it failed before: said once (a server down for days)
        self._client: Any = None
        self._attempted = asyncio.Event()  # the first connection attempt is over, either way
        self._lost = asyncio.Event()
        self._closing = False
        self._holder = Background()  # holds the session, reconnecting, until close()
        self._errlog: TextIO | None = None
        self.on_connect = on_connect  # tools (re)listed
        self.on_state = on_state  # the state changed (for status)

    @property
    def running(self) -> bool:
        return self._client is not None

    @property
    def log_file(self) -> Path | None:
        """Where a stdio server's stderr goes (what it said before it died is there)."""
        if self.config.transport != "stdio" or self.log_dir is None:
            return None
        return self.log_dir / f"mcp-{self.name}.log"

    def down_reason(self) -> str:
        """Why the server cannot be used, for a person: its state, and its log when it has one."""
        why = self.error or self.state
        if "connection closed" in why.lower():
            why = f"it exited or closed the connection ({why})"
        return f"{why}; its log: {self.log_file}" if self.log_file else why

    async def start(self) -> bool:
        """Connect and list the tools, within ``startTimeout``; False (and why, in ``error``) if not
        (it is tried again meanwhile, as after a crash)."""
        self._set_state("starting")
        self._holder.run(self._hold(), name=f"mcp {self.name}")
        await self._attempted.wait()
        return self.running

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The raw ``CallToolResult``; ServerUnavailable, or TimeoutError past ``toolTimeout``."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        client = self._client
        if client is None:
            raise ServerUnavailable(self.name, self.down_reason())
        if self._errlog is not None and os.fstat(self._errlog.fileno()).st_size > MAX_LOG_BYTES:
            await asyncio.to_thread(self._trim_log)
        try:
            async with asyncio.timeout(self.config.tool_timeout):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            raise TimeoutError(f"{self.name}_{tool}: no answer within {self.config.tool_timeout:g} s "
                               f"(tools.mcpServers.{self.name}.toolTimeout); the call was cancelled") from None
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise RuntimeError(f"{self.name}_{tool}: {exc.message}") from None
            self._connection_lost("the connection closed (did the server crash?)")
            raise ServerUnavailable(self.name, "the connection closed during the call") from None
        except (OSError, EOFError) as exc:  # anyio's closed streams, a reset socket
            self._connection_lost(f"{type(exc).__name__}: {exc}")
            raise ServerUnavailable(self.name, f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        """Leave the session: the SDK ends a stdio child (stdin closed, then terminated)."""
        self._closing = True
        self._lost.set()
        await self._holder.stop(grace=10)
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None
        self._set_state("stopped")

    # ---- the holder task ---------------------------------------------------------------
    async def _hold(self) -> None:
        delay = RESTART_FIRST_S
        while not self._closing:
            connected_at = time.monotonic()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except TimeoutError:  # (``uvx`` fetching a package on its first run may well pass it)
                self._set_state("failed", f"no answer within startTimeout ({self.config.start_timeout:g} s)")
            except BaseException as exc:  # an ExceptionGroup from the SDK's task groups, too
                self._set_state("failed", _reason(exc))
            finally:
                self._client = None
                self._attempted.set()
            if self._closing:
                return
            if time.monotonic() - connected_at > RESTART_MAX_S:
                delay = RESTART_FIRST_S  # it ran a good while: a fresh crash, not a crash loop
            self._set_state("restarting", f"in {delay:g} s after: {self.error}")
            self._lost.clear()
            with contextlib.suppress(TimeoutError):  # close() sets it: a stop waits for no backoff
                await asyncio.wait_for(self._lost.wait(), delay)
            delay = min(RESTART_MAX_S, delay * 2)

    async def _session(self) -> None:
        from mcp import Client

        self._lost.clear()
        async with contextlib.AsyncExitStack() as held:  # the client, held past the timeout's block
            async with asyncio.timeout(self.config.start_timeout):  # each try: one that hangs is tried again
                client = await held.enter_async_context(Client(self._transport()))
                tools = await _list_tools(client)
            allowed = self.config.allowed_tools
            self.tools = [t for t in tools if allowed is None or t.name in allowed]
            if unlisted := sorted(set(allowed or ()) - {t.name for t in tools}):  # a typo offers nothing
                log.warning("MCP server %s: allowedTools names %s, which it does not list (it lists: %s)",
                            self.name, ", ".join(unlisted), ", ".join(t.name for t in tools))
            self._client = client
            self._set_state("running")
            self._attempted.set()
            self.on_connect(self)
            await self._lost.wait()

    def _transport(self) -> Any:
        from mcp import StdioServerParameters

        c = self.config
        if c.transport == "stdio":
            return _Stdio(StdioServerParameters(command=c.command or "", args=list(c.args),
                                                env=dict(c.env) or None, cwd=c.cwd), self._stderr())
        if c.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url or "", headers=dict(c.headers) or None, timeout=c.start_timeout)
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        return streamable_http_client(c.url or "", http_client=create_mcp_http_client(headers=dict(c.headers) or None))

    def _stderr(self) -> TextIO:
        """A stdio server's stderr goes to ``logs/mcp-<name>.log`` in the home, not the terminal."""
        if self._errlog is None:
            if self.log_dir is None:
                return sys.stderr
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._errlog = open(self.log_file or self.log_dir / f"mcp-{self.name}.log", "a", encoding="utf-8")
        if os.fstat(self._errlog.fileno()).st_size > MAX_LOG_BYTES:  # (each try: a crash loop writes too)
            self._trim_log()
        return self._errlog

    def _trim_log(self) -> None:
        """The stderr file copied to ``.1`` and emptied in place: the server holds it open for
        appending, so its next line goes to the start of the emptied file."""
        assert self._errlog is not None
        shutil.copyfile(self._errlog.name, f"{self._errlog.name}.1")
        os.truncate(self._errlog.fileno(), 0)

    def _connection_lost(self, why: str) -> None:
        if self._client is not None:
            log.warning("MCP server %s: %s", self.name, why)
            self._client = None
            self.error = why
            self._lost.set()

    def _set_state(self, state: str, error: str = "") -> None:
        if state == "failed":
            # A server down for days is retried each minute, for the same reason each time: said
            # once, until it runs again or fails otherwise.
            self._repeating = error == self.error and self.state.startswith("restarting")
            self.error = error
            (log.debug if self._repeating else log.warning)("MCP server %s failed: %s", self.name, error)
        elif state == "restarting":
            (log.debug if self._repeating else log.info)("MCP server %s: restarting %s", self.name, error)
        self.state = f"{state}: {error}" if error else state
        self.on_state()


class _Stdio:
    """``stdio_client`` with our stderr file: the SDK's transport takes it as ``errlog``."""

    def __init__(self, params: Any, errlog: TextIO) -> None:
        from mcp.client.stdio import stdio_client

        self._cm = stdio_client(params, errlog=errlog)

    async def __aenter__(self) -> Any:
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cm.__aexit__(*exc)


async def _list_tools(client: Any) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _reason(exc: BaseException) -> str:
    """The innermost useful line of an error (the SDK wraps them in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
