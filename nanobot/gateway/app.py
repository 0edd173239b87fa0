"""The daemon's lifecycle: start the parts in order, run until a signal, stop them in reverse.

Start: pairing store and access gate, the delivery store (messages that the last run left
unanswered are queued again, and replies it did not get out are sent), MCP servers,
channels, then the dispatcher and the outbound router, then added services (cron,
heartbeat), then ``READY=1``. Stop (SIGTERM, SIGINT or SIGHUP):
``STOPPING=1``, channels stop receiving, running turns get ``gateway.shutdownGraceSeconds``
to finish (the rest are cancelled) while services stop, queued replies are sent, channels
close, and the Runtime flushes sessions and closes its pools. Each task started here is
cancelled and awaited here.

A channel that does not start is retried with backoff while the gateway runs (see
``ChannelSupervisor``); with no channel enabled it runs for the services alone (cron,
heartbeat). A service that fails to start makes it exit 1, for systemd to try again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nanobot.channel_plugin import BaseChannel, ChannelContext, Sender
from nanobot import sdnotify, tracing
from nanobot.access import AccessGate
from nanobot.api.keys import REFRESH_S as KEY_REFRESH_S
from nanobot.api.channel import KEEPALIVE_S
from nanobot.bus import InboundMessage, MessageBus
from nanobot.cluster.registry import OtherWorkspace, WorkerIdInUse
from nanobot.coordination import Alone, Singletons, worker_id
from nanobot.config import EDIT_EVERY_S, Config
from nanobot.sqlite_file import check_writable
from nanobot.cron.run_requests import run_wait_s
from nanobot.delivery.intake import DurableIntake
from nanobot.gateway.albums import ALBUM_QUIET_S
from nanobot.gateway.outbound import SEND_RETRY, Outbound
from nanobot.delivery.store import DeliveryStore, Pruner
from nanobot.gateway.supervisor import RETRY_FIRST_S, START_DEADLINE_S, AdapterOptions, ChannelSupervisor
from nanobot.gateway.welcome import WELCOME_EVERY_S, PairingWelcome
from nanobot.gateway.dispatcher import TYPING_INTERVAL, Dispatcher
from nanobot.gateway.task_runner import TaskRunner
from nanobot.gateway_lock import GatewayLock, GatewayRunning, write_gateway_state
from nanobot.runtime import Runtime, open_runtime
from nanobot.trust import chat_scope
from nanobot.eventloop import Background, cancel_and_wait

if TYPE_CHECKING:
    from nanobot.cluster.worker import ClusterWorker
    from nanobot.gateway.cron_jobs import CronJobs
    from nanobot.health import Health
    from nanobot.database import Database
    from nanobot.cron.store import CronRun
    from nanobot.session import Session

log = logging.getLogger(__name__)

DRAIN_SECONDS = 5.0  # how long queued replies may take to go out at shutdown


class Service(Protocol):
    """Anything that starts and stops with the gateway (cron scheduler, heartbeat, ...)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Pace:
    """How long the gateway's parts wait: production's by default; tests pass shorter ones."""

    typing_s: float = TYPING_INTERVAL  # between typing indicators while a turn runs
    channel_retry_s: float = RETRY_FIRST_S  # before a channel that did not start is tried again (doubling)
    channel_start_s: float = START_DEADLINE_S  # a channel's start taking longer counts as failed
    welcome_s: float = WELCOME_EVERY_S  # how often approvals made elsewhere are looked for
    edit_s: float = EDIT_EVERY_S  # a chat platform's streamed reply is edited at most this often
    send_retry: tuple[float, float] = SEND_RETRY  # a platform that is down: the first probe's wait, the longest
    drain_s: float = DRAIN_SECONDS  # how long queued replies may take to go out at shutdown
    album_quiet_s: float = ALBUM_QUIET_S  # an album's parts are joined once none came for this long
    key_refresh_s: float = KEY_REFRESH_S  # the API reads its keys again after this (one added elsewhere)
    http_timeout_s: float | None = None  # every listener's: the API, the socket, metrics, webhooks (None: nanobot.listener's)
    keepalive_s: float = KEEPALIVE_S  # a streamed answer quiet this long gets a comment line (proxies end it)
    adapters: AdapterOptions = field(default_factory=dict)  # an adapter's own keyword arguments, by channel


class Gateway:
    """Channels, dispatcher and router around one started ``Runtime``, plus added services.

    The terminal chat (``nanobot agent``, a Runtime opened with ``terminal=True``) runs the same
    gateway with one channel, the terminal, added as an internal channel: no channel of the
    config, no worker, no background tasks; its lines go straight to the dispatcher and its
    replies are recorded in ``scratch`` (a throwaway database): the home's database belongs to
    the home's gateway, which may be running.
    """

    def __init__(self, runtime: Runtime, *, scratch: Database | None = None, pace: Pace = Pace(),
                 with_services: bool = False) -> None:
        rt = self.runtime = runtime
        self.config: Config = runtime.config
        self.bus: MessageBus = runtime.bus
        self.terminal = runtime.terminal
        if self.terminal != (scratch is not None):
            raise ValueError("the terminal chat's gateway, and only it, records in a scratch database")
        # What the API, the page and the terminal socket see of the runtime (nanobot.api.front_door).
        self.home, self.db, self.usage, self.agent, self.cron = rt.home, rt.db, rt.usage, rt.agent, rt.cron
        self.pairing, self.api_owners, self.notices = rt.pairing, rt.api_owners, rt.notices.kept
        among_workers = rt.shared and not self.terminal  # PostgreSQL: one worker of several (nanobot.cluster)
        self.delivery = DeliveryStore(scratch or rt.db, worker_id(self.config.gateway) if among_workers else None)
        self.pace, self.key_refresh_s, self.keepalive_s = pace, pace.key_refresh_s, pace.keepalive_s
        self.http_timeout_s = pace.http_timeout_s
        # Built in the order each needs the other; where two need each other (the cluster and the
        # dispatcher, the channels and their context), one is handed a method of the gateway's.
        self.cluster: ClusterWorker | None = self._worker() if among_workers else None
        # Telegram polling, Discord, the cron clock, periodic services: once across workers.
        self.singletons: Singletons = self.cluster.singletons if self.cluster else Alone()
        self.intake = DurableIntake(self.delivery, self.bus, self.cluster.router if self.cluster else None)
        self._ctx = ChannelContext(intake=self.intake, access=AccessGate(rt.pairing, notify_owner=rt.announce),
                                   workspace=self.config.workspace_path,
                                   max_media_bytes=self.config.channels.max_media_mb * 1024 * 1024,
                                   max_workspace_mb=self.config.tools.max_workspace_mb, chat_root=self._chat_root,
                                   singletons=self.singletons, report=self._report, store=self.delivery,
                                   http_timeout_s=pace.http_timeout_s,
                                   keys_dir=None if among_workers else self.home / "keys")
        self.channels = ChannelSupervisor(self.config, self._ctx, on_state=self._write_state,
                                          retry_first_s=pace.channel_retry_s, start_deadline_s=pace.channel_start_s,
                                          adapter_options=pace.adapters)
        self.outbound = Outbound(self.bus, self.channels, self.delivery, send_retry=pace.send_retry)  # the one way out
        self.dispatcher = Dispatcher(rt.agent, self.bus, self.config.gateway, self.outbound,
                                     holder=self.cluster.router if self.cluster else None,
                                     typing_interval=pace.typing_s, album_quiet_s=pace.album_quiet_s,
                                     stream_pace=partial(self.config.channels.stream_pace, edit_every_s=pace.edit_s))
        # The cron scheduler: its runner asks us for turns (prompt jobs), the intake keeps outputs.
        self.cron_jobs: CronJobs | None = self._cron_jobs() if with_services else None
        self.services: list[Service] = [] if self.terminal else [
            Pruner(self.delivery, self.singletons),  # prunes at once, then every 6 hours
            # Background tasks: one name per home alone (its last run's tasks are its own), the worker id among workers.
            TaskRunner(rt, self.intake.accept, self.open_chat, self.cluster.id if self.cluster else "gateway",
                       among_workers=self.cluster is not None),
            *self._daemon_services()]
        self._started_services: list[Service] = []
        self._intake = Background()  # the dispatcher's loop: stopped first, so nothing new is taken
        self._background = Background()  # the outbound router and the state file's writer

    def _cron_jobs(self) -> CronJobs:
        from nanobot.gateway import cron_jobs  # APScheduler: not loaded for the terminal chat

        runner = cron_jobs.JobRunner(self.runtime, self.ask, self.intake.tell, self.open_chat, self.channels.outgoing)
        return cron_jobs.CronJobs(runner, self.singletons)

    def _daemon_services(self) -> list[Service]:
        """What lives and dies with the daemon (``with_services``): the cron scheduler, the terminal
        socket, the API and the metrics, approval notices and the heartbeat."""
        if self.cron_jobs is None:
            return []
        from nanobot.api.terminal import TerminalSocket
        from nanobot.heartbeat import Heartbeat

        gateway, heartbeat = self.config.gateway, self.config.gateway.heartbeat
        services: list[Service] = [self.cron_jobs, TerminalSocket(self)]  # nanobot agent reaches us through it
        if gateway.api.enabled:
            from nanobot.api.server import ApiServer
            services.append(ApiServer(self))
        if gateway.metrics.enabled:
            from nanobot.gateway.ops import OpsServer
            services.append(OpsServer(self))
        services.append(PairingWelcome(self.pairing, self.bus, self.channels.outgoing, self.singletons,
                                       every_s=self.pace.welcome_s))
        if heartbeat.enabled:
            services.append(Heartbeat(self.runtime, self.intake.tell, heartbeat.interval_minutes * 60, self.singletons))
        return services

    async def start(self) -> None:
        rt = self.runtime
        await self.delivery.migrate()
        if self.cluster is not None:  # takes over what dead workers (or our last run) left
            await self.cluster.start()
        else:
            await self.outbound.resend_pending()  # they wait for their channel to start
            await self.intake.resume(rt.sessions)  # queued before anything new arrives: each chat keeps its order
        self._background.run(self._write_state_on_change(), name="state file")
        if rt.mcp is not None:  # not waited for (one that hangs held every channel): turns and jobs wait
            self._background.run(rt.mcp.ensure_started(), name="MCP servers")
        if not self.terminal:
            await self.channels.start()
        if self.channels.failed:  # retried with backoff: the daemon stays up for cron and the others
            log.warning("channels not running yet (retrying): %s", "; ".join(
                f"{name}: {why}" for name, why in self.channels.failed.items()))
        if not self.config.channels.enabled_names() and not self.terminal:
            serving = "the API (gateway.api), cron" if self.config.gateway.api.enabled else "cron"
            log.warning("no chat channel is enabled (channels.*.enabled): running for %s, the terminal "
                        "(nanobot agent) and the heartbeat", serving)
        self._intake.run(self.dispatcher.run(), name="dispatcher")
        self._background.run(self.outbound.route(), name="outbound router")
        for service in self.services:
            await service.start()
            self._started_services.append(service)
        log.info("gateway ready: channels %s; event loop %s", ", ".join(self.channels.channels) or "none",
                 type(asyncio.get_running_loop()).__module__.split(".")[0])  # uvloop, or asyncio

    def _worker(self) -> ClusterWorker:
        """On PostgreSQL: chats, singletons and turns are shared out with the other workers."""
        from nanobot.cluster.router import GatewayHooks
        from nanobot.cluster.worker import ClusterWorker

        rt = self.runtime
        hooks = GatewayHooks(resend=lambda recorded: self.outbound.resend(recorded),
                             let_go=lambda chats: self.dispatcher.let_go(chats))
        return ClusterWorker(rt.db, self.config.gateway, self.delivery, self.bus, rt.sessions, hooks,
                             str(self.config.workspace_path), new_workspace=rt.workspace_created)

    def _report(self, channel: str, why: str | None) -> None:
        self.channels.report(channel, why)

    async def ask(self, msg: InboundMessage) -> str:
        """Run ``msg`` as a turn of its chat and return the reply (cron prompt jobs); the reply
        is sent to the chat as well. Among workers it is recorded and runs where its chat is held."""
        among_workers = self.intake.accept if self.cluster is not None else None
        return await self.dispatcher.ask(msg, through=among_workers)

    # ---- the API's, the page's and the terminal socket's view (nanobot.api.front_door) ----
    def channel_context(self) -> ChannelContext:
        return self._ctx

    def add_internal_channel(self, channel: BaseChannel) -> None:
        self.channels.add_internal(channel)

    def accepting(self) -> bool:
        return not self.dispatcher.closing

    async def open_chat(self, chat: str) -> Session:
        if self.cluster is not None:
            self.cluster.router.fresh(chat)  # its holder may have written it since
        return await self.runtime.sessions.open(chat)

    async def chats(self, prefix: str, limit: int) -> list[str]:
        return await self.runtime.sessions.chats(prefix, limit)

    def held_here(self, chat: str) -> bool:
        return self.cluster is None or chat in self.cluster.router.held

    async def chat_folder(self, chat: str) -> Path:
        await self.open_chat(chat)  # a private chat's trust reads its session
        return self.runtime.chat_context(chat).workspace

    async def run_cron_now(self, job_id: str) -> CronRun:
        return await self.runtime.cron_runs.run(job_id, run_wait_s(self.config.agents.defaults.code_runtime))

    async def status_lines(self) -> list[str]:
        from nanobot.cluster.registry import worker_lines
        from nanobot.tools.shell import shell_status

        rt, states, zone = self.runtime, self.channels.state, self.config.agents.defaults.timezone
        lines = [f"Channels: {', '.join(f'{n} ({s})' for n, s in states.items()) or 'none enabled'}",
                 f"MCP:      {'; '.join(rt.mcp.summary()) if rt.mcp else 'none configured'}",
                 f"Shell:    {shell_status(rt.config)}",
                 f"Database: {rt.db.engine}",
                 f"Tasks:    {await rt.tasks.status_line()}",
                 f"Disk:     {shutil.disk_usage(rt.home).free / 1073741824:.1f} GB free for the home"]
        lines += [f"Model:    {name}: {why}" for name, why in (await rt.usage.last_failures(zone)).items()]
        if self.cluster is not None:
            lines += await worker_lines(rt.db)
        return lines

    def health(self) -> Health:
        """What /readyz checks: the store, the worker's database line, the channels."""
        from nanobot.health import Health  # aiohttp: not loaded for the terminal chat (nanobot agent)

        return Health(self.runtime.db, lambda: self.channels.failing_since,
                      lambda: self.cluster is not None and self.cluster.line.lost.is_set())

    def _chat_root(self, sender: Sender) -> Path:
        """Where a chat's downloads go: the workspace for owner chats, its own folder for members."""
        peer = sender.who if sender.is_private else None
        return chat_scope(self.config, f"{sender.channel}:{sender.chat_id}", peer)[1]

    async def _write_state_on_change(self) -> None:
        while True:  # a provider went into cooldown, an MCP server's state changed
            await self.runtime.status_changed.next()
            self._write_state()

    def _write_state(self) -> None:
        """Where each channel stands, for ``nanobot status`` (a file in the home)."""
        mcp = self.runtime.mcp
        cooling = self.runtime.provider.cooling_down()
        write_gateway_state(self.runtime.home, self.channels.state, mcp.states() if mcp else {}, cooling)

    async def stop(self) -> None:
        """Safe to call after a failed or partial start()."""
        await self.channels.stop_retrying()
        await self.channels.stop_receiving()
        await self._intake.stop()
        services, self._started_services = self._started_services[::-1], []
        # Services (a cron run, say) and running turns wind down side by side, not one grace after another.
        stopping = [_stop_service(s) for s in services]
        stopping.append(self.dispatcher.shutdown(self.config.gateway.shutdown_grace_seconds))
        await asyncio.gather(*stopping)
        await self._background.stop()
        await self.runtime.notices.close()  # what the last minute batched goes with the last replies
        await self.outbound.drain(self.pace.drain_s)
        if self.cluster is not None:  # after our last replies went out: the others take over from here
            await self.cluster.stop()
        await self.channels.stop()
        await self.delivery.close()


async def _stop_service(service: Service) -> None:
    try:
        await service.stop()
    except Exception:
        log.exception("error while stopping %r", service)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the terminal closed; stop cleanly


async def run_gateway(config: Config, *, stop: asyncio.Event | None = None) -> int:
    """``nanobot gateway``: run until SIGTERM/SIGINT/SIGHUP (or ``stop`` is set); the exit code."""
    home = config.home
    check_writable(home)
    lock = GatewayLock(home)
    try:
        lock.acquire()
    except GatewayRunning as exc:
        log.error("%s", exc)
        return 1
    stop = stop or asyncio.Event()
    tracing.setup()  # on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_*) and the extra installed
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _stop_on(sig, stop))
    try:
        return await _serve(config, stop)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        lock.release()
        tracing.shutdown()
        log.info("gateway stopped")


def _stop_on(sig: signal.Signals, stop: asyncio.Event) -> Any:
    def handler() -> None:
        log.info("%s received: stopping cleanly", sig.name)
        stop.set()

    return handler


async def _started_unless_stopped(gateway: Gateway, stop: asyncio.Event) -> bool:
    """Start the gateway; a stop signal meanwhile cancels the start (False): a slow part must
    not make SIGTERM wait, or systemd would kill -9 it."""
    starting = asyncio.create_task(gateway.start(), name="gateway start")
    stopping = asyncio.create_task(stop.wait(), name="stop signal")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        await cancel_and_wait(starting)
        return False
    starting.result()  # its error, if it failed
    return True


async def _serve(config: Config, stop: asyncio.Event) -> int:
    from nanobot.listener import ListenError  # aiohttp: the daemon's, not the terminal chat's
    watchdog: asyncio.Task[None] | None = None
    async with open_runtime(config) as runtime:
        gateway = Gateway(runtime, with_services=True)
        try:
            if not await _started_unless_stopped(gateway, stop):
                log.info("gateway stopping before it was ready")
                return 0
            sdnotify.notify("READY=1")
            interval = sdnotify.watchdog_interval()
            if interval:
                watchdog = asyncio.create_task(sdnotify.watchdog(interval), name="watchdog")
            await stop.wait()
            log.info("gateway stopping")
        except (WorkerIdInUse, OtherWorkspace) as exc:
            log.error("%s", exc)
            return 2
        except ListenError as exc:  # the API's address in use, say: one line, not a traceback
            log.error("%s", exc)
            return 1
        except Exception:  # a service that failed to start, say: exit 1 for systemd to retry
            log.exception("the gateway failed")
            return 1
        finally:
            sdnotify.notify("STOPPING=1")
            await gateway.stop()
            await cancel_and_wait(watchdog)
    return 0
