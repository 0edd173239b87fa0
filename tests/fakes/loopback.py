"""The stand-in servers' one way onto the loopback interface."""

from __future__ import annotations

import socket
from typing import Any

from aiohttp import web


async def serve(app: web.Application, port: int = 0, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """``app`` on 127.0.0.1 (a free port unless ``port`` is given): its runner, for cleanup, and
    the port it bound."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, runner.addresses[0][1]


def free_port() -> int:
    """A port nothing listens on now (for a listener to take, or to find closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
