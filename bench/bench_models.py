"""Models that do not go silent: time to first visible text when replies stream, time from a
provider failure to the fallback's answer, and what streaming adds to a turn.

    python bench/bench_models.py

Against the scripted OpenAI server (streaming 4-character pieces, about one token each) and
the stand-in Telegram Bot API, through the real gateway in-process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import fresh_home, p50

from nanobot.config import Config, ModelChoice, ProviderConfig
from nanobot.runtime import open_runtime
from tests.fakes.openai_server import FakeOpenAI, delayed, error, reply
from tests.fakes.telegram_api import FakeTelegram

TOKENS, TOKENS_PER_S = 500, 50


def base_config(llm: FakeOpenAI, workspace: Path) -> Config:
    config = Config()
    config.agents.defaults.workspace = str(workspace)
    config.agents.defaults.execution_mode = "tools"
    config.providers["openai"].api_base, config.providers["openai"].api_key = llm.base_url, "k"
    config.gateway.heartbeat.enabled = False
    return config


async def first_text(workspace: Path, streaming: bool) -> float:
    from tests.helpers import running_gateway  # at the tests' pace: short polls

    fresh_home()  # before the config, which takes its home from it
    text = "word " * TOKENS  # 5 characters a token here: 4-character pieces stream a bit faster than 50/s
    async with FakeOpenAI() as llm, FakeTelegram() as tg:
        llm.stream_interval = 1 / TOKENS_PER_S
        llm.script(reply(text) if streaming else delayed(reply(text), TOKENS / TOKENS_PER_S))
        config = base_config(llm, workspace)
        t = config.channels.telegram
        t.enabled, t.token, t.api_base, t.allow_from, t.streaming = True, tg.token, tg.api_base, ["42"], streaming
        async with running_gateway(config):
            await asyncio.sleep(0.3)  # polling settled
            start = time.perf_counter()
            tg.push_text(42, 42, "tell me")
            await tg.wait_until(lambda: tg.drafts or tg.sent, 30)  # a private chat's stream is a draft first
            return (time.perf_counter() - start) * 1000


async def fallback(workspace: Path) -> tuple[float, float]:
    async with FakeOpenAI() as llm, FakeOpenAI() as backup:
        config = base_config(llm, workspace)
        config.providers["openai"].max_retries = 0
        config.providers["openai"].cooldown_seconds = 0  # every turn meets the failure
        config.providers["local"] = ProviderConfig(api_base=backup.base_url, api_key="k")
        config.agents.defaults.fallbacks = [ModelChoice(provider="local", model="small")]
        async with open_runtime(config) as rt:
            healthy, failing = [], []
            for _ in range(30):
                llm.script(reply("ok"))
                start = time.perf_counter()
                await rt.agent.handle("cli:f", "hi")
                healthy.append((time.perf_counter() - start) * 1000)
                llm.script(error(503))
                backup.script(reply("from the fallback"))
                start = time.perf_counter()
                assert await rt.agent.handle("cli:f", "hi") == "from the fallback"
                failing.append((time.perf_counter() - start) * 1000)
    return p50(healthy), p50(failing)


async def stream_overhead(workspace: Path) -> tuple[float, float]:
    from nanobot.agent.streaming import ReplyStream

    async def nowhere(text: str) -> None:
        return None

    async with FakeOpenAI() as llm:
        async with open_runtime(base_config(llm, workspace)) as rt:
            off, on = [], []
            for _ in range(40):
                for samples, stream in ((off, None), (on, ReplyStream(nowhere, 1.0))):
                    llm.script(reply("A short answer of a few words, streamed or not."))
                    start = time.perf_counter()
                    await rt.agent.handle("cli:o", "hi", stream=stream)
                    samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(off), statistics.median(on)


async def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    os.environ["NANOBOT_HOME"] = tempfile.mkdtemp(prefix="nanobot-bench-")
    workspace = Path(tempfile.mkdtemp(prefix="nanobot-bench-ws-"))
    streamed, whole = await first_text(workspace, True), await first_text(workspace, False)
    print(f"first visible text on Telegram, {TOKENS}-token reply at {TOKENS_PER_S} tokens/s: "
          f"streamed {streamed:,.0f} ms, not streamed {whole:,.0f} ms")
    healthy, failing = await fallback(workspace)
    print(f"turn p50 with a healthy model {healthy:.1f} ms; primary fails (503) -> fallback answers: {failing:.1f} ms")
    off, on = await stream_overhead(workspace)
    print(f"turn p50, streaming off {off:.1f} ms, on {on:.1f} ms (overhead {on - off:+.1f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
