"""The seam between channels and agents: two queues of plain messages.

Channels put what people say on ``inbound`` and send what comes off ``outbound``; agents
read ``inbound`` and write ``outbound``. Neither side imports the other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class InboundMessage:
    channel: str
    chat_id: str
    sender_id: str
    content: str
    sender_name: str | None = None
    media: list[str] = field(default_factory=list)  # workspace-relative paths of downloaded files
    is_private: bool = False  # a one-to-one chat with the sender (decides owner trust)
    metadata: dict[str, Any] = field(default_factory=dict)
    received_at: float = field(default_factory=time.monotonic)

    @property
    def session_key(self) -> str:
        return f"{self.channel}:{self.chat_id}"


EPHEMERAL = "ephemeral"  # OutboundMessage.metadata key: best effort, not kept in the outbox
# InboundMessage.metadata key: the future a caller waits on for the reply (Dispatcher.ask, the
# API); never stored.
REPLY_FUTURE = "reply_future"
# OutboundMessage.metadata key: this is the turn's reply (sent after everything else of the turn)
TURN_REPLY = "turn_reply"
# InboundMessage.metadata key a channel may set (say, the mail a reply must thread under); the
# dispatcher hands it back in the metadata of the replies and notes that answer that message
REPLY_CONTEXT = "reply_context"


@dataclass(frozen=True)
class OutgoingFile:
    """A file to send (``kind == "file"``); the bytes were read through the path guard."""

    name: str
    data: bytes
    photo: bool  # shown as a picture (sendPhoto, an inline image) rather than as a document


@dataclass
class OutboundMessage:
    channel: str
    chat_id: str
    content: str = ""
    # "text" is a message to show; "typing" asks the channel to show a typing indicator;
    # "stream" is the reply so far, shown in one message the channel keeps editing
    # (``metadata["stream_id"]``); the final "text" with the same stream_id replaces it;
    # "file" sends ``file`` with ``content`` as its caption.
    kind: Literal["text", "typing", "stream", "file"] = "text"
    reply_to: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    file: OutgoingFile | None = None

    @property
    def target(self) -> str:
        return f"{self.channel}:{self.chat_id}"


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
