"""Spoken replies: how long after the text reply its voice note reaches the chat.

    python bench/bench_speech.py

Through the real gateway in-process, with the stand-in Telegram Bot API and the scripted
OpenAI server, whose /audio/speech answers at once with a small OGG/Opus file: what is
measured is nanobot's own part (the outbox record of the text, the speech call, the voice
note's outbox record and its sendVoice), not a speech model's time.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from common import p50

from bench_media import gateway_config
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import running_gateway

ROUNDS = 40


async def text_to_voice(workspace: Path) -> list[float]:
    """ms from the text reply's sendMessage to the voice note's sendVoice, per voice note."""
    async with FakeOpenAI(fallback=reply("It is sunny and 21 degrees, with a light wind.")) as llm, \
            FakeTelegram() as tg:
        llm.transcripts = ["how is the weather"] * ROUNDS
        config = gateway_config(llm, tg, workspace)
        config.tools.speech.provider = "openai"
        config.agents.defaults.memory_window = 1000  # no consolidation calls between the rounds
        gaps = []
        async with running_gateway(config):
            for i in range(ROUNDS):
                tg.push_voice(42, 42, b"OggS-note")
                await tg.wait_until(lambda: len(tg.files) > i and len(tg.sent) > i, timeout=30)
                gaps.append((tg.files[i]["at"] - tg.sent[i]["at"]) * 1000)
        return gaps


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp
        gaps = await text_to_voice(Path(tmp) / "workspace")
    print(f"text reply -> voice note, {len(gaps)} voice notes: p50 {p50(gaps):.1f} ms, max {max(gaps):.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
