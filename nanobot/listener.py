"""Every HTTP listener nanobot opens (the API and its page, the terminal's socket, the metrics,
the webhooks): one ``Listener`` to bind and one way to read a request's JSON body, so each keeps
the same promises.

- A connection that has not sent a whole request within ``timeout_s`` (``TIMEOUT_S``) is
  closed, and so is one idle that long between requests; a body that has not arrived within it
  ends the request (408). Without these, connections stalled in their headers were kept
  forever: 1,000 of them held 1,027 file descriptors, no key needed.
- An address that cannot be bound is one line naming the setting and the address (exit 1).
- A body that is not JSON (nested too deep, not UTF-8, cut off) is a ``BadBody`` with a
  status and one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import StreamReader, web

TIMEOUT_S = 30.0
BODY_TIMEOUT = web.AppKey("body_timeout_s", float)  # the listener's, for read_json


class ListenError(Exception):
    """The address cannot be bound (in use, not ours): one line naming the setting."""


class BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Listener:
    """``app`` served on an address (``start``) or a Unix socket (``start_unix``) until
    ``stop``, which is safe before a start and more than once. ``setting`` names the address in
    an error; ``timeout_s`` is ``TIMEOUT_S`` unless given."""

    def __init__(self, app: web.Application, setting: str, *, timeout_s: float | None = None) -> None:
        timeout_s = app[BODY_TIMEOUT] = timeout_s or TIMEOUT_S
        self.runner = web.AppRunner(app, access_log=None, keepalive_timeout=timeout_s)
        self.setting = setting
        self.port = 0  # the bound port (the address may say 0)

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (ListenError if it cannot be); the bound port."""
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, host, port).start()
        except OSError as exc:
            await self.runner.cleanup()
            raise ListenError(f"{self.setting}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self.runner.addresses[0][1]
        return self.port

    async def start_unix(self, path: str) -> None:
        await self.runner.setup()
        await web.UnixSite(self.runner, path).start()

    async def stop(self) -> None:
        await self.runner.cleanup()


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request's body whole, or ``BadBody`` (408 too slow, 413 too large). Read once: a
    later ``request.read()`` or ``text()`` (slack-bolt's) gets it again without waiting."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise BadBody(413, f"the body is over {max_bytes // 1024} KB")
    try:
        async with asyncio.timeout(timeout_s := request.app.get(BODY_TIMEOUT, TIMEOUT_S)):
            return await request.read()
    except TimeoutError:
        raise BadBody(408, f"the body did not arrive within {timeout_s:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, f"the body is over {max_bytes // 1024} KB") from None


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The request's body as JSON, or ``BadBody`` (400 not JSON, 408 too slow, 413 too large)."""
    raw = await read_body(request, max_bytes)
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
