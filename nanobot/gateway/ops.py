"""``gateway.metrics``: this worker's ``/metrics`` (Prometheus' text format, through
``prometheus-client``), with ``/healthz`` and ``/readyz`` beside them, on ``gateway.metrics.listen``.

Counters are kept where things happen (``nanobot.metrics``); the gauges (backlog, chats and
singletons held, channels up) are read when Prometheus scrapes, so nothing runs in between.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from nanobot import metrics
from nanobot.coordination import worker_id
from nanobot.listener import Listener

if TYPE_CHECKING:
    from nanobot.cluster.worker import ClusterWorker
    from nanobot.config import Config
    from nanobot.delivery.store import DeliveryStore
    from nanobot.gateway.dispatcher import Dispatcher
    from nanobot.gateway.supervisor import ChannelSupervisor
    from nanobot.health import Health

log = logging.getLogger(__name__)


class Observed(Protocol):
    """What the metrics endpoint reads of the gateway (``app.Gateway``, which starts it)."""

    config: Config
    cluster: ClusterWorker | None
    delivery: DeliveryStore
    dispatcher: Dispatcher
    channels: ChannelSupervisor
    http_timeout_s: float | None

    def health(self) -> Health: ...


class OpsServer:
    def __init__(self, gateway: Observed) -> None:
        self.gateway = gateway
        self.app = web.Application()
        self.listener = Listener(self.app, "gateway.metrics.listen", timeout_s=gateway.http_timeout_s)
        self._metrics: metrics.PrometheusMetrics | None = None

    async def start(self) -> None:
        settings = self.gateway.config.gateway
        self._metrics = metrics.enable(self.gateway.cluster.id if self.gateway.cluster else worker_id(settings))
        self.app.router.add_get("/metrics", self.scrape)
        self.gateway.health().add_routes(self.app)
        host, port = settings.metrics.address()
        bound = await self.listener.start(host, port)
        log.info("metrics on http://%s:%d/metrics, health probes on /healthz and /readyz", host, bound)

    async def stop(self) -> None:
        await self.listener.stop()
        metrics.disable()

    async def scrape(self, request: web.Request) -> web.Response:
        assert self._metrics is not None
        await self._read_gauges(self._metrics)
        body, content_type = self._metrics.text()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _read_gauges(self, into: metrics.PrometheusMetrics) -> None:
        gateway = self.gateway
        if gateway.delivery is not None:
            try:
                waiting, unsent, _ = await gateway.delivery.backlog()
                into.set_gauges(unanswered_messages=waiting, outbox_pending=unsent)
            except Exception:  # the database is away: those two stay as they were, readyz says why
                into.store_error()
        cluster, dispatcher = gateway.cluster, gateway.dispatcher
        held = len(cluster.router.held) if cluster else len(dispatcher.workers) if dispatcher else 0
        into.set_gauges(chats_held=held, singletons_held=len(cluster.singletons.held) if cluster else 0)
        into.set_channels({name: state == "running" for name, state in gateway.channels.state.items()})
