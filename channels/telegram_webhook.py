"""Telegram's webhook: Telegram posts each update to ``channels.telegram.webhook.url``; any
worker behind a load balancer may receive it.

A request without the secret (``X-Telegram-Bot-Api-Secret-Token``, compared in constant time)
is refused with 401 and logged at info: the internet knocks on every open port, which is not
an error of ours. An update is answered 200 only once it is recorded, so a crash or a database
outage (503) makes Telegram deliver it again; its update_id drops the repeat.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from nanobot.config import TelegramWebhook
from nanobot.sqlite_file import StoreUnavailable
from nanobot.listener import BadBody, Listener, read_json

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_UPDATE_BYTES = 1024 * 1024  # an update is a few KB; files are fetched separately


class WebhookServer:
    def __init__(self, config: TelegramWebhook, handle: Callable[[dict[str, Any]], Awaitable[None]],
                 timeout_s: float | None = None) -> None:
        self.config = config
        self.handle = handle  # records the update (raises StoreUnavailable when it cannot)
        app = web.Application(client_max_size=MAX_UPDATE_BYTES)
        app.router.add_post(self.config.path, self._update)
        self.listener = Listener(app, "channels.telegram.webhook.listen", timeout_s=timeout_s)

    async def start(self) -> None:
        await self.listener.start(*self.config.address())

    async def _update(self, request: web.Request) -> web.Response:
        # Headers are decoded with surrogateescape: bytes that are not UTF-8 must not raise here.
        secret = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(secret, self.config.secret_token.encode()):
            log.info("telegram webhook: refused a request from %s without the secret", request.remote)
            return web.Response(status=401, text="unauthorized")
        try:
            update = await read_json(request, MAX_UPDATE_BYTES)
        except BadBody as exc:
            log.info("telegram webhook: %s", exc)
            return web.Response(status=exc.status, text=str(exc))
        if not isinstance(update, dict):
            return web.Response(status=400, text="not an update")
        try:
            await self.handle(update)
        except StoreUnavailable as exc:  # not recorded: Telegram sends it again later
            log.warning("telegram webhook: update not recorded (%s); Telegram will retry it", exc)
            return web.Response(status=503, text="try again")
        return web.Response(text="ok")

    async def stop(self) -> None:
        await self.listener.stop()
