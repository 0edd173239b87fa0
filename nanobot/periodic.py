"""A gateway service that does one thing every so often, for as long as the daemon runs."""

from __future__ import annotations

import asyncio
import logging

from nanobot.coordination import Alone, Singletons
from nanobot.eventloop import Background

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``tick()`` every ``interval`` seconds (the first time after one interval, or at
    once with ``tick_first``). A failing tick is logged and the next one runs anyway: one bad
    moment must not end the service for the months the daemon lives. With
    ``once_across_workers`` only the worker holding the service's singleton ticks; if it
    dies, another one takes the singleton at its next tick."""

    name = "periodic"
    tick_first = False
    # Among workers (nanobot.coordination), tick on one of them only: the one holding ``name``.
    once_across_workers = False

    def __init__(self, interval: float, singletons: Singletons | None = None) -> None:
        self.interval = interval
        self.singletons: Singletons = singletons or Alone()  # the gateway's: among workers, shared
        self._ticking = Background()

    async def tick(self) -> object:
        raise NotImplementedError

    async def start(self) -> None:
        self._ticking.run(self._loop(), name=self.name)

    async def stop(self) -> None:
        await self._ticking.stop()

    async def _loop(self) -> None:
        if not self.tick_first:
            await asyncio.sleep(self.interval)
        while True:
            try:
                if not self.once_across_workers or await self.singletons.try_hold(self.name) is not None:
                    await self.tick()
            except Exception:
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval)
