"""Messages out: recorded, sent in order per chat, marked when the platform took them.

``put`` records a message (and, in the same commit, finishes the message it answers), then
hands it to the sender (``gateway.outbound.Outbound``, which owns it). The sender retries a failed send for as long as
the platform is down: a ``SendGate`` per channel lets one send probe at a time, every 0.25 s
doubling to 2 s, while the chat's later messages wait behind it, so order is kept and the
first reply goes out within seconds of recovery. A crash between a send and its mark sends
that one message again at start; nothing else is repeated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot.channel_plugin import SendFailed
from nanobot.bus import OutboundMessage

if TYPE_CHECKING:
    from nanobot.delivery.store import DeliveryStore

log = logging.getLogger(__name__)

GIVE_UP_S = 24 * 3600  # a message still not accepted after this long is dropped (logged)


class Outbox:
    def __init__(self, store: DeliveryStore, sender: Callable[[OutboundMessage], None]) -> None:
        self.store = store
        self.sender = sender  # sends in order per chat, and marks what the platform took

    async def put(self, msg: OutboundMessage, *, finishes: int | None = None) -> None:
        """Record ``msg`` durably, then send it; ``finishes``: the intake id it answers."""
        if msg.kind == "text" and not msg.content.strip():  # nothing to send: only finish the message
            if finishes is not None:
                await self.store.finish_inbound(finishes)
            return
        # Shielded: the write is queued and commits even if our caller is cancelled meanwhile (a
        # turn stopped when the worker lost its database connection); a recorded reply must then
        # still be handed to the sender, or it would sit in the outbox with nobody to send it.
        recorded = asyncio.ensure_future(self._record_and_send(msg, finishes))
        await asyncio.shield(recorded)

    async def _record_and_send(self, msg: OutboundMessage, finishes: int | None) -> None:
        outbox_id = await self.store.record_outbound(msg, finishes)
        if outbox_id is None:
            log.warning("%s: this reply is not sent: its message was answered already, or its chat went to "
                        "another worker while this one was cut off from the database (that one answers it)",
                        msg.target)
            return
        msg.outbox_id, msg.outbox_created = outbox_id, msg.outbox_created or time.time()
        self.sender(msg)

    async def resend_pending(self) -> int:
        """At start: what the last run recorded but did not see accepted, in order."""
        pending = await self.store.pending_outbound()
        self.resend(pending)
        if pending:
            log.warning("sending %d message(s) the last run did not get out", len(pending))
        return len(pending)

    def resend(self, recorded: list[OutboundMessage]) -> None:
        """Hand messages recorded earlier (by a run or a worker now gone) to the sender, in order."""
        for msg in recorded:
            self.sender(msg)

    async def sent(self, msg: OutboundMessage) -> None:
        """Mark ``msg`` sent, and wait until that is written: the chat's next message goes out
        only then, so a crash can repeat at most one reply per chat."""
        try:
            await self._mark(msg, "sent")
        except Exception as exc:
            log.warning("could not mark a message to %s as sent: %s", msg.target, exc)

    def failed(self, msg: OutboundMessage, why: str) -> None:
        log.error("gave up on a message to %s: %s", msg.target, why)
        self._mark(msg, "failed", why).add_done_callback(_log_failure)

    def expired(self, msg: OutboundMessage) -> bool:
        return msg.outbox_created is not None and time.time() - msg.outbox_created > GIVE_UP_S

    def _mark(self, msg: OutboundMessage, state: str, why: str | None = None) -> asyncio.Future[Any]:
        # Only recorded messages are marked: put() and resend_pending() gave each its outbox_id.
        assert msg.outbox_id is not None
        return self.store.mark_outbound(msg.outbox_id, state, why)  # with other chats' marks


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not mark an outbox message: %s", task.exception())


class SendGate:
    """One channel's health, as its sends see it. While it is down, one send at a time
    probes, after a wait that doubles from ``first`` to ``cap``; the others wait their turn,
    so a dead API gets one request every few seconds, not one per waiting chat."""

    first: float = 0.25  # seconds before the first probe (tests shrink both)
    cap: float = 2.0  # the longest wait between probes: a recovered platform is noticed this soon

    def __init__(self) -> None:
        self.delay = 0.0  # 0: healthy
        self._until = 0.0
        self._probe = asyncio.Lock()

    @property
    def down(self) -> bool:
        return self.delay > 0

    async def attempt(self, send: Callable[[], Awaitable[None]]) -> None:
        if self.down:
            async with self._probe:
                if self.down:  # this send is the probe; the others wait for its outcome
                    await asyncio.sleep(max(0.0, self._until - time.monotonic()))
                    return await self._try(send)
        await self._try(send)  # healthy (again): no queueing behind the lock

    async def _try(self, send: Callable[[], Awaitable[None]]) -> None:
        try:
            await send()
        except SendFailed as exc:
            if exc.retry:
                self.delay = min(self.cap, self.delay * 2 if self.delay else self.first)
                self._until = time.monotonic() + self.delay
            raise
        self.delay = 0.0
