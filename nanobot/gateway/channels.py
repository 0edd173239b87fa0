"""Channel adapters in the gateway: found through entry points, started from config, and fed
from ``bus.outbound``.

Adapters register under the entry-point group ``nanobot.channels`` (name -> BaseChannel
subclass), so a third-party package adds a channel by being installed. Its config section is
``channels.<name>``: built-in channels have typed sections in ``nanobot.config``; any other
is validated with the adapter's ``config_model`` class attribute (a pydantic model), or
with ``PluginChannelConfig`` (enabled, allowFrom, groupPolicy, plus the adapter's own keys).

A channel that fails to start (a network outage, a Bot API that is down) is retried with
backoff, from ``RETRY_FIRST_S`` doubling to ``RETRY_MAX_S``, for as long as the gateway runs;
``state`` says where each channel stands, for ``nanobot status``.

Replies go out in order per chat and concurrently across chats: one slow chat (a 429
backoff, a long split reply) does not hold up the others. A failing send is logged; it
never stops the router.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from channels.base import BaseChannel, ChannelContext
from nanobot.bus import MessageBus, OutboundMessage
from nanobot.config import Config

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nanobot.channels"
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0


class PluginChannelConfig(BaseModel):
    """The section of a third-party channel that declares no ``config_model`` of its own."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    enabled: bool = False
    allow_from: list[str] = []
    group_policy: Literal["mention", "open"] = "mention"


def _is_library_error(exc: Exception) -> bool:
    """The client libraries' own errors (a bad token, a refused connection) need no traceback."""
    return type(exc).__module__.split(".")[0] in ("telegram", "discord", "aiohttp", "httpx")


def installed_channels() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class ChannelManager:
    """Owns the running channels and the task that routes outbound messages to them."""

    def __init__(self, config: Config, ctx: ChannelContext) -> None:
        self.config = config
        self.ctx = ctx
        self.channels: dict[str, BaseChannel] = {}
        self.failed: dict[str, str] = {}  # enabled channels not running now, and why
        self.state: dict[str, str] = {}  # every enabled channel: "running" or why not, for status
        self.on_state: Any = None  # called (no arguments) whenever ``state`` changes
        self.retry_first_s = RETRY_FIRST_S
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, asyncio.Task[None]] = {}  # per chat: the newest send, to chain after
        self._last_kind: dict[str, str] = {}
        self._inflight: set[asyncio.Task[None]] = set()

    @property
    def bus(self) -> MessageBus:
        return self.ctx.bus

    def enabled(self) -> list[str]:
        """Names of the channels the config enables (``channels.<name>.enabled``)."""
        return self.config.channels.enabled_names()

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start every enabled channel, concurrently. A channel that fails is logged and
        recorded in ``failed``; the others carry on."""
        installed = installed_channels()
        results = await asyncio.gather(*(self._start_one(name, installed.get(name)) for name in self.enabled()))
        for name, started in zip(self.enabled(), results):
            if not started and installed.get(name) is not None:
                self._set_state(name, f"retrying in {self.retry_first_s:g} s ({self.failed[name]})")
                self._retries[name] = asyncio.create_task(self._keep_trying(name, installed[name]),
                                                          name=f"retry channel {name}")

    async def _start_one(self, name: str, entry_point: EntryPoint | None) -> bool:
        try:
            if entry_point is None:
                raise RuntimeError(f"no adapter installed under entry point {ENTRY_POINT_GROUP}:{name}")
            cls = entry_point.load()
            channel = cls(self._section(name, cls), self.ctx)
            await channel.start()
        except Exception as exc:
            self.failed[name] = f"{type(exc).__name__}: {exc}"
            log.error("channel %s failed to start: %s", name, self.failed[name], exc_info=not isinstance(
                exc, (RuntimeError, ValidationError, OSError)) and not _is_library_error(exc))
            self._set_state(name, f"not running ({self.failed[name]})")
            return False
        self.channels[name] = channel
        self.failed.pop(name, None)
        self._set_state(name, "running")
        log.info("channel %s started", name)
        return True

    async def _keep_trying(self, name: str, entry_point: EntryPoint) -> None:
        delay = self.retry_first_s
        while True:
            await asyncio.sleep(delay)
            if await self._start_one(name, entry_point):
                return
            delay = min(RETRY_MAX_S, delay * 2)
            self._set_state(name, f"retrying in {delay:g} s ({self.failed[name]})")

    def _set_state(self, name: str, state: str) -> None:
        self.state[name] = state
        if self.on_state is not None:
            self.on_state()

    def _section(self, name: str, cls: type[BaseChannel]) -> Any:
        section = getattr(self.config.channels, name)
        if isinstance(section, dict):
            model = getattr(cls, "config_model", None) or PluginChannelConfig
            section = model.model_validate(section)
        return section

    async def stop_retrying(self) -> None:
        tasks, self._retries = list(self._retries.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop_receiving(self) -> None:
        await asyncio.gather(*(self._safely(c.stop_receiving, c.name) for c in self.channels.values()))

    async def stop(self) -> None:
        channels, self.channels = list(self.channels.values()), {}
        await asyncio.gather(*(self._safely(c.stop, c.name) for c in channels))

    @staticmethod
    async def _safely(step: Any, name: str) -> None:
        try:
            await step()
        except Exception:
            log.exception("channel %s: error while stopping", name)

    # ---- outbound -----------------------------------------------------------------------
    async def route(self) -> None:
        """Deliver ``bus.outbound`` until cancelled."""
        while True:
            self.deliver(await self.bus.outbound.get())

    def deliver(self, msg: OutboundMessage) -> None:
        channel = self.channels.get(msg.channel)
        if channel is None:
            log.warning("no running channel %r: dropped a message to %s", msg.channel, msg.target)
            return
        previous = self._last.get(msg.target)
        if previous is not None and (msg.kind == "typing" or msg.kind == "stream" == self._last_kind[msg.target]):
            return  # still sending there: a typing indicator now would be stale, a newer stream update follows
        task = asyncio.create_task(self._send(channel, msg, previous), name=f"send {msg.target}")
        self._last[msg.target] = task
        self._last_kind[msg.target] = msg.kind
        self._inflight.add(task)
        task.add_done_callback(partial(self._sent, msg.target))

    async def _send(self, channel: BaseChannel, msg: OutboundMessage, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # the chat's earlier messages go first
        try:
            if msg.kind == "typing":
                await channel.send_typing(msg.chat_id)
            elif msg.kind == "stream":
                await channel.send_stream(msg)
            elif msg.kind == "file":
                await channel.send_file(msg)
            else:
                await channel.send(msg)
        except Exception:  # adapters should not raise, but one that does must not stop the router
            log.exception("channel %s: sending to %s failed", channel.name, msg.chat_id)

    def _sent(self, target: str, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if self._last.get(target) is task:
            del self._last[target]

    async def drain(self, timeout: float) -> None:
        """After ``route()`` is cancelled: send what is still queued, for up to ``timeout`` s."""
        while not self.bus.outbound.empty():
            self.deliver(self.bus.outbound.get_nowait())
        if not self._inflight:
            return
        _, late = await asyncio.wait(set(self._inflight), timeout=timeout)
        if late:
            log.warning("shutdown: %d message(s) could not be sent in time", len(late))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
