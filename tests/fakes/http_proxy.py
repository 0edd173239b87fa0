"""A forward HTTP proxy on loopback that records what passes through it.

    async with ForwardProxy() as proxy:      # proxy.url -> "http://127.0.0.1:PORT"
        ...
        proxy.seen                           # every absolute URL asked for, in order

Plain http:// targets only (the stand-ins are plain HTTP): the client sends the absolute URL
to the proxy, which repeats the request to it.
"""

from __future__ import annotations

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

    async def _forward(self, request: web.BaseRequest) -> web.Response:
        assert self._session is not None
        self.seen.append(str(request.url))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(request.method, str(request.url), headers=headers,
                                         data=await request.read()) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)
