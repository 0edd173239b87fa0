"""``GET /healthz`` and ``GET /readyz``: what a load balancer or a Kubernetes probe asks.

``/healthz`` answers 200 while the process and its event loop answer. ``/readyz`` answers 200
only when the store answers (within ``STORE_TIMEOUT_S``), the worker's database line is up,
and no channel has been failing for more than ``FAILING_FOR_S``; else 503 with the reasons,
in JSON. Neither needs a key, and neither says anything a stranger could use.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from aiohttp import web

if TYPE_CHECKING:
    from nanobot.database import Queries

STORE_TIMEOUT_S = 2.0
FAILING_FOR_S = 60.0


@dataclass(frozen=True)
class Health:
    db: Queries
    failing_since: Callable[[], dict[str, float]]  # channel -> when it stopped running (monotonic)
    line_lost: Callable[[], bool] = lambda: False  # the worker's database line (workers only)

    async def reasons(self) -> list[str]:
        """Why this worker is not ready; empty when it is."""
        found = []
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                await self.db.fetchval("SELECT 1")
        except Exception as exc:
            found.append(f"store: {type(exc).__name__}: {exc}" if str(exc) else f"store: {type(exc).__name__}")
        if self.line_lost():
            found.append("worker: its database line is down (it rejoins when the database is back)")
        now = time.monotonic()
        found += [f"channel {name}: not running for {now - since:.0f} s"
                  for name, since in self.failing_since().items() if now - since > FAILING_FOR_S]
        return found

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        reasons = await self.reasons()
        return web.json_response({"status": "not ready" if reasons else "ready", "reasons": reasons},
                                 status=503 if reasons else 200)
