"""This gateway as one worker of several on one PostgreSQL database.

It joins the registry, keeps its heartbeat (every third of ``gateway.failoverSeconds``),
sweeps for what dead workers left (every second), and watches its line: if the line breaks
the others take it for dead, so it gives up its chats and singletons at once, then reconnects
and joins again. On a normal stop it leaves: its chats are free for the others at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from nanobot.bus import MessageBus
from nanobot.cluster.leases import ChatLeases
from nanobot.cluster.line import WorkerLine
from nanobot.cluster.registry import MIGRATIONS, Registry
from nanobot.cluster.router import ChatRouter
from nanobot.cluster.singletons import AdvisorySingletons
from nanobot.coordination import worker_id
from nanobot.eventloop import Background

if TYPE_CHECKING:
    from nanobot.cluster.router import GatewayHooks
    from nanobot.config import Gateway as GatewaySettings
    from nanobot.delivery.store import DeliveryStore
    from nanobot.postgres import PostgresDatabase
    from nanobot.session import Histories

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 1.0
RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.5, 5.0


class ClusterWorker:
    def __init__(self, db: PostgresDatabase, settings: GatewaySettings, delivery: DeliveryStore, bus: MessageBus,
                 sessions: Histories, hooks: GatewayHooks, workspace: str, *, new_workspace: bool = False) -> None:
        self.id = worker_id(settings)
        self.workspace, self.new_workspace = workspace, new_workspace
        self.db, self.failover = db, settings.failover_seconds
        # A heartbeat lapses a sweep and a moment before failoverSeconds: takeover lands within it.
        self.registry = Registry(db, self.id, max(1.0, self.failover - SWEEP_EVERY_S - 0.5))
        self.joined = asyncio.Event()  # registered on a live line: claims and takeovers allowed
        self.router = ChatRouter(ChatLeases(db, self.id), delivery, bus, sessions, hooks, self.joined)
        self.line = WorkerLine(db.url, self.router.notified, self.failover)
        self.singletons = AdvisorySingletons(self.line, timeout=self.failover / 2, on_change=self._beat_soon)
        self._started = time.time()
        self._background = Background()  # the heartbeat, the sweep and the line's watch
        self._beat_now = asyncio.Event()

    async def start(self) -> None:
        """Join (WorkerIdInUse if our id is taken by a live worker), then take what is orphaned."""
        await self.db.migrate("workers", MIGRATIONS)  # workers exist on PostgreSQL only
        await self.registry.check_workspace(self.workspace, new=self.new_workspace)
        await self._join()
        self.joined.set()
        await self.registry.forget_previous_run()
        await self.router.sweep()
        self._background.run(self._heartbeat(), name="worker heartbeat")
        self._background.run(self._sweep(), name="worker sweep")
        self._background.run(self._watch_line(), name="worker line")
        log.info("worker %s joined", self.id)

    async def _join(self) -> None:
        await self.line.open()
        assert self.line.backend is not None
        try:
            await self.registry.register(self.line.backend, os.getpid(), self._started, self.workspace)
        except BaseException:
            await self.line.close()
            self.line.backend = None  # not a worker: nothing to leave at stop
            raise

    async def _heartbeat(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.failover / 3):
                    await self._beat_now.wait()
            except TimeoutError:
                pass
            self._beat_now.clear()
            try:
                assert self.line.backend is not None
                if not await self.registry.heartbeat(self.line.backend, list(self.singletons.held),
                                                     self.singletons.blocked):
                    log.error("worker %s: the others took this worker for dead; rejoining", self.id)
                    await self.line.close()  # _watch_line rejoins
            except Exception as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.id, exc)

    def _beat_soon(self) -> None:
        self._beat_now.set()  # status shows a new singleton holder at once

    async def _sweep(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                await self.router.sweep()
                beats += 1
                if beats % 3600 == 0:
                    await self.registry.prune()
            except Exception as exc:  # the database is away: the next sweep tries again
                log.warning("worker %s: sweep failed (%s)", self.id, exc)

    async def _watch_line(self) -> None:
        while True:
            await self.line.lost.wait()
            self.joined.clear()  # no claim, takeover or sweep until rejoined
            self.singletons.lose_all()
            self.router.forget_all()
            await self.line.close()
            delay = RECONNECT_FIRST_S
            while True:
                try:
                    await self._join()
                    await self.router.leases.release_all()  # the others take them (or we, afresh)
                    self.router.forget_all()  # what memory holds is exactly what the leases say: nothing
                    self.joined.set()
                    log.warning("worker %s: rejoined after its database connection broke", self.id)
                    break
                except Exception as exc:
                    log.warning("worker %s: cannot rejoin yet (%s); retrying in %g s", self.id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(RECONNECT_MAX_S, delay * 2)

    async def stop(self) -> None:
        """After the dispatcher stopped: free our chats and singletons for the others."""
        await self._background.stop()
        await self.router.close()
        for held in list(self.singletons.held.values()):
            await self.singletons.release(held)
        try:
            if self.line.backend is not None:
                await self.registry.leave(self.line.backend)
        except Exception as exc:
            log.warning("worker %s: could not sign off (%s); the others take over after %g s",
                        self.id, exc, self.failover)
        await self.line.close()
