"""Tell a user the owner approved them: ``nanobot pairing approve`` runs in another process,
so the gateway looks for fresh approvals every couple of seconds and sends each one line to
the private chat the pairing code went to."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Collection

from nanobot.access import WELCOME, PairingStore
from nanobot.bus import MessageBus, OutboundMessage

log = logging.getLogger(__name__)


class PairingWelcome:
    def __init__(self, store: Callable[[], PairingStore | None], bus: MessageBus,
                 running_channels: Callable[[], Collection[str]], *, interval: float = 2.0) -> None:
        self.store, self.bus, self.running_channels, self.interval = store, bus, running_channels, interval
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name="pairing welcome")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            try:
                await self.welcome_new()
            except Exception:  # a locked database, say: try again next time
                log.exception("pairing: could not check for new approvals")
            await asyncio.sleep(self.interval)

    async def welcome_new(self) -> None:
        store = self.store()
        if store is None:
            return
        for user in await store.unwelcomed():
            if user.channel not in self.running_channels():
                continue  # told once the channel runs again
            await self.bus.publish_outbound(OutboundMessage(user.channel, user.chat_id or user.sender_id, WELCOME))
            await store.mark_welcomed(user)
            log.info("pairing: told %s user %s they were approved", user.channel, user.sender_id)
