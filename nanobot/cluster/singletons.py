"""Singletons over the worker's line: session advisory locks, so a holder that dies (or whose
line breaks) frees them at once, and a waiting worker takes one within a second."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from nanobot.cluster.line import WorkerLine
from nanobot.coordination import Held

log = logging.getLogger(__name__)

TRY_EVERY_S = 1.0  # how often a waiting worker tries a singleton (no loop faster than this)
LOOK_EVERY_S = 10.0  # how often it looks who holds one it waits for (a session that is no worker?)


class AdvisorySingletons:
    def __init__(self, line: WorkerLine, timeout: float, on_change: Callable[[], None] = lambda: None) -> None:
        self.line = line  # the worker's: reopened in place when it rejoins
        self.timeout = timeout  # a line slower than this to answer counts as lost
        self.held: dict[str, Held] = {}
        # Singletons held by a session that is not a worker (say, a role that took the lock
        # before any worker started): name -> who, for the log and ``nanobot status``.
        self.blocked: dict[str, str] = {}
        self.on_change = on_change  # ``held`` changed (for status)
        self._looked: dict[str, float] = {}

    async def try_hold(self, name: str) -> Held | None:
        if name in self.held:
            return self.held[name]
        try:
            if not await self.line.try_lock(name, self.timeout):
                await self._look_who_holds(name)
                return None
        except ConnectionError:  # the worker rejoins; until then it holds nothing
            return None
        except Exception as exc:  # whatever it was, the waiters keep waiting (and trying)
            log.warning("could not try %s: %s", name, exc)
            return None
        held = self.held[name] = Held(name)
        self.blocked.pop(name, None)
        log.info("this worker now holds %s", name)
        self._changed()
        return held

    async def hold(self, name: str) -> Held:
        while True:
            held = await self.try_hold(name)
            if held is not None:
                return held
            await asyncio.sleep(TRY_EVERY_S)

    async def release(self, held: Held) -> None:
        if self.held.get(held.name) is not held:
            return
        del self.held[held.name]
        self._changed()
        try:
            await self.line.unlock(held.name, self.timeout)
        except ConnectionError:
            pass  # the lock went with the connection

    async def _look_who_holds(self, name: str) -> None:
        """Workers hold singletons; anyone else holding one is named (and cut off if we may)."""
        now = time.monotonic()
        if now - self._looked.get(name, -LOOK_EVERY_S) < LOOK_EVERY_S:
            return
        self._looked[name] = now
        outsider = await self.line.outsider(name, self.timeout)
        if outsider is None:
            if self.blocked.pop(name, None) is not None:
                self._changed()
            return
        pid, role, application = outsider
        who = f"pid {pid}, role {role}" + (f", application {application!r}" if application else "")
        cut = await self.line.terminate(pid, self.timeout)
        log.warning("%s held by a session that is not a worker: %s; %s", name, who,
                    "cut it off" if cut else "this role may not cut it off (REVOKE CONNECT ON DATABASE ... FROM "
                    "PUBLIC, and give nanobot a role and database of its own)")
        if not cut and self.blocked.get(name) != who:
            self.blocked[name] = who
            self._changed()

    def lose_all(self) -> None:
        """The line is gone, and the locks with it: tell every holder."""
        held, self.held = list(self.held.values()), {}
        for h in held:
            log.warning("this worker lost %s (its database connection broke)", h.name)
            h.lost.set()
        if held:
            self._changed()

    def _changed(self) -> None:
        self.on_change()
