"""A channel that records what the gateway sends it: the chat platform's side, for tests and
benchmarks that need no platform of their own (added with ``Gateway.add_internal_channel``)."""

from __future__ import annotations

import asyncio

from nanobot.bus import OutboundMessage
from nanobot.channel_plugin import BaseChannel


class Recorder(BaseChannel):
    max_message_len = 1_000_000

    def __init__(self, name: str) -> None:  # no config section, no context: it only receives
        self.name = name  # type: ignore[misc]
        self.sent: asyncio.Queue[OutboundMessage] = asyncio.Queue()  # texts and typing, in order

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, msg: OutboundMessage) -> None:
        self.sent.put_nowait(msg)

    async def send_stream(self, msg: OutboundMessage) -> None:
        return None  # the final text comes to send()

    async def send_typing(self, chat_id: str) -> None:
        self.sent.put_nowait(OutboundMessage(self.name, chat_id, kind="typing"))
