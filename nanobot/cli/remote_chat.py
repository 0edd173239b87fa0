"""The interactive ``nanobot agent`` when a gateway runs on this home: the same terminal
(prompt, history, streamed replies, Ctrl-C) in front of the gateway's turns, through
``$NANOBOT_HOME/api.sock``. One process then writes the chat's history: the gateway.

Lines are asked one after another; ``/stop`` (typed, or Ctrl-C during a turn) goes at once,
or, if the line before it is still on its way, as soon as the gateway has that line.
At the end of input, what was asked is answered before it leaves. What reaches the chat with
nobody asking (a background task's result, a job's output) is shown above the prompt as it
comes: the gateway is asked for it every few seconds, as at the start.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Callable

import aiohttp

from nanobot import collector
from nanobot.cli.terminal_channel import CliChannel
from nanobot.bus import InboundMessage, OutboundMessage
from nanobot.cli.common import show_waiting
from nanobot.gateway.dispatcher import is_stop
from nanobot.terminal_client import aside_of, aside_text
from nanobot.eventloop import Background

URL = "http://gateway/v1/chat/completions"  # the host is not used: the connection is the socket
# How often an open terminal asks for what came: soon after a line (a task it started may end),
# ever more seldom while nothing happens (among workers, a chat nobody holds is read afresh each time).
NEWS_EVERY_S, NEWS_IDLE_S = 2.0, 30.0


async def chat_via_gateway(sock: Path, home: Path, session: str, mode: str | None) -> int:
    collector.started()  # the program is built
    headers = {"X-Nanobot-Session": session, **({"X-Nanobot-Mode": mode} if mode else {})}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        chat = RemoteChat(http, headers, session, home)
        show_waiting(await chat.news())
        await chat.run()
    return 0


class RemoteChat:
    """The terminal in front of the gateway's turns: the terminal channel hands its lines here,
    which asks them one after another (``/stop`` at once) and shows each reply as it streams in."""

    def __init__(self, http: aiohttp.ClientSession, headers: dict[str, str], session: str, home: Path) -> None:
        self.http, self.headers = http, headers
        self.chat_id = session.partition(":")[2]
        self.channel = CliChannel(self, session, history_file=home / "cli_history")
        self.queue: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.background = Background()  # the asker of queued lines, and /stops asked at once
        self.given = asyncio.Event()  # cleared while a line is on its way: a /stop must not overtake it
        self.given.set()
        self._stream_ids = itertools.count(1)
        self.shown_upto = -1  # where in the chat the last message waiting for us that we showed is
        self.lines = 0  # lines asked so far

    async def run(self) -> None:
        self.background.run(self._asker(), name="asker")
        self.background.run(self._news_while_open(), name="news")
        await self.channel.start()
        try:
            await self.channel.finished()
        finally:
            await self.channel.stop()
            await self.background.stop()

    async def accept(self, messages: list[InboundMessage]) -> None:
        """The terminal's lines: ``/stop`` at once (behind a line on its way), the others in turn."""
        for msg in messages:
            if is_stop(msg.content):
                self.background.run(self._stop(msg), name="stop")
            else:
                self.queue.put_nowait(msg)

    async def _asker(self) -> None:
        while True:
            msg = await self.queue.get()
            self.given.clear()
            self.lines += 1
            try:
                await self.ask(msg, given=self.given.set)
            except (aiohttp.ClientError, ValueError) as exc:  # the gateway went away (or garbled): said, next line
                await self.channel.send(OutboundMessage("cli", self.chat_id, f"(the gateway did not answer: {exc})"))
            finally:
                self.given.set()

    async def news(self) -> list[str]:
        """What waits for the terminal's reader in its chat that we have not shown (the gateway
        marks it seen a moment later; until then ``after`` keeps it from coming twice)."""
        async with self.http.post("http://gateway/v1/nanobot/waiting", headers=self.headers,
                                  params={"after": str(self.shown_upto)}) as response:
            if response.status != 200:
                return []
            answer = await response.json()
        upto = answer.get("upto", -1)  # the last waiting; -1: none (nothing can come twice then)
        self.shown_upto = max(self.shown_upto, upto) if upto >= 0 else -1
        return answer.get("messages", [])

    async def _news_while_open(self) -> None:
        """What reaches the chat while the terminal is open (a task's result), shown above the prompt."""
        delay, lines = NEWS_EVERY_S, self.lines
        while True:
            await asyncio.sleep(delay)
            try:
                news = await self.news()
            except (aiohttp.ClientError, ValueError):  # the gateway went away: the next line says so
                news = []
            for text in news:
                await self.channel.send(OutboundMessage("cli", self.chat_id, text))
            delay = NEWS_EVERY_S if news or self.lines != lines else min(2 * delay, NEWS_IDLE_S)
            lines = self.lines

    async def _stop(self, msg: InboundMessage) -> None:
        await self.given.wait()  # the gateway has the line it stops
        await self.ask(msg)

    async def ask(self, msg: InboundMessage, given: Callable[[], None] = lambda: None) -> None:
        """Ask ``msg`` and show its reply as it streams in; ``given()`` once the gateway has it
        (the answer's headers come after the message is queued)."""
        stream_id, shown = next(self._stream_ids), ""
        after: list[OutboundMessage] = []
        body = {"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": msg.content}]}
        try:
            async with self.http.post(URL, json=body, headers=self.headers) as response:
                given()
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if aside := aside_of(event):  # a note or a file the turn sent
                        note = OutboundMessage("cli", self.chat_id, aside_text(aside))
                        if shown:  # its reply is being written (shown a block at a time): after it
                            after.append(note)
                        else:
                            await self.channel.send(note)
                    for choice in event.get("choices", []):
                        if piece := choice.get("delta", {}).get("content"):
                            shown += piece
                            await self.channel.send_stream(OutboundMessage("cli", self.chat_id, shown,
                                                                           kind="stream", stream_id=stream_id))
            await self.channel.send(OutboundMessage("cli", self.chat_id, shown, stream_id=stream_id))
            for note in after:
                await self.channel.send(note)
        finally:  # the terminal waits for every answer before it leaves
            if msg.reply_future is not None and not msg.reply_future.done():
                msg.reply_future.set_result(shown)
