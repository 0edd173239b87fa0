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
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from nanobot.channel_plugin import BaseChannel, ChannelContext
from nanobot.config import ChannelSection, Config, PluginChannelConfig
from nanobot.eventloop import Background, raise_if_cancelled

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nanobot.channels"
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0
START_DEADLINE_S = 60.0


# An adapter's own keyword arguments, by channel name (TelegramChannel's poll_timeout, say).
AdapterOptions = Mapping[str, Mapping[str, Any]]


def _is_library_error(exc: Exception) -> bool:
    """The client libraries' own errors (a bad token, a refused connection) need no traceback."""
    return type(exc).__module__.split(".")[0] in ("telegram", "discord", "aiohttp", "httpx")


def installed_channels() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


@dataclass(eq=False)
class ChannelRecord:
    """One channel: its adapter while it runs, else why not and since when."""

    name: str
    internal: bool = False  # the gateway's own (the API): started already, never retried
    channel: BaseChannel | None = None
    state: str = ""  # "running", or why not, for status ("" for the gateway's own)
    why: str | None = None  # the last start's failure, while it is not running
    failing_since: float | None = None  # not running since (monotonic; /readyz)
    up: asyncio.Event = field(default_factory=asyncio.Event)  # set while it runs: durable sends wait for it


class ChannelSupervisor:
    """Owns the running channels: starts them, retries those that fail, keeps their state."""

    def __init__(self, config: Config, ctx: ChannelContext, on_state: Callable[[], None] = lambda: None, *,
                 retry_first_s: float = RETRY_FIRST_S, start_deadline_s: float = START_DEADLINE_S,
                 adapter_options: AdapterOptions | None = None) -> None:
        self.config = config
        self.ctx = ctx  # what the adapters are given
        self.on_state = on_state  # called (no arguments) whenever ``state`` changes
        self.retry_first_s = retry_first_s
        self.start_deadline_s = start_deadline_s
        self.adapter_options = adapter_options or {}
        self._records: dict[str, ChannelRecord] = {}
        self._retrying = Background()  # a task per channel that did not start

    def _record(self, name: str) -> ChannelRecord:
        return self._records.setdefault(name, ChannelRecord(name))

    @property
    def channels(self) -> dict[str, BaseChannel]:
        """The running channels by name."""
        return {name: r.channel for name, r in self._records.items() if r.channel is not None}

    @property
    def state(self) -> dict[str, str]:
        """Every enabled channel: "running" or why not, for status."""
        return {name: r.state for name, r in self._records.items() if r.state}

    @property
    def failed(self) -> dict[str, str]:
        """Enabled channels not running now, and why."""
        return {name: r.why for name, r in self._records.items() if r.why is not None}

    @property
    def failing_since(self) -> dict[str, float]:
        return {name: r.failing_since for name, r in self._records.items() if r.failing_since is not None}

    async def running(self, name: str) -> BaseChannel:
        """Channel ``name`` once it runs (an enabled one that failed to start is being retried)."""
        record = self._record(name)
        while record.channel is None:
            await record.up.wait()
        return record.channel

    def enabled(self) -> list[str]:
        """Names of the channels the config enables (``channels.<name>.enabled``), and the gateway's own."""
        return [*self.config.channels.enabled_names(), *(r.name for r in self._records.values() if r.internal)]

    def outgoing(self) -> list[str]:
        """The running channels of the config (the gateway's own ones reach no one unasked)."""
        return [r.name for r in self._records.values() if r.channel is not None and not r.internal]

    def add_internal(self, channel: BaseChannel) -> None:
        """A channel the gateway runs itself (the API): started already, never retried."""
        record = self._record(channel.name)
        record.internal, record.channel = True, channel
        record.up.set()

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start every enabled channel, concurrently. A channel that fails is logged, recorded
        in ``failed`` and retried; the others carry on."""
        installed, names = installed_channels(), self.config.channels.enabled_names()  # not the gateway's own
        results = await asyncio.gather(*(self._start_one(name, installed.get(name), first=True) for name in names))
        for name, started in zip(names, results):
            if not started and installed.get(name) is not None:
                record = self._record(name)
                self._set_state(name, f"retrying in {self.retry_first_s:g} s ({record.why})")
                self._retrying.run(self._keep_trying(name, installed[name]), name=f"retry channel {name}")

    async def _start_one(self, name: str, entry_point: EntryPoint | None, *, first: bool = False) -> bool:
        """Start one channel; False when it failed (it is retried). An address of ours that
        cannot be bound at the first start (a webhook's listen) ends the gateway instead: a
        retry would not free it, and systemd or the operator should hear at once."""
        from nanobot.listener import ListenError  # aiohttp: not loaded for the terminal chat (nanobot agent)

        try:
            if entry_point is None:
                raise RuntimeError(f"no adapter installed under entry point {ENTRY_POINT_GROUP}:{name}")
            cls = entry_point.load()
            channel = cls(self._section(name, cls), self.ctx, **self.adapter_options.get(name, {}))
            await self._start_in_time(channel)
        except ListenError:
            if first:
                raise
            self._record(name).why = "its address is in use"
            self._set_state(name, "not running (its address is in use)")
            return False
        except Exception as exc:
            why = self._record(name).why = f"{type(exc).__name__}: {exc}"
            log.error("channel %s failed to start: %s", name, why, exc_info=not isinstance(
                exc, (RuntimeError, ValidationError, OSError)) and not _is_library_error(exc))
            self._set_state(name, f"not running ({why})")
            return False
        record = self._record(name)
        record.channel, record.why = channel, None
        record.up.set()
        self._set_state(name, "running")
        log.info("channel %s started", name)
        return True

    async def _start_in_time(self, channel: BaseChannel) -> None:
        """``channel.start()`` within ``start_deadline_s``; past it, what it began is stopped and
        RuntimeError says so."""
        deadline = asyncio.timeout(self.start_deadline_s)
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
            raise RuntimeError(f"it did not start within {self.start_deadline_s:g} s") from None

    async def _keep_trying(self, name: str, entry_point: EntryPoint) -> None:
        delay = self.retry_first_s
        while True:
            await asyncio.sleep(delay)
            if await self._start_one(name, entry_point):
                return
            raise_if_cancelled()  # a stop the channel's library swallowed as it failed to start
            delay = min(RETRY_MAX_S, delay * 2)
            self._set_state(name, f"retrying in {delay:g} s ({self._record(name).why})")

    def report(self, name: str, why: str | None) -> None:
        """A running channel's own word on its health (``ChannelContext.report``)."""
        if self._record(name).channel is not None:
            self._set_state(name, "running" if why is None else f"running, but {why}")

    def _set_state(self, name: str, state: str) -> None:
        record = self._record(name)
        record.state = state
        if state == "running":
            record.failing_since = None
        elif record.failing_since is None:
            record.failing_since = time.monotonic()
        self.on_state()

    def _section(self, name: str, cls: type[BaseChannel]) -> ChannelSection:
        section = self.config.channels.section(name) or PluginChannelConfig()
        if cls.config_model is not None and not isinstance(section, cls.config_model):
            section = cls.config_model.model_validate(section.model_dump())  # the adapter's own keys, typed
        return section

    async def stop_retrying(self) -> None:
        await self._retrying.stop()

    async def stop_receiving(self) -> None:
        await asyncio.gather(*(self._safely(c.stop_receiving, c.name) for c in self.channels.values()))

    async def stop(self) -> None:
        channels = list(self.channels.values())
        for record in self._records.values():
            record.up.clear()
            record.channel = None
        await asyncio.gather(*(self._safely(c.stop, c.name) for c in channels))

    @staticmethod
    async def _safely(step: Any, name: str) -> None:
        try:
            await step()
        except Exception:
            log.exception("channel %s: error while stopping", name)
