"""The stand-in servers' one way onto the loopback interface."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Any, Iterator

from aiohttp import web


async def serve(app: web.Application, port: int = 0, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """``app`` on 127.0.0.1 (a free port unless ``port`` is given): its runner, for cleanup, and
    the port it bound."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, runner.addresses[0][1]


def free_port() -> int:
    """A port nothing listens on now, for a listener to take."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def closed_port() -> Iterator[int]:
    """A port refused for as long as it is held: bound, never listened on (one free_port gave
    could be taken meanwhile by another test's server, which would then answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
