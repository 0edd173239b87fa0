"""The terminal as a channel, for the interactive ``nanobot agent``.

Lines typed go to ``bus.inbound``; messages for the chat are printed. The person at the
terminal owns the bot, so no access gate applies.

On a terminal, input is read with prompt_toolkit: line editing, arrows, and a history kept
in ``$NANOBOT_HOME/cli_history``; printing goes above the prompt line. Ctrl-C during a turn
cancels it (as ``/stop`` does), Ctrl-C at an idle prompt or Ctrl-D leaves. From a pipe, lines
are read by a daemon thread, so an interrupt or the end of the program never waits on it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from channels.base import BaseChannel
from nanobot.bus import InboundMessage, MessageBus, OutboundMessage

PROMPT = "you> "


class CliChannel(BaseChannel):
    name = "cli"
    max_message_len = 1_000_000

    def __init__(self, session_key: str, bus: MessageBus, *, metadata: dict[str, Any] | None = None,
                 history_file: Path | None = None, on_interrupt: Callable[[], bool] | None = None) -> None:
        # No config section and no gate: the terminal is the owner's.
        self.channel, _, self.chat_id = session_key.partition(":")
        self.bus = bus
        self.metadata = metadata or {}
        self.history_file = history_file
        self.on_interrupt = on_interrupt or (lambda: False)  # True: a turn was cancelled, keep reading
        self.closed = asyncio.Event()  # set when the user ends input (EOF, Ctrl-D, Ctrl-C when idle, "exit")
        self._reader: asyncio.Task[None] | None = None
        self._tty = sys.stdin.isatty() and sys.stdout.isatty()
        self._streamed: dict[Any, str] = {}  # stream_id -> the lines of it printed so far

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="terminal input")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def send(self, msg: OutboundMessage) -> None:
        if msg.kind == "stream":
            return await self.send_stream(msg)
        if msg.kind == "text" and msg.content:
            printed = self._streamed.pop(msg.metadata.get("stream_id"), None)
            if printed is not None and msg.content.startswith(printed):
                rest = msg.content[len(printed):].lstrip("\n")
                if rest:
                    print(rest, flush=True)
                return
            print(msg.content, flush=True)  # on a terminal, patch_stdout puts it above the prompt line

    async def send_stream(self, msg: OutboundMessage) -> None:
        """Whole lines of the reply as they are written (a terminal's prompt line needs whole lines)."""
        stream_id = msg.metadata.get("stream_id")
        printed = self._streamed.get(stream_id, "")
        if not msg.content.startswith(printed):
            return  # a new model call rewrote the text: the final reply shows it
        done = msg.content[:msg.content.rfind("\n") + 1] if "\n" in msg.content else ""
        if len(done) > len(printed):
            print(done[len(printed):].rstrip("\n"), flush=True)
            self._streamed[stream_id] = done

    async def send_typing(self, chat_id: str) -> None:
        return None  # the prompt line already shows that the bot is working

    async def _read(self) -> None:
        lines = self._terminal_lines() if self._tty else self._piped_lines()
        try:
            async for line in lines:
                line = line.strip()
                if line in ("exit", "quit"):
                    return
                if line:
                    await self.bus.publish_inbound(InboundMessage(self.channel, self.chat_id, "owner", line,
                                                                  metadata=dict(self.metadata)))
        finally:
            self.closed.set()

    async def _terminal_lines(self):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.patch_stdout import patch_stdout

        history = FileHistory(str(self.history_file)) if self.history_file else InMemoryHistory()
        session: PromptSession[str] = PromptSession(history=history)
        with patch_stdout(raw=True):
            while True:
                try:
                    yield await session.prompt_async(PROMPT)
                except KeyboardInterrupt:
                    if not self.on_interrupt():
                        return
                except EOFError:
                    return

    async def _piped_lines(self):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        def pump() -> None:  # a daemon thread: never joined, so it cannot hold up the exit
            sys.stdin.reconfigure(errors="replace")  # invalid bytes must not end the chat
            for line in sys.stdin:
                loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=pump, name="stdin", daemon=True).start()
        while (line := await queue.get()) is not None:
            yield line
