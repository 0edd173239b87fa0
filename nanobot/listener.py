"""Every HTTP listener nanobot opens (the API and its page, Telegram's webhook): one way to bind
and one way to read a request's JSON body, so each keeps the same promises.

- A connection that has not sent a whole request within ``HEADER_TIMEOUT_S`` is closed, and so
  is one idle that long between requests; a body that has not arrived within
  ``BODY_TIMEOUT_S`` ends the request (408). Without these, connections stalled in their
  headers were kept forever: 1,000 of them held 1,027 file descriptors, no key needed.
- An address that cannot be bound is one line naming the setting and the address (exit 1).
- A body that is not JSON (nested too deep, not UTF-8, cut off) is a ``BadBody`` with a
  status and one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import StreamReader, web

HEADER_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 30.0


class ListenError(Exception):
    """The address cannot be bound (in use, not ours): one line naming the setting."""


class BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def listen(app: web.Application, host: str, port: int, setting: str) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port``; the runner (``cleanup()`` stops it) and the bound port."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(f"{setting}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return runner, runner.addresses[0][1]


async def unix_runner(app: web.Application) -> web.AppRunner:
    """A runner for a Unix socket's app, with the same connection timeouts."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT_S)
    await runner.setup()
    return runner


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The request's body as JSON, or ``BadBody`` (400 not JSON, 408 too slow, 413 too large)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise BadBody(413, f"the body is over {max_bytes // 1024} KB")
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            raw = await request.read()
    except TimeoutError:
        raise BadBody(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, f"the body is over {max_bytes // 1024} KB") from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadBody(400, "the body is not valid JSON: nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadBody(400, f"the body is not valid JSON: {exc}") from None


async def read_whole(content: StreamReader, limit: int) -> bytes:
    """A body whole (a chunked one too), or 413 once it passes ``limit`` bytes (a ValueError
    subclass, so a client's caller may catch it as "too big"). ``StreamReader.read(n)``
    returns what has arrived so far, not ``n`` bytes: a single read once kept 557 KB of 5 MB."""
    chunks, size = [], 0
    while chunk := await content.read(1 << 16):
        size += len(chunk)
        if size > limit:
            raise TooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


class TooLarge(web.HTTPRequestEntityTooLarge, ValueError):
    """Past the limit: 413 to an HTTP client, a ValueError to anyone else."""
