"""An HTTP proxy on loopback that records what passes through it.

    async with HttpProxy() as proxy:         # a forward proxy: proxy.url -> "http://127.0.0.1:PORT"
        ...
        proxy.seen                           # every URL asked for, in order

    async with HttpProxy(server_url, fails=lambda path, body: ...) as proxy:
        ...                                  # a reverse proxy: proxy.url stands in for server_url

Plain http:// targets only (the stand-ins are plain HTTP). As a forward proxy it is sent the
absolute URL and repeats the request to it; in front of one server (``upstream``) it repeats
each request there, except those ``fails`` picks: those it answers 502 (as a gateway whose
upstream is away) without passing them on.
"""

from __future__ import annotations

from typing import Callable

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"host", "proxy-connection", "proxy-authorization", "connection", "keep-alive",
               "content-length", "transfer-encoding"}


class HttpProxy:
    def __init__(self, upstream: str | None = None,
                 fails: Callable[[str, bytes], bool] = lambda path, body: False) -> None:
        self.upstream, self.fails = upstream.rstrip("/") if upstream else None, fails
        self.seen: list[str] = []
        self._runner = web.ServerRunner(web.Server(self._forward, handler_cancellation=True))  # a hang-up goes on
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> HttpProxy:
        self._session = aiohttp.ClientSession()
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.BaseRequest) -> web.Response:
        assert self._session is not None
        target = self.upstream + request.path_qs if self.upstream else str(request.url)
        self.seen.append(target)
        body = await request.read()
        if self.fails(request.path, body):
            return web.Response(status=502, text="bad gateway")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(request.method, target, headers=headers, data=body) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)
