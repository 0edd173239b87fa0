"""The stand-in servers' one way onto the loopback interface."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def serve(app: web.Application, port: int = 0, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """``app`` on 127.0.0.1 (a free port unless ``port`` is given): its runner, for cleanup, and
    the port it bound."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, runner.addresses[0][1]
