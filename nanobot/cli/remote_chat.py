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

URL = "http://gateway/v1/chat/completions"  # the host is not used: the connection is the socket


async def chat_via_gateway(sock: Path, home: Path, session: str, mode: str | None) -> int:
    bus = MessageBus()
    stream_ids = itertools.count(1)
    headers = {"X-Nanobot-Session": session, **({"X-Nanobot-Mode": mode} if mode else {})}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        running: list[asyncio.Task[None]] = []

        async def ask(text: str) -> None:
            stream_id, shown = next(stream_ids), ""
            body = {"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": text}]}
            async with http.post(URL, json=body, headers=headers) as response:
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if aside := event.get("nanobot"):  # a note or a file the turn sent
                        await channel.send(OutboundMessage("cli", chat_id, aside_text(aside)))
                    for choice in event.get("choices", []):
                        if piece := choice.get("delta", {}).get("content"):
                            shown += piece
                            await channel.send_stream(OutboundMessage("cli", chat_id, shown, kind="stream",
                                                                      metadata={"stream_id": stream_id}))
            await channel.send(OutboundMessage("cli", chat_id, shown, metadata={"stream_id": stream_id}))

        def interrupt() -> bool:
            """Ctrl-C: stop the running turn (True), or leave when nothing runs (False)."""
            if not any(not task.done() for task in running):
                return False
            running.append(asyncio.create_task(ask("/stop")))
            return True

        async with http.post("http://gateway/v1/nanobot/waiting", headers=headers) as response:
            show_waiting((await response.json()).get("messages", []) if response.status == 200 else [])
        chat_id = session.partition(":")[2]
        channel = CliChannel(session, bus, history_file=home / "cli_history", on_interrupt=interrupt)
        queue: asyncio.Queue[str] = asyncio.Queue()

        async def intake() -> None:
            while True:
                text = (await bus.inbound.get()).content
                if is_stop(text):
                    running.append(asyncio.create_task(ask(text)))
                else:
                    queue.put_nowait(text)

        async def asker() -> None:
            while True:
                task = asyncio.create_task(ask(await queue.get()))
                running.append(task)
                await asyncio.gather(task, return_exceptions=True)
                queue.task_done()

        workers = [asyncio.create_task(intake()), asyncio.create_task(asker())]
        await channel.start()
        try:
            await channel.closed.wait()
            while not bus.inbound.empty():  # lines typed just before the end are still asked
                await asyncio.sleep(0)
            await queue.join()
            await asyncio.gather(*running, return_exceptions=True)
        finally:
            await channel.stop()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    return 0
