"""Channel supervision: adapters found through entry points, started from config, retried
while they fail, and where each stands (what goes out to them is ``outbound.Outbound``'s).

Adapters register under the entry-point group ``nanobot.channels`` (name -> BaseChannel
subclass), so a third-party package adds a channel by being installed. Its config section is
``channels.<name>``: built-in channels have typed sections in ``nanobot.config``; any other
is a ``PluginChannelConfig`` (enabled, allowFrom, owners, groupPolicy, streaming, plus the
adapter's own keys), validated again with the adapter's ``config_model`` if it has one.

A channel that fails to start (a network outage, a Bot API that is down) is retried with
backoff, from ``RETRY_FIRST_S`` doubling to ``RETRY_MAX_S``, for as long as the gateway runs;
``state`` says where each channel stands, for ``nanobot status``. A start that takes longer
than ``START_DEADLINE_S`` counts as failed (and is retried): no channel holds the gateway's
start, and so its stop (a library that retries a refused token forever once did).
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from pydantic import ValidationError

from nanobot.channel_plugin import BaseChannel, ChannelContext
from nanobot.config import ChannelSection, Config, PluginChannelConfig
from nanobot.listener import ListenError
from nanobot.eventloop import cancel_and_wait

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nanobot.channels"
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0
START_DEADLINE_S = 60.0


def _is_library_error(exc: Exception) -> bool:
    """The client libraries' own errors (a bad token, a refused connection) need no traceback."""
    return type(exc).__module__.split(".")[0] in ("telegram", "discord", "aiohttp", "httpx")


def installed_channels() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class ChannelSupervisor:
    """Owns the running channels: starts them, retries those that fail, keeps their state."""

    def __init__(self, config: Config, on_state: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.on_state = on_state  # called (no arguments) whenever ``state`` changes
        self.ctx: ChannelContext | None = None  # what the adapters are given: known at start()
        self.channels: dict[str, BaseChannel] = {}
        self.failed: dict[str, str] = {}  # enabled channels not running now, and why
        self.state: dict[str, str] = {}  # every enabled channel: "running" or why not, for status
        self.failing_since: dict[str, float] = {}  # channels not running, since when (monotonic; /readyz)
        self.retry_first_s = RETRY_FIRST_S
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._up: dict[str, asyncio.Event] = {}  # set while the channel runs: durable sends wait for it
        self._internal: list[str] = []  # channels of the gateway itself (the API), not of the config

    async def running(self, name: str) -> BaseChannel:
        """Channel ``name`` once it runs (an enabled one that failed to start is being retried)."""
        while (channel := self.channels.get(name)) is None:
            await self._up.setdefault(name, asyncio.Event()).wait()
        return channel

    def enabled(self) -> list[str]:
        """Names of the channels the config enables (``channels.<name>.enabled``), and the gateway's own."""
        return [*self.config.channels.enabled_names(), *self._internal]

    def outgoing(self) -> list[str]:
        """The running channels of the config (the gateway's own ones reach no one unasked)."""
        return [name for name in self.channels if name not in self._internal]

    def add_internal(self, channel: BaseChannel) -> None:
        """A channel the gateway runs itself (the API): started already, never retried."""
        self.channels[channel.name] = channel
        self._internal.append(channel.name)
        self._up.setdefault(channel.name, asyncio.Event()).set()

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self, ctx: ChannelContext) -> None:
        """Start every enabled channel with ``ctx``, concurrently. A channel that fails is
        logged, recorded in ``failed`` and retried; the others carry on."""
        self.ctx = ctx
        installed = installed_channels()
        results = await asyncio.gather(*(self._start_one(name, installed.get(name), first=True)
                                         for name in self.enabled()))
        for name, started in zip(self.enabled(), results):
            if not started and installed.get(name) is not None:
                self._set_state(name, f"retrying in {self.retry_first_s:g} s ({self.failed[name]})")
                self._retries[name] = asyncio.create_task(self._keep_trying(name, installed[name]),
                                                          name=f"retry channel {name}")

    async def _start_one(self, name: str, entry_point: EntryPoint | None, *, first: bool = False) -> bool:
        """Start one channel; False when it failed (it is retried). An address of ours that
        cannot be bound at the first start (a webhook's listen) ends the gateway instead: a
        retry would not free it, and systemd or the operator should hear at once."""
        try:
            if entry_point is None:
                raise RuntimeError(f"no adapter installed under entry point {ENTRY_POINT_GROUP}:{name}")
            cls = entry_point.load()
            assert self.ctx is not None
            channel = cls(self._section(name, cls), self.ctx)
            await self._start_in_time(channel)
        except ListenError:
            if first:
                raise
            self.failed[name] = "its address is in use"
            self._set_state(name, "not running (its address is in use)")
            return False
        except Exception as exc:
            self.failed[name] = f"{type(exc).__name__}: {exc}"
            log.error("channel %s failed to start: %s", name, self.failed[name], exc_info=not isinstance(
                exc, (RuntimeError, ValidationError, OSError)) and not _is_library_error(exc))
            self._set_state(name, f"not running ({self.failed[name]})")
            return False
        self.channels[name] = channel
        self._up.setdefault(name, asyncio.Event()).set()
        self.failed.pop(name, None)
        self._set_state(name, "running")
        log.info("channel %s started", name)
        return True

    @staticmethod
    async def _start_in_time(channel: BaseChannel) -> None:
        """``channel.start()`` within ``START_DEADLINE_S``; past it, what it began is stopped and
        RuntimeError says so."""
        deadline = asyncio.timeout(START_DEADLINE_S)
        try:
            async with deadline:
                await channel.start()
        except TimeoutError:
            if not deadline.expired():
                raise
            try:
                await channel.stop()
            except Exception as exc:  # it never ran: what it left half-done is all there is to stop
                log.debug("channel %s: stopping a start that timed out: %s", channel.name, exc)
            raise RuntimeError(f"it did not start within {START_DEADLINE_S:g} s") from None

    async def _keep_trying(self, name: str, entry_point: EntryPoint) -> None:
        delay = self.retry_first_s
        while True:
            await asyncio.sleep(delay)
            if await self._start_one(name, entry_point):
                return
            delay = min(RETRY_MAX_S, delay * 2)
            self._set_state(name, f"retrying in {delay:g} s ({self.failed[name]})")

    def report(self, name: str, why: str | None) -> None:
        """A running channel's own word on its health (``ChannelContext.report``)."""
        if name in self.channels:
            self._set_state(name, "running" if why is None else f"running, but {why}")

    def _set_state(self, name: str, state: str) -> None:
        self.state[name] = state
        if state == "running":
            self.failing_since.pop(name, None)
        else:
            self.failing_since.setdefault(name, time.monotonic())
        self.on_state()

    def _section(self, name: str, cls: type[BaseChannel]) -> ChannelSection:
        section = self.config.channels.section(name) or PluginChannelConfig()
        if cls.config_model is not None and not isinstance(section, cls.config_model):
            section = cls.config_model.model_validate(section.model_dump())  # the adapter's own keys, typed
        return section

    async def stop_retrying(self) -> None:
        tasks, self._retries = list(self._retries.values()), {}
        await cancel_and_wait(*tasks)

    async def stop_receiving(self) -> None:
        await asyncio.gather(*(self._safely(c.stop_receiving, c.name) for c in self.channels.values()))

    async def stop(self) -> None:
        for event in self._up.values():
            event.clear()
        channels, self.channels = list(self.channels.values()), {}
        await asyncio.gather(*(self._safely(c.stop, c.name) for c in channels))

    @staticmethod
    async def _safely(step: Any, name: str) -> None:
        try:
            await step()
        except Exception:
            log.exception("channel %s: error while stopping", name)
