"""Media: how the prompt grows in a chat with photos, and what a voice note adds to a turn.

    python bench/bench_media.py

Through the real gateway in-process, with the stand-in Telegram Bot API and the scripted
OpenAI server (which also answers /audio/transcriptions, instantly).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

from common import fresh_home, p50

from nanobot.config import Config
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram


def photo(seed: int) -> bytes:
    """A 12 MP JPEG with grain, so it compresses about like a phone photo (a flat colour would not)."""
    import io

    from PIL import Image

    grain = Image.effect_noise((4000, 3000), 24).convert("RGB")
    tinted = Image.blend(grain, Image.new("RGB", grain.size, (seed * 10 % 255, 90, 140)), 0.5)
    out = io.BytesIO()
    tinted.save(out, "JPEG", quality=90)
    return out.getvalue()

TURNS, PHOTOS = 20, 10
ROUNDS = 30  # voice notes and text messages timed


def gateway_config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    config = Config()
    config.agents.defaults.workspace = str(workspace)
    config.agents.defaults.execution_mode = "tools"
    config.providers["openai"].api_base, config.providers["openai"].api_key = llm.base_url, "k"
    config.gateway.heartbeat.enabled = False
    config.tools.transcription.provider = "openai"
    t = config.channels.telegram
    t.enabled, t.token, t.api_base, t.allow_from, t.streaming = True, tg.token, tg.api_base, ["42"], False
    return config


async def prompt_sizes(workspace: Path) -> list[tuple[int, int, int]]:
    """(turn, images sent, request bytes) for a chat where every other message is a 12 MP photo."""
    from tests.helpers import running_gateway

    photos = [photo(i) for i in range(PHOTOS)]
    async with FakeOpenAI(fallback=reply("Nice.")) as llm, FakeTelegram() as tg:
        async with running_gateway(gateway_config(llm, tg, workspace)):
            for turn in range(TURNS):
                if turn % 2 == 0:
                    tg.push_photo(42, 42, photos[turn // 2], caption=f"photo {turn}")
                else:
                    tg.push_text(42, 42, f"what changed since the last one? ({turn})")
                await tg.wait_sent(turn + 1, timeout=30)
        return [(i + 1, sum(1 for m in r["messages"] if isinstance(m["content"], list)
                            for p in m["content"] if p["type"] == "image_url"), len(json.dumps(r)))
                for i, r in enumerate(llm.chat_requests)]


async def voice_vs_text(workspace: Path) -> tuple[float, float]:
    """p50 ms from a message's arrival at the stand-in Telegram to the reply, text vs voice."""
    from tests.helpers import running_gateway

    async with FakeOpenAI(fallback=reply("ok")) as llm, FakeTelegram() as tg:
        llm.transcripts = ["what time is it"] * ROUNDS
        async with running_gateway(gateway_config(llm, tg, workspace)):
            await asyncio.sleep(0.3)
            times: dict[str, list[float]] = {"text": [], "voice": []}
            for i in range(ROUNDS * 2):
                kind = "voice" if i % 2 else "text"
                start = time.perf_counter()
                if kind == "voice":
                    tg.push_voice(42, 42, b"OggS" + bytes(16_000), duration=4)  # ~4 s of Opus
                else:
                    tg.push_text(42, 42, "what time is it")
                await tg.wait_sent(i + 1, timeout=30)
                times[kind].append((time.perf_counter() - start) * 1000)
        return p50(times["text"]), p50(times["voice"])


def reading_recordings() -> None:
    """What a 10-minute voice note costs before its upload: its length read from its bytes (each
    format), and raw AAC repacked as M4A (Signal's); p50 of 7, in a thread in the gateway."""
    from nanobot.media.aac import adts_to_m4a
    from nanobot.media.duration import recording_seconds
    from tests.media_files import encoded_audio

    for codec, container, rate in [("aac", "adts", 16000), ("libopus", "ogg", 48000), ("libopus", "webm", 48000),
                                   ("aac", "mp4", 16000)]:
        data = encoded_audio(600, codec, container, rate, tone=False)
        work = [recording_seconds] + ([adts_to_m4a] if container == "adts" else [])
        figures = [f"{fn.__name__} p50 {p50([timed(fn, data) for _ in range(7)]):.2f} ms" for fn in work]
        print(f"10 min of {codec} in {container} ({len(data) / 1024:.0f} KiB): {', '.join(figures)}")


def timed(fn: Callable[[bytes], object], data: bytes) -> float:
    start = time.perf_counter()
    fn(data)
    return (time.perf_counter() - start) * 1000


async def main() -> None:
    reading_recordings()
    with tempfile.TemporaryDirectory() as tmp:
        import os

        os.environ["NANOBOT_HOME"] = str(Path(tmp) / "home")
        (Path(tmp) / "ws").mkdir()
        sizes = await prompt_sizes(Path(tmp) / "ws")
        print(f"prompt of a {TURNS}-turn chat with {PHOTOS} photos (4000x3000 JPEG, {len(photo(0)) / 1e6:.1f} MB):")
        for turn, images, size in sizes:
            print(f"  request {turn:2d}: {images} image part(s), {size / 1024:,.0f} KiB")
        (Path(tmp) / "ws2").mkdir()
        fresh_home()
        text_ms, voice_ms = await voice_vs_text(Path(tmp) / "ws2")
        print(f"reply after a text message: p50 {text_ms:.1f} ms; after a voice note: p50 {voice_ms:.1f} ms "
              f"(+{voice_ms - text_ms:.1f} ms for download and transcription, {ROUNDS} each)")


if __name__ == "__main__":
    asyncio.run(main())
