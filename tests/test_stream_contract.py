"""Streams reach every kind of client at its own pace. A reply the model writes in pieces over
about a second arrives at the API (the real ``openai`` client), the terminal's socket and the
in-process terminal in many chunks, each soon after the model wrote it, not as one at the end;
Telegram and Discord edit one message about once a second (tests/test_streaming.py)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tests import cli_zygote
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.helpers import running_gateway
from tests.test_api import api, client, config  # noqa: F401  (fixtures)
from tests.test_cli import write_config

TEXT = "A reply of many small words, written by the model piece by piece over about a second. " * 2


async def test_the_api_streams_each_piece_as_it_comes(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    llm.stream_interval = 0.025  # about 45 pieces over a second
    llm.script(reply(TEXT.strip()))
    stream = await client(api, api["owner"]).chat.completions.create(
        model="nanobot", stream=True, messages=[{"role": "user", "content": "go"}])
    arrivals: list[tuple[float, str]] = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append((time.monotonic(), chunk.choices[0].delta.content))
    assert "".join(piece for _, piece in arrivals) == TEXT.strip()
    assert len(arrivals) > 5, arrivals  # not one chunk at the end
    assert arrivals[-1][0] - arrivals[0][0] > 0.5  # spread over the writing, as the model wrote it


async def test_code_mode_streams_a_long_answer_to_the_api_and_never_a_working_note(
        config, llm: FakeOpenAI) -> None:  # noqa: F811
    """The API only appends: code mode's text is held while it may still be a working note
    (a short line before a program), then streams; the note and the program never arrive."""
    from nanobot.agent.streaming import HOLD_CHARS
    from nanobot.api import keys as api_keys

    config.agents.defaults.execution_mode = "code"
    llm.stream_interval, llm.stream_piece_chars = 0.025, 20  # 35 pieces, under a second
    answer = (TEXT * 4).strip()
    assert len(answer) > 2 * HOLD_CHARS
    llm.script(reply("Let me look that up.\n```python\nprint(6 * 7)\n```"), reply(answer))
    async with running_gateway(config, with_services=True) as gateway:
        key = await api_keys.ApiKeys(gateway.runtime.db).add("ada", owner=True)
        stream = await client({"base": f"http://{config.gateway.api.listen}/v1"}, key).chat.completions.create(
            model="nanobot", stream=True, messages=[{"role": "user", "content": "go"}])
        pieces = [chunk.choices[0].delta.content async for chunk in stream
                  if chunk.choices and chunk.choices[0].delta.content]
    assert "".join(pieces) == answer  # no note, no program
    assert len(pieces) > 5, pieces  # streamed once past the hold, not whole at the end


async def _read_timed(stream: asyncio.StreamReader) -> list[tuple[float, bytes]]:
    chunks = []
    while piece := await stream.read(64):
        chunks.append((time.monotonic(), piece))
    return chunks


async def test_the_terminal_prints_a_reply_as_it_is_written_through_the_gateway_and_in_process(
        config, llm: FakeOpenAI, home: Path, workspace: Path) -> None:  # noqa: F811
    """``nanobot agent -m`` over the gateway's socket, then in-process (``--local``)."""
    write_config(home, workspace, llm.base_url)
    llm.stream_interval = 0.025
    llm.fallback = lambda body: reply(TEXT.strip())
    config.gateway.api.enabled = False
    async with running_gateway(config, with_services=True):
        for extra in ((), ("--local",)):
            proc = await cli_zygote.start(["agent", *extra, "-m", "go"], {**os.environ, "NANOBOT_HOME": str(home)},
                                          stdout=asyncio.subprocess.PIPE)
            chunks = await asyncio.wait_for(_read_timed(proc.stdout), 60)
            await proc.wait()
            assert b"".join(piece for _, piece in chunks).decode().strip() == TEXT.strip(), extra
            assert len(chunks) > 5 and chunks[-1][0] - chunks[0][0] > 0.5, (extra, len(chunks))


def test_every_channel_decides_every_kind_of_outbound_message() -> None:
    """text (send), stream (send_stream), file (send_file), typing (send_typing): a channel that
    leaves one to a silent default does not build (the API's streams once went nowhere so)."""
    from importlib.metadata import entry_points

    from nanobot.api.channel import ApiChannel
    from nanobot.channel_plugin import BaseChannel
    from nanobot.cli.terminal_channel import CliChannel

    kinds = {"send", "send_stream", "send_file", "send_typing"}
    assert {"send", "send_stream", "send_typing"} <= BaseChannel.__abstractmethods__
    classes = [ep.load() for ep in entry_points(group="nanobot.channels")] + [ApiChannel, CliChannel]
    for cls in classes:
        assert not cls.__abstractmethods__, (cls, cls.__abstractmethods__)
        assert all(callable(getattr(cls, kind)) for kind in kinds)
