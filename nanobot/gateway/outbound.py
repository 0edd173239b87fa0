"""The one way out: every outbound message (a final reply, a progress note, a stream update,
typing, a notice) goes through ``Outbound``, which alone records, sends and marks them, with
a send gate per channel and each chat's order.

Replies go out in order per chat and concurrently across chats: one slow chat (a 429
backoff, a long split reply) does not hold up the others. Text and files are recorded before
they are sent (``put``: in the same commit, the message they answer is finished), retried
until the platform takes them, then marked sent: a crash between a send and its mark sends
that one message again at start, nothing else. Typing indicators and streamed previews are not
worth keeping. A failing send never stops the router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

from nanobot import metrics
from nanobot.bus import MessageBus, OutboundMessage
from nanobot.channel_plugin import PART_WENT, BaseChannel, SendFailed
from nanobot.delivery.outbox import GIVE_UP_S, SendGate
from nanobot.eventloop import Background, raise_if_cancelled

if TYPE_CHECKING:
    from nanobot.delivery.store import DeliveryStore
    from nanobot.gateway.supervisor import ChannelSupervisor

log = logging.getLogger(__name__)

DURABLE_KINDS = ("text", "file")  # recorded in the outbox; typing and stream previews are not
SEND_RETRY = (0.25, 2.0)  # seconds: a platform that is down is probed after the first, then at most the second


class Outbound:
    """Routes ``bus.outbound`` and the dispatcher's replies to the running channels."""

    def __init__(self, bus: MessageBus, channels: ChannelSupervisor, store: DeliveryStore, *,
                 send_retry: tuple[float, float] = SEND_RETRY) -> None:
        self.bus = bus
        self.channels = channels
        self.store = store  # the outbox's rows
        self.send_retry = send_retry  # a channel that is down: the first probe's wait, the longest wait
        self._gates: dict[str, SendGate] = {}
        self._finished_streams: OrderedDict[Any, None] = OrderedDict()  # streams whose final text was sent
        # Per chat, while one is on its way: the newest send (to chain after) and its kind.
        self._last: dict[str, tuple[asyncio.Task[None], str]] = {}
        self._on_way: set[int] = set()  # outbox ids being sent
        self._inflight = Background()  # recordings and sends

    async def route(self) -> None:
        """Deliver ``bus.outbound`` until cancelled; text and files are recorded first."""
        while True:
            msg = await self.bus.outbound.get()
            if msg.kind in DURABLE_KINDS and msg.outbox_id is None and msg.durable:
                # Recorded in the background (commits are batched); it is delivered once recorded,
                # and the recordings complete in the order they were asked for.
                self._inflight.run(self._record(msg), name=f"record {msg.target}")
            else:
                self.deliver(msg)

    async def _record(self, msg: OutboundMessage) -> None:
        try:
            await self.put(msg)
        except Exception:
            log.exception("could not record a message to %s; sending it unrecorded", msg.target)
            self.deliver(msg)

    async def put(self, msg: OutboundMessage, *, finishes: int | None = None, joined: Sequence[int] = ()) -> None:
        """Record ``msg`` durably, then send it; ``finishes``: the intake id it answers
        (``joined``: those of the album parts joined into that message)."""
        if msg.kind == "text" and not msg.content.strip():  # nothing to send: only finish the message
            await self.store.finish_inbound(*(i for i in (finishes, *joined) if i is not None))
            return
        # Shielded: the write is queued and commits even if our caller is cancelled meanwhile (a
        # turn stopped when the worker lost its database connection); a recorded reply must then
        # still be sent, or it would sit in the outbox with nobody to send it.
        await asyncio.shield(asyncio.ensure_future(self._record_and_send(msg, finishes, joined)))

    async def _record_and_send(self, msg: OutboundMessage, finishes: int | None, joined: Sequence[int]) -> None:
        # Timed before it is recorded, so a send after a restart (read back from the row) and the
        # first carry the same time: channels make their once-only send ids of it.
        msg.outbox_created = msg.outbox_created or time.time()
        outbox_id = await self.store.record_outbound(msg, finishes, joined)
        if outbox_id is None:
            log.warning("%s: this reply is not sent: its message was answered already, or its chat went to "
                        "another worker while this one was cut off from the database (that one answers it)",
                        msg.target)
            return
        msg.outbox_id = outbox_id
        self.deliver(msg)

    async def resend_pending(self) -> int:
        """At start: what the last run recorded but did not see accepted, in order."""
        pending = await self.store.pending_outbound()
        self.resend(pending)
        if pending:
            log.warning("sending %d message(s) the last run did not get out", len(pending))
        return len(pending)

    def resend(self, recorded: list[OutboundMessage]) -> None:
        """Send messages recorded earlier (by a run or a worker now gone), in order."""
        for msg in recorded:
            self.deliver(msg)

    def deliver(self, msg: OutboundMessage) -> None:
        stream_id = msg.stream_id
        if msg.kind == "stream" and stream_id in self._finished_streams:
            return  # a late preview of a reply already sent in full
        if msg.kind in DURABLE_KINDS and stream_id is not None:
            self._finished_streams[stream_id] = None
            while len(self._finished_streams) > 1000:
                self._finished_streams.popitem(last=False)
        outbox_id = msg.outbox_id
        durable = outbox_id is not None
        if outbox_id in self._on_way:
            return  # handed over again while still on its way (an adoption retried after an outage)
        channel = self.channels.channels.get(msg.channel)
        if channel is None and not durable:
            log.warning("no running channel %r: dropped a message to %s", msg.channel, msg.target)
            return
        previous, previous_kind = self._last.get(msg.target, (None, ""))
        if previous is not None and (msg.kind == "typing" or msg.kind == "stream" == previous_kind):
            return  # still sending there: a typing indicator now would be stale, a newer stream update follows
        send = self._send_durable(msg, previous) if durable else self._send(channel, msg, previous)
        task = self._inflight.run(send, name=f"send {msg.target}")
        self._last[msg.target] = (task, msg.kind)
        task.add_done_callback(partial(self._sent, msg.target))
        if outbox_id is not None:
            self._on_way.add(outbox_id)
            task.add_done_callback(lambda _: self._on_way.discard(outbox_id))

    async def _send(self, channel: BaseChannel, msg: OutboundMessage, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # the chat's earlier messages go first
        try:
            await send_one(channel, msg)
        except Exception as exc:  # adapters should not raise, but one that does must not stop the router
            log.warning("channel %s: sending to %s failed: %s", channel.name, msg.chat_id, exc,
                        exc_info=not isinstance(exc, SendFailed))

    async def _send_durable(self, msg: OutboundMessage, previous: asyncio.Task[None] | None) -> None:
        """Send until the platform takes it (waiting for the channel to run, backing off while
        it is down), then mark it sent; mark it failed if the platform refuses it."""
        PART_WENT.set(self._part_went)  # this task's sends: a message in parts keeps its progress
        if previous is not None:
            await asyncio.wait({previous})
        failures = 0
        if msg.channel not in self.channels.enabled():
            return self._failed(msg, f"channel {msg.channel!r} is not enabled")
        while True:
            raise_if_cancelled()  # a stop a channel's library swallowed (aiosmtplib waits with wait_for)
            channel = await self.channels.running(msg.channel)
            try:
                await self._gate(msg.channel).attempt(partial(send_one, channel, msg))
            except SendFailed as exc:
                failures += 1
                if not exc.retry or _expired(msg):
                    return self._failed(msg, str(exc))
                if failures == 1 or failures % 30 == 0:
                    log.warning("%s is not taking messages (%s); will keep trying (attempt %d)",
                                msg.channel, exc, failures)
                continue
            except Exception as exc:  # an adapter's bug: trying again would fail the same way
                log.exception("channel %s: sending to %s failed", channel.name, msg.chat_id)
                return self._failed(msg, f"{type(exc).__name__}: {exc}")
            return await self._marked_sent(msg)

    async def _part_went(self, msg: OutboundMessage) -> None:
        """A part of ``msg`` went: written before the next goes, so neither a failure nor a crash
        shows it again (``send_parts``)."""
        if msg.outbox_id is not None:  # else another message than the one recorded (an adapter's fallback)
            await self._marked(msg, "pending")

    async def _marked_sent(self, msg: OutboundMessage) -> None:
        """Mark ``msg`` sent, and wait until that is written: the chat's next message goes out
        only then, so a crash can repeat at most one reply per chat."""
        await self._marked(msg, "sent")

    async def _marked(self, msg: OutboundMessage, state: str) -> None:
        """``msg`` marked, written; a store that fails is logged (the message went all the same)."""
        try:
            await self._mark(msg, state)
        except Exception as exc:
            log.warning("could not mark a message to %s as %s: %s", msg.target, state, exc)

    def _failed(self, msg: OutboundMessage, why: str) -> None:
        log.error("gave up on a message to %s: %s", msg.target, why)
        self._mark(msg, "failed", why).add_done_callback(_log_failure)

    def _mark(self, msg: OutboundMessage, state: str, why: str | None = None) -> asyncio.Future[Any]:
        # Only recorded messages are marked: put() and resend_pending() gave each its outbox_id.
        assert msg.outbox_id is not None
        return self.store.mark_outbound(msg.outbox_id, state, why, msg.parts_sent)  # with other chats' marks

    def _gate(self, channel: str) -> SendGate:
        return self._gates.setdefault(channel, SendGate(*self.send_retry))

    def _sent(self, target: str, task: asyncio.Task[None]) -> None:
        if self._last.get(target, (None, ""))[0] is task:
            del self._last[target]

    async def drain(self, timeout: float) -> None:
        """After ``route()`` is cancelled: send what is still queued, for up to ``timeout`` s."""
        while not self.bus.outbound.empty():
            self.deliver(self.bus.outbound.get_nowait())
        if late := await self._inflight.stop(timeout):
            log.warning("shutdown: %d message(s) could not be sent in time", late)


async def send_one(channel: BaseChannel, msg: OutboundMessage) -> None:
    """The one place that decides which method of an adapter a message goes to, by its kind."""
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


def _expired(msg: OutboundMessage) -> bool:
    """Still not taken after ``GIVE_UP_S``: dropped (logged)."""
    return msg.outbox_created is not None and time.time() - msg.outbox_created > GIVE_UP_S


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not mark an outbox message: %s", task.exception())
