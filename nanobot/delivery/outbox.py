"""How recorded messages are retried: a failed send is tried again for as long as the
platform is down (up to ``GIVE_UP_S``), and a ``SendGate`` per channel lets one send probe at
a time, every 0.25 s doubling to 2 s, while the chat's later messages wait behind it, so order
is kept and the first reply goes out within seconds of recovery. Recording, sending and
marking are ``gateway.outbound.Outbound``'s; the rows are the delivery store's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from nanobot.channel_plugin import SendFailed


GIVE_UP_S = 24 * 3600  # a message still not accepted after this long is dropped (logged)


class SendGate:
    """One channel's health, as its sends see it. While it is down, one send at a time
    probes, after a wait that doubles from ``first`` to ``cap``; the others wait their turn,
    so a dead API gets one request every few seconds, not one per waiting chat."""

    def __init__(self, first: float = 0.25, cap: float = 2.0) -> None:
        self.first = first  # seconds before the first probe
        self.cap = cap  # the longest wait between probes: a recovered platform is noticed this soon
        self.delay = 0.0  # 0: healthy
        self._until = 0.0
        self._probe = asyncio.Lock()

    @property
    def down(self) -> bool:
        return self.delay > 0

    async def attempt(self, send: Callable[[], Awaitable[None]]) -> None:
        if self.down:
            async with self._probe:
                if self.down:  # this send is the probe; the others wait for its outcome
                    await asyncio.sleep(max(0.0, self._until - time.monotonic()))
                    return await self._try(send)
        await self._try(send)  # healthy (again): no queueing behind the lock

    async def _try(self, send: Callable[[], Awaitable[None]]) -> None:
        try:
            await send()
        except SendFailed as exc:
            if exc.retry:
                self.delay = min(self.cap, self.delay * 2 if self.delay else self.first)
                self._until = time.monotonic() + self.delay
            raise
        self.delay = 0.0
