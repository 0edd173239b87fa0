"""The seam between channels and agents: two queues of plain messages.

Channels put what people say on ``inbound`` and send what comes off ``outbound``; agents
read ``inbound`` and write ``outbound``. Neither side imports the other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal


# Who asked: a person (any channel, the API), a cron prompt job; "task": a result delivered into the
# chat with no model call (a background task's, a code job's output for a chat nobody is messaged in);
# "seen": the terminal showed its reader what waited (up to a position), marked where the chat runs.
Source = Literal["user", "cron", "task", "seen"]


@dataclass(frozen=True)
class Identity:
    """Who sent a message, as far as the platform vouches for it. Access (``allowFrom``,
    pairing) and trust (``owners``) match ``id`` and ``handle`` and nothing else; ``name`` is
    only ever shown. A From header's name part, a profile name or a display name is a ``name``:
    anyone can write one, so no adapter may pass it as anything else."""

    id: str  # the platform's id: a user id, a number, a Matrix user id, an authenticated address
    handle: str | None = None  # a unique name the platform vouches for (Telegram's @username), else None
    name: str | None = None  # for showing only


# Which of a sender's names may pass to another account (``nanobot.handles``): the handle (a
# username) where the id is the account's own (Telegram, Discord); the id (a phone number) where
# the handle is the account's (Signal's UUID, WhatsApp's business-scoped id).
Moves = Literal["handle", "id"]


@dataclass
class InboundMessage:
    """A message in: typed fields only (what one platform alone needs stays in its adapter)."""

    channel: str
    chat_id: str
    sender_id: str
    content: str
    sender_name: str | None = None  # for showing only (``Identity.name``)
    media: list[str] = field(default_factory=list)  # workspace-relative paths of downloaded files
    is_private: bool = False  # a one-to-one chat with the sender (decides owner trust)
    received_at: float = field(default_factory=time.monotonic)
    source: Source = "user"
    delivery_key: str | None = None  # the platform's id for the message: a repeat of it is dropped
    durations: dict[str, float] | None = None  # seconds of the recordings among ``media``, as reported
    untrusted: str | None = None  # outside content it carries (a forward): the turn is tainted
    reply_context: dict[str, str] | None = None  # what replies need to thread under it (a mail's ids)
    mode: str | None = None  # the execution mode asked for this turn (the API's, the terminal's)
    intake_id: int | None = None  # its record in the intake, once recorded
    resumed: bool = False  # recorded, its turn begun before a crash or restart: run again, once
    # Travels with the message, never stored: the caller waiting for the reply (Dispatcher.ask, the API).
    reply_future: asyncio.Future[str] | None = field(default=None, repr=False, compare=False)
    sender_handle: str | None = None  # the platform-vouched handle (``Identity.handle``)
    album: str | None = None  # the album it is a part of (Telegram's media_group_id): answered as one
    joined: list[int] = field(default_factory=list)  # intake ids of its album's parts joined into it

    @property
    def sender(self) -> Identity:
        return Identity(self.sender_id, self.sender_handle, self.sender_name)

    @property
    def session_key(self) -> str:
        return f"{self.channel}:{self.chat_id}"


@dataclass(frozen=True)
class OutgoingFile:
    """A file to send (``kind == "file"``); the bytes were read through the path guard."""

    name: str
    data: bytes
    photo: bool  # shown as a picture (sendPhoto, an inline image) rather than as a document
    voice: bool = False  # a spoken reply, OGG/Opus: a voice note where the platform has them (sendVoice)


@dataclass
class OutboundMessage:
    channel: str
    chat_id: str
    content: str = ""
    # "text" is a message to show; "typing" asks the channel to show a typing indicator;
    # "stream" is the reply so far, shown in one message the channel keeps editing
    # (``stream_id``); the final "text" with the same stream_id replaces it;
    # "file" sends ``file`` with ``content`` as its caption.
    kind: Literal["text", "typing", "stream", "file"] = "text"
    reply_to: str | None = None
    file: OutgoingFile | None = None
    stream_id: int | None = None  # the streamed reply this updates (a "stream"), or completes (a "text")
    durable: bool = True  # False: best effort, not kept in the outbox (a notice that would be stale later)
    turn_reply: bool = False  # the turn's reply: everything else of the turn went out before it
    voice_follows: float | None = None  # the reply's voice note comes within this many seconds (the API waits)
    reply_context: dict[str, str] | None = None  # the answered message's (``InboundMessage.reply_context``)
    offer: tuple[str, ...] = ()  # what the answer offers to pick, each the command a pick sends (``Offer``)
    failed: bool = False  # the reply says the turn failed (a cron prompt job's run is then an error)
    outbox_id: int | None = None  # its record in the outbox, once recorded
    outbox_created: float | None = None  # when it was recorded (a message refused for a day is dropped)
    parts_sent: int = 0  # of a reply sent in parts: how many the platform took at earlier attempts

    @property
    def target(self) -> str:
        return f"{self.channel}:{self.chat_id}"

    @property
    def answers(self) -> str | None:
        """The platform's id of the message this shows as a reply to: ``reply_to``, else the
        answered message's (an adapter puts it in ``reply_context`` where a group needs it)."""
        return self.reply_to or (self.reply_context or {}).get("message_id")


class MessageBus:
    def __init__(self) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def publish_inbound(self, msg: InboundMessage) -> None:
        await self.inbound.put(msg)

    async def publish_outbound(self, msg: OutboundMessage) -> None:
        await self.outbound.put(msg)


def split_target(target: str) -> tuple[str, str]:
    """``"telegram:123"`` -> ``("telegram", "123")``; a ValueError names the bad target."""
    channel, sep, chat_id = target.partition(":")
    if not sep or not channel or not chat_id:
        raise ValueError(f"target must look like 'channel:chat_id', got {target!r}")
    return channel, chat_id
