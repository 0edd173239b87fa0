"""What a test waits on in a stand-in: every request it serves ticks, and ``wait_until``
looks at its condition again at each tick (never at a clock)."""

from __future__ import annotations

import asyncio
from typing import Callable


class Ticks:
    def __init__(self) -> None:
        self._tick = asyncio.Event()

    def ticked(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._tick.wait()
