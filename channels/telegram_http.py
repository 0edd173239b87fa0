"""python-telegram-bot's HTTP requests over aiohttp instead of httpx.

PTB reaches the Bot API through a ``BaseRequest``, and documents that class as the place to
plug in another HTTP library. Its default, ``HTTPXRequest``, spent more CPU per reply than the
rest of a message's trip together: httpx builds and parses each request in several layers, and
httpcore checks every pooled connection with a syscall on every request. aiohttp does the same
POST for a fraction of that (measured in bench/RESULTS.md, "Durable delivery"), and it is
the client library we already use for Discord and the web tools. Errors map to PTB's own
``TimedOut`` and ``NetworkError``, so the library's retries and our ``SendFailed`` see what
they saw before. ``channels.telegram.proxy`` must be an HTTP(S) proxy: aiohttp has no SOCKS.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from urllib.parse import urlencode
from typing import Any

import aiohttp
import certifi
from telegram._utils.defaultvalue import DefaultValue
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

# PTB's HTTPXRequest defaults, so the timeouts mean what they meant.
READ_TIMEOUT = WRITE_TIMEOUT = CONNECT_TIMEOUT = 5.0
MEDIA_WRITE_TIMEOUT = 20.0
FORM = "application/x-www-form-urlencoded"


class AiohttpRequest(BaseRequest):
    def __init__(self, connections: int, pool_timeout: float | None = 1.0, proxy: str | None = None) -> None:
        self._connections = connections
        self._pool_timeout = pool_timeout
        self._proxy = proxy  # an http:// or https:// URL (checked by the config)
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return READ_TIMEOUT

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ssl=_tls_context()),
                headers={"User-Agent": self.USER_AGENT})

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def do_request(self, url: str, method: str, request_data: RequestData | None = None,
                         read_timeout: Any = BaseRequest.DEFAULT_NONE, write_timeout: Any = BaseRequest.DEFAULT_NONE,
                         connect_timeout: Any = BaseRequest.DEFAULT_NONE,
                         pool_timeout: Any = BaseRequest.DEFAULT_NONE) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        files = request_data.multipart_data if request_data else None
        timeout = self._timeout(read_timeout, write_timeout, connect_timeout, pool_timeout, bool(files))
        try:
            async with self._session.request(method, url, data=_body(request_data, files), timeout=timeout,
                                             proxy=self._proxy) as response:
                return response.status, await response.read()
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc

    def _timeout(self, read: Any, write: Any, connect: Any, pool: Any, media: bool) -> aiohttp.ClientTimeout:
        """PTB's four timeouts (a value, None for none, or PTB's default marker). aiohttp has no
        write timeout, so a stalled upload is bounded by the sum of all four instead."""
        read, connect = _given(read, READ_TIMEOUT), _given(connect, CONNECT_TIMEOUT)
        write = _given(write, MEDIA_WRITE_TIMEOUT if media else WRITE_TIMEOUT)
        pool = _given(pool, self._pool_timeout)
        parts = (read, write, connect, pool)
        return aiohttp.ClientTimeout(total=None if None in parts else sum(parts),  # type: ignore[arg-type]
                                     connect=pool, sock_connect=connect, sock_read=read)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """certifi's roots, as httpx used (a machine with only Python may lack system CAs), read
    once for the process: that takes about 40 ms of CPU, and a bot has two requests (one for
    its calls, one for its updates), made again each time the channel restarts."""
    return ssl.create_default_context(cafile=certifi.where())


def _given(value: Any, default: float | None) -> float | None:
    return default if isinstance(value, DefaultValue) else value


def _body(request_data: RequestData | None, files: dict[str, Any] | None) -> Any:
    """Form fields as PTB's HTTPXRequest sends them; multipart only when there are files.
    Plain fields go as ready bytes: aiohttp's own form encoding cost a fifth of a send."""
    fields = request_data.json_parameters if request_data else {}
    if not files:
        return aiohttp.BytesPayload(urlencode(fields).encode(), content_type=FORM) if fields else None
    form = aiohttp.FormData(fields)
    for name, (filename, content, mimetype) in files.items():
        form.add_field(name, content, filename=filename, content_type=mimetype)
    return form
