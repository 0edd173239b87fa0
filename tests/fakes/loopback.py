"""The stand-in servers' one way onto the loopback interface."""

from __future__ import annotations

import itertools
import os
import random
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


# Ports for listeners a test configures before they start (gateway.api.listen, a webhook): from
# below the kernel's ephemeral range (32768-60999 on Linux), one block for each test process. A
# port the kernel gave (bind to 0) could be handed to another process's server or connection in
# the moment before the listener took it ("address already in use", once in a few hundred runs).
_PORTS_FROM, _BLOCK = 20000, 2000
_ports = itertools.count(random.randrange(_BLOCK))  # two runs at once start apart


def free_port() -> int:
    """A port nothing listens on now, none other of this run's test processes is given, and the
    kernel hands out to nobody, for a listener to take."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 6
    for _ in range(_BLOCK):
        port = _PORTS_FROM + worker * _BLOCK + next(_ports) % _BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (another run, a server of this one still closing)
            return port
    raise RuntimeError(f"no free port in {_PORTS_FROM + worker * _BLOCK}+{_BLOCK}")


@contextmanager
def closed_port() -> Iterator[int]:
    """A port refused for as long as it is held: bound, never listened on (one free_port gave
    could be taken meanwhile by another test's server, which would then answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
