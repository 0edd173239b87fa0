"""The interactive ``nanobot agent`` when a gateway runs on this home: the same terminal
(prompt, history, streamed replies, Ctrl-C) in front of the gateway's turns, through
``$NANOBOT_HOME/api.sock``. One process then writes the chat's history: the gateway.

Lines are asked one after another; ``/stop`` (typed, or Ctrl-C during a turn) goes at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import aiohttp

from nanobot.cli.terminal_channel import CliChannel
from nanobot.bus import MessageBus, OutboundMessage
from nanobot.cli.common import show_waiting
from nanobot.gateway.dispatcher import is_stop
from nanobot.terminal_client import aside_text
from nanobot.eventloop import cancel_and_wait

URL = "http://gateway/v1/chat/completions"  # the host is not used: the connection is the socket


async def chat_via_gateway(sock: Path, home: Path, session: str, mode: str | None) -> int:
    headers = {"X-Nanobot-Session": session, **({"X-Nanobot-Mode": mode} if mode else {})}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        async with http.post("http://gateway/v1/nanobot/waiting", headers=headers) as response:
            show_waiting((await response.json()).get("messages", []) if response.status == 200 else [])
        await RemoteChat(http, headers, session, home).run()
    return 0


class RemoteChat:
    """The terminal in front of the gateway's turns: lines typed are asked one after another
    (``/stop`` at once), and each reply is shown as it streams in."""

    def __init__(self, http: aiohttp.ClientSession, headers: dict[str, str], session: str, home: Path) -> None:
        self.http, self.headers = http, headers
        self.bus = MessageBus()
        self.chat_id = session.partition(":")[2]
        self.channel = CliChannel(session, self.bus, history_file=home / "cli_history", on_interrupt=self.interrupt)
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.running: list[asyncio.Task[None]] = []
        self._stream_ids = itertools.count(1)

    async def run(self) -> None:
        workers = [asyncio.create_task(self._intake()), asyncio.create_task(self._asker())]
        await self.channel.start()
        try:
            await self.channel.closed.wait()
            while not self.bus.inbound.empty():  # lines typed just before the end are still asked
                await asyncio.sleep(0)
            await self.queue.join()
            await asyncio.gather(*self.running, return_exceptions=True)
        finally:
            await self.channel.stop()
            await cancel_and_wait(*workers)

    async def ask(self, text: str) -> None:
        stream_id, shown = next(self._stream_ids), ""
        body = {"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": text}]}
        async with self.http.post(URL, json=body, headers=self.headers) as response:
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if aside := event.get("nanobot"):  # a note or a file the turn sent
                    await self.channel.send(OutboundMessage("cli", self.chat_id, aside_text(aside)))
                for choice in event.get("choices", []):
                    if piece := choice.get("delta", {}).get("content"):
                        shown += piece
                        await self.channel.send_stream(OutboundMessage("cli", self.chat_id, shown, kind="stream",
                                                                       stream_id=stream_id))
        await self.channel.send(OutboundMessage("cli", self.chat_id, shown, stream_id=stream_id))

    def interrupt(self) -> bool:
        """Ctrl-C: stop the running turn (True), or leave when nothing runs (False)."""
        if not any(not task.done() for task in self.running):
            return False
        self.running.append(asyncio.create_task(self.ask("/stop")))
        return True

    async def _intake(self) -> None:
        while True:
            text = (await self.bus.inbound.get()).content
            if is_stop(text):
                self.running.append(asyncio.create_task(self.ask(text)))
            else:
                self.queue.put_nowait(text)

    async def _asker(self) -> None:
        while True:
            task = asyncio.create_task(self.ask(await self.queue.get()))
            self.running.append(task)
            await asyncio.gather(task, return_exceptions=True)
            self.queue.task_done()
