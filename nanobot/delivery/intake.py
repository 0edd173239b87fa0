"""Messages in: recorded before they are confirmed, repeats dropped, unfinished ones resumed.

A message counts as finished when its reply is in the outbox (``Outbound.put(finishes=...)``)
or it needs none (``/stop`` of it, an empty reply). At start every unfinished message is
queued again in its chat's order. If its turn had begun before the crash (the chat's history
says so: the dispatcher records the message's ``intake_id`` in the session's meta when the
turn starts, and where in the history its message goes), the turn is run again on the
message already recorded, followed by a note: what the first attempt did is in the history
after it, so the model can carry on instead of repeating side effects blindly.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
import uuid
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from nanobot import metrics
from nanobot.bus import InboundMessage, MessageBus, OutboundMessage, split_target
from nanobot.trust import HISTORY_CHANNELS

if TYPE_CHECKING:
    from nanobot.delivery.store import DeliveryStore
    from nanobot.session import Histories

log = logging.getLogger(__name__)

RESUMED_NOTE = ("[nanobot was restarted while answering my last message above. Anything in the history after "
                "it already happened (messages sent, files written, commands run): do not redo it; carry on "
                "from where it stopped and answer it.]")


Tell = Callable[[str, str, str], Awaitable[None]]  # (target, sender, text): ``DurableIntake.tell``

DISK_FULL_REPLY = "I cannot store messages right now: the disk is full. I will answer once there is room again."
DISK_FULL_EVERY = 60.0  # seconds: at most one such reply per chat


class StorageFull(Exception):
    """Messages could not be recorded for lack of room; the platform must not be told they arrived."""


def is_disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)) or \
        (isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower())


class Route(Protocol):
    """Where recorded messages go: this gateway's dispatcher, or (workers) their chat's holder."""

    async def expect(self, messages: list[InboundMessage]) -> None:
        """About to record these (their objects carry what a record cannot: a waiting caller)."""

    async def arrived(self, messages: list[InboundMessage]) -> None:
        """Recorded: each new one has its ``intake_id``; repeats have none."""


class LocalRoute:
    """One gateway: straight to its dispatcher."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    async def expect(self, messages: list[InboundMessage]) -> None:
        return None

    async def arrived(self, messages: list[InboundMessage]) -> None:
        for msg in messages:
            if msg.intake_id is not None:
                await self.bus.publish_inbound(msg)


class DurableIntake:
    """What channels hand admitted messages to (``ChannelContext.intake``) in the gateway."""

    def __init__(self, store: DeliveryStore, bus: MessageBus, route: Route | None = None) -> None:
        self.store = store
        self.bus = bus
        self.route: Route = route or LocalRoute(bus)
        self.repeats = 0  # dropped because they were stored before (for tests and the log)
        self._told_full: dict[tuple[str, str], float] = {}  # chat -> when it was told the disk is full

    async def accept(self, messages: list[InboundMessage]) -> None:
        if not messages:
            return
        for msg in messages:  # a plugin channel may have no id of its own: then no repeat can be caught
            msg.delivery_key = msg.delivery_key or uuid.uuid4().hex
        await self.route.expect(messages)
        try:
            ids = await self._record(messages)
        except BaseException:
            await self.route.arrived(messages)  # none recorded (none has an intake id): forgotten
            raise
        for msg, intake_id in zip(messages, ids):
            if intake_id is None:
                self.repeats += 1
                log.info("%s: dropped a repeat of message %s", msg.channel, msg.delivery_key)
            else:
                msg.intake_id = intake_id
                metrics.current.received(msg.channel)
        await self.route.arrived(messages)

    async def tell(self, target: str, sender: str, text: str) -> None:
        """Something for a chat with nobody asking (a job's output, the heartbeat's report). The
        terminal's and the API's chats have nobody to message: it is kept in the chat's history
        for its reader, written by the chat's holder in the chat's order, as a task's result is."""
        channel, chat_id = split_target(target)
        if channel in HISTORY_CHANNELS:
            await self.accept([InboundMessage(channel, chat_id, sender, text, source="task")])
        else:
            await self.bus.publish_outbound(OutboundMessage(channel, chat_id, text))

    async def _record(self, messages: list[InboundMessage]) -> list[int | None]:
        try:
            return await self.store.record_inbound(messages)
        except (OSError, sqlite3.Error) as exc:
            if not is_disk_full(exc):
                raise
            self._tell_disk_full(messages)
            raise StorageFull(f"the disk holding the database is full ({exc})") from None

    def _tell_disk_full(self, messages: list[InboundMessage]) -> None:
        """One short reply per chat a minute, sent without the outbox (which cannot record either)."""
        now = time.monotonic()
        for msg in messages:
            chat = (msg.channel, msg.chat_id)
            if now - self._told_full.get(chat, float("-inf")) >= DISK_FULL_EVERY:
                self._told_full[chat] = now
                self.bus.outbound.put_nowait(OutboundMessage(msg.channel, msg.chat_id, DISK_FULL_REPLY,
                                                             durable=False))

    async def resume(self, sessions: Histories) -> int:
        """Queue the messages a crash or a restart left unanswered, in order; how many."""
        unfinished = await self.store.unfinished_inbound()
        for msg in unfinished:
            await mark_if_resumed(msg, sessions)
            await self.bus.publish_inbound(msg)
        if unfinished:
            log.warning("resuming %d message(s) left unanswered by the last run (%d cut mid-turn)",
                        len(unfinished), sum(1 for m in unfinished if m.resumed))
        return len(unfinished)


async def mark_if_resumed(msg: InboundMessage, sessions: Histories) -> None:
    """A recorded message whose turn had begun (the chat's history says so) is run again on the
    message already recorded, with a note (see the module's docstring)."""
    started = (await sessions.open(msg.session_key)).meta.intake_started
    if started is not None and msg.intake_id is not None and started >= msg.intake_id:
        msg.resumed = True
