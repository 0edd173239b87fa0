"""Channel adapters in the gateway: found through entry points, started from config, and fed
from ``bus.outbound``.

Adapters register under the entry-point group ``nanobot.channels`` (name -> BaseChannel
subclass), so a third-party package adds a channel by being installed. Its config section is
``channels.<name>``: built-in channels have typed sections in ``nanobot.config``; any other
is a ``PluginChannelConfig`` (enabled, allowFrom, owners, groupPolicy, streaming, plus the
adapter's own keys), validated again with the adapter's ``config_model`` if it has one.

A channel that fails to start (a network outage, a Bot API that is down) is retried with
backoff, from ``RETRY_FIRST_S`` doubling to ``RETRY_MAX_S``, for as long as the gateway runs;
``state`` says where each channel stands, for ``nanobot status``.

Replies go out in order per chat and concurrently across chats: one slow chat (a 429
backoff, a long split reply) does not hold up the others. With an ``Outbox`` (the gateway),
text and files are recorded before they are sent and retried until the platform takes them
(see ``nanobot.delivery.outbox``); typing indicators and streamed previews are not worth
keeping. A failing send never stops the router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from functools import partial
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import ValidationError

from nanobot.channel_plugin import BaseChannel, ChannelContext, SendFailed
from nanobot import metrics
from nanobot.bus import EPHEMERAL, MessageBus, OutboundMessage
from nanobot.config import ChannelSection, Config, PluginChannelConfig
from nanobot.delivery.outbox import Outbox, SendGate
from nanobot.listener import ListenError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nanobot.channels"
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0
DURABLE_KINDS = ("text", "file")  # recorded in the outbox; typing and stream previews are not


def _is_library_error(exc: Exception) -> bool:
    """The client libraries' own errors (a bad token, a refused connection) need no traceback."""
    return type(exc).__module__.split(".")[0] in ("telegram", "discord", "aiohttp", "httpx")


def installed_channels() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class ChannelManager:
    """Owns the running channels and the task that routes outbound messages to them."""

    def __init__(self, config: Config, ctx: ChannelContext, outbox: Outbox | None = None) -> None:
        self.config = config
        self.ctx = ctx
        self.outbox = outbox
        if outbox is not None:
            outbox.sender = self.deliver
        self._gates: dict[str, SendGate] = {}
        self._up: dict[str, asyncio.Event] = {}  # set while the channel runs: durable sends wait for it
        self._finished_streams: OrderedDict[Any, None] = OrderedDict()  # streams whose final text was sent
        self.channels: dict[str, BaseChannel] = {}
        self.failed: dict[str, str] = {}  # enabled channels not running now, and why
        self.state: dict[str, str] = {}  # every enabled channel: "running" or why not, for status
        self.failing_since: dict[str, float] = {}  # channels not running, since when (monotonic; /readyz)
        self.on_state: Any = None  # called (no arguments) whenever ``state`` changes
        self.retry_first_s = RETRY_FIRST_S
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, asyncio.Task[None]] = {}  # per chat: the newest send, to chain after
        self._last_kind: dict[str, str] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        self._internal: list[str] = []  # channels of the gateway itself (the API), not of the config

    @property
    def bus(self) -> MessageBus:
        return self.ctx.bus

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
    async def start(self) -> None:
        """Start every enabled channel, concurrently. A channel that fails is logged and
        recorded in ``failed``; the others carry on."""
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
            channel = cls(self._section(name, cls), self.ctx)
            await channel.start()
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
        if self.on_state is not None:
            self.on_state()

    def _section(self, name: str, cls: type[BaseChannel]) -> ChannelSection:
        section = self.config.channels.section(name) or PluginChannelConfig()
        if cls.config_model is not None and not isinstance(section, cls.config_model):
            section = cls.config_model.model_validate(section.model_dump())  # the adapter's own keys, typed
        return section

    async def stop_retrying(self) -> None:
        tasks, self._retries = list(self._retries.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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

    # ---- outbound -----------------------------------------------------------------------
    async def route(self) -> None:
        """Deliver ``bus.outbound`` until cancelled; text and files are recorded first."""
        while True:
            msg = await self.bus.outbound.get()
            if (self.outbox is not None and msg.kind in DURABLE_KINDS and "outbox_id" not in msg.metadata
                    and not msg.metadata.get(EPHEMERAL)):
                # Recorded in the background (commits are batched); it is delivered once recorded,
                # and the recordings complete in the order they were asked for.
                task = asyncio.create_task(self._record(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            else:
                self.deliver(msg)

    async def _record(self, msg: OutboundMessage) -> None:
        assert self.outbox is not None
        try:
            await self.outbox.put(msg)
        except Exception:
            log.exception("could not record a message to %s; sending it unrecorded", msg.target)
            self.deliver(msg)

    def deliver(self, msg: OutboundMessage) -> None:
        stream_id = msg.metadata.get("stream_id")
        if msg.kind == "stream" and stream_id in self._finished_streams:
            return  # a late preview of a reply already sent in full
        if msg.kind in DURABLE_KINDS and stream_id is not None:
            self._finished_streams[stream_id] = None
            while len(self._finished_streams) > 1000:
                self._finished_streams.popitem(last=False)
        durable = self.outbox is not None and "outbox_id" in msg.metadata
        channel = self.channels.get(msg.channel)
        if channel is None and not durable:
            log.warning("no running channel %r: dropped a message to %s", msg.channel, msg.target)
            return
        previous = self._last.get(msg.target)
        if previous is not None and (msg.kind == "typing" or msg.kind == "stream" == self._last_kind[msg.target]):
            return  # still sending there: a typing indicator now would be stale, a newer stream update follows
        send = self._send_durable(msg, previous) if durable else self._send(channel, msg, previous)
        task = asyncio.create_task(send, name=f"send {msg.target}")
        self._last[msg.target] = task
        self._last_kind[msg.target] = msg.kind
        self._inflight.add(task)
        task.add_done_callback(partial(self._sent, msg.target))

    async def _send(self, channel: BaseChannel, msg: OutboundMessage, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # the chat's earlier messages go first
        try:
            await _send_one(channel, msg)
        except Exception as exc:  # adapters should not raise, but one that does must not stop the router
            log.warning("channel %s: sending to %s failed: %s", channel.name, msg.chat_id, exc,
                        exc_info=not isinstance(exc, SendFailed))

    async def _send_durable(self, msg: OutboundMessage, previous: asyncio.Task[None] | None) -> None:
        """Send until the platform takes it (waiting for the channel to run, backing off while
        it is down), then mark it sent; mark it failed if the platform refuses it."""
        assert self.outbox is not None
        if previous is not None:
            await asyncio.wait({previous})
        failures = 0
        while True:
            channel = self.channels.get(msg.channel)
            if channel is None:
                if msg.channel not in self.enabled():
                    return self.outbox.failed(msg, f"channel {msg.channel!r} is not enabled")
                await self._up.setdefault(msg.channel, asyncio.Event()).wait()
                continue
            try:
                await self._gate(msg.channel).attempt(partial(_send_one, channel, msg))
            except SendFailed as exc:
                failures += 1
                if not exc.retry or self.outbox.expired(msg):
                    return self.outbox.failed(msg, str(exc))
                if failures == 1 or failures % 30 == 0:
                    log.warning("%s is not taking messages (%s); will keep trying (attempt %d)",
                                msg.channel, exc, failures)
                continue
            except Exception as exc:  # an adapter's bug: trying again would fail the same way
                log.exception("channel %s: sending to %s failed", channel.name, msg.chat_id)
                return self.outbox.failed(msg, f"{type(exc).__name__}: {exc}")
            return await self.outbox.sent(msg)

    def _gate(self, channel: str) -> SendGate:
        return self._gates.setdefault(channel, SendGate())

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


async def _send_one(channel: BaseChannel, msg: OutboundMessage) -> None:
    if msg.kind == "typing":
        await channel.send_typing(msg.chat_id)
    elif msg.kind == "stream":
        await channel.send_stream(msg)
    elif msg.kind == "file":
        await channel.send_file(msg)
        metrics.current.reply_sent(msg.channel)
    else:
        await channel.send(msg)
        metrics.current.reply_sent(msg.channel)
