"""One warm pool of Monty worker processes, shared by every session of the process.

Starting a pool spawns a worker subprocess; a checkout from a warm pool costs a fraction of a
millisecond. So the process keeps one ``AsyncMonty`` and starts it on first use, not at
import or at daemon start (a CLI command that never runs code never pays for it).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from pydantic_monty import AsyncMonty, AsyncMontySession

from nanobot.sandbox.limits import request_timeout_for

log = logging.getLogger(__name__)

# After leaving ``AsyncMonty`` a worker thread can still wake the event loop; if the loop is
# already closing, the whole process aborts. Giving it this long avoided that in every run.
_EXIT_GRACE_S = 0.2


class MontyPool:
    """A lazily started ``AsyncMonty``; ``close()`` it before the event loop ends."""

    def __init__(self, *, max_processes: int | None = None, request_timeout: float | None = None,
                 min_processes: int = 1) -> None:
        self.max_processes = max_processes
        self.request_timeout = request_timeout if request_timeout is not None else request_timeout_for()
        self.min_processes = min_processes
        self._monty: AsyncMonty | None = None
        self._starting = asyncio.Lock()

    @property
    def started(self) -> bool:
        return self._monty is not None

    async def start(self) -> AsyncMonty:
        """Spawn the workers (once); later calls return the running pool."""
        if self._monty is not None:
            return self._monty
        async with self._starting:
            if self._monty is None:
                monty = AsyncMonty(min_processes=self.min_processes, max_processes=self.max_processes,
                                   request_timeout=self.request_timeout)
                await monty.__aenter__()
                self._monty = monty
                log.debug("monty pool started (max_processes=%s)", self.max_processes)
        return self._monty

    async def open(self, **checkout: Any) -> AsyncMontySession:
        """Check a worker out for a session that outlives one call; give it back with ``release``."""
        monty = await self.start()
        session = monty.checkout(**checkout)
        await session.__aenter__()
        return session

    async def release(self, session: AsyncMontySession) -> None:
        """Return a session's worker. Never raises: a dead or cancelled worker is simply gone."""
        try:
            await session.__aexit__(None, None, None)
        except Exception as exc:  # the pool replaces broken workers itself
            log.debug("releasing a monty session failed: %s", exc)

    @asynccontextmanager
    async def session(self, **checkout: Any) -> AsyncIterator[AsyncMontySession]:
        """A one-off session (a cron job, a stateless run, a syntax check)."""
        session = await self.open(**checkout)
        try:
            yield session
        finally:
            await self.release(session)

    async def close(self) -> None:
        """Stop the workers and wait out the exit-abort window. Safe to call twice."""
        monty, self._monty = self._monty, None
        if monty is None:
            return
        try:
            await monty.__aexit__(None, None, None)
        finally:
            await asyncio.sleep(_EXIT_GRACE_S)
