"""HTTP proxies on loopback that record what passes through them.

    async with ForwardProxy() as proxy:      # proxy.url -> "http://127.0.0.1:PORT"
        ...
        proxy.seen                           # every absolute URL asked for, in order

    async with ReverseProxy(server_url, fails=lambda path, body: ...) as proxy:
        ...                                  # proxy.url stands in for server_url

Plain http:// targets only (the stand-ins are plain HTTP). A forward proxy is sent the absolute
URL and repeats the request to it; a reverse proxy stands in front of one server, and answers
502 (as a gateway whose upstream is away) to the requests ``fails`` picks, without passing
them on.
"""

from __future__ import annotations

from typing import Callable

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"host", "proxy-connection", "proxy-authorization", "connection", "keep-alive",
               "content-length", "transfer-encoding"}


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self._runner = web.ServerRunner(web.Server(self._forward))
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> ForwardProxy:
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

    def target(self, request: web.BaseRequest) -> str:
        return str(request.url)

    async def _forward(self, request: web.BaseRequest) -> web.Response:
        assert self._session is not None
        self.seen.append(self.target(request))
        body = await request.read()
        if not self.passes(request.path, body):
            return web.Response(status=502, text="bad gateway")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(request.method, self.target(request), headers=headers,
                                         data=body) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)

    def passes(self, path: str, body: bytes) -> bool:
        return True


class ReverseProxy(ForwardProxy):
    def __init__(self, upstream: str, fails: Callable[[str, bytes], bool]) -> None:
        super().__init__()
        self.upstream, self.fails = upstream.rstrip("/"), fails

    def target(self, request: web.BaseRequest) -> str:
        return self.upstream + request.path_qs

    def passes(self, path: str, body: bytes) -> bool:
        return not self.fails(path, body)
