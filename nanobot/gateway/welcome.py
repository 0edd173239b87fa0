"""Tell a user the owner approved them: ``nanobot pairing approve`` runs in another process,
so the gateway looks for fresh approvals every couple of seconds and sends each one line to
the private chat the pairing code went to."""

from __future__ import annotations

import logging
from typing import Callable, Collection

from nanobot.access import WELCOME, PairingStore
from nanobot.bus import MessageBus, OutboundMessage
from nanobot.coordination import Singletons
from nanobot.periodic import Periodic

log = logging.getLogger(__name__)

WELCOME_EVERY_S = 2.0  # how soon an approval (by `nanobot pairing approve`, another process) is noticed


class PairingWelcome(Periodic):
    name = "pairing welcome"
    once_across_workers = True
    tick_first = True

    def __init__(self, store: PairingStore, bus: MessageBus, running_channels: Callable[[], Collection[str]],
                 singletons: Singletons | None = None, *, every_s: float = WELCOME_EVERY_S) -> None:
        super().__init__(every_s, singletons)
        self.store, self.bus, self.running_channels = store, bus, running_channels

    async def tick(self) -> None:
        for user in await self.store.unwelcomed():
            if user.channel not in self.running_channels():
                continue  # told once the channel runs again
            await self.bus.publish_outbound(OutboundMessage(user.channel, user.chat_id or user.sender_id, WELCOME))
            await self.store.mark_welcomed(user)
            log.info("pairing: told %s user %s they were approved", user.channel, user.sender_id)
