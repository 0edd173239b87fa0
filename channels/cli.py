"""The terminal as a channel, for the interactive ``nanobot agent``.

Lines typed go to ``bus.inbound``; messages for the chat are printed. The person at the
terminal owns the bot, so no access gate applies. Reading stdin blocks, so it happens in a
worker thread; the loop stays free to print progress notes and to take ``/stop`` while a
turn runs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from channels.base import BaseChannel
from nanobot.bus import InboundMessage, MessageBus, OutboundMessage


class CliChannel(BaseChannel):
    name = "cli"
    max_message_len = 1_000_000

    def __init__(self, session_key: str, bus: MessageBus, *, metadata: dict[str, Any] | None = None,
                 read_line: Callable[[str], str] = input, write: Callable[[str], None] = print) -> None:
        # No config section and no gate: the terminal is the owner's.
        self.channel, _, self.chat_id = session_key.partition(":")
        self.bus = bus
        self.metadata = metadata or {}
        self.read_line, self.write = read_line, write
        self.closed = asyncio.Event()  # set when the user ends input (EOF, Ctrl-D, "exit")
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="terminal input")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def send(self, msg: OutboundMessage) -> None:
        if msg.kind == "text" and msg.content:
            self.write(msg.content)

    async def send_typing(self, chat_id: str) -> None:
        return None  # the prompt line already shows that the bot is working

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    line = (await loop.run_in_executor(None, self.read_line, "")).strip()
                except (EOFError, KeyboardInterrupt):
                    return
                if line in ("exit", "quit"):
                    return
                if line:
                    await self.bus.publish_inbound(InboundMessage(self.channel, self.chat_id, "owner", line,
                                                                  metadata=dict(self.metadata)))
        finally:
            self.closed.set()
