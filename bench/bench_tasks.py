"""Background tasks' figures: the chat's reply latency with 0 and 3 tasks running (their model
calls in flight; the chat's model answers at once), through the stand-in Telegram and an
in-process gateway; and, with real processes, the time from a kill -9 of the gateway to the
task's turn running again after a restart.

    python bench/bench_tasks.py [--messages 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import config_for, running_gateway

ALICE = 42


def model(body: dict) -> dict:
    asked = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if asked.startswith("TASK"):
        return delayed(reply("done"), 120)
    if asked.startswith("spawn"):
        return reply("```python\nfinal_answer(' '.join(spawn(f'TASK {n}') for n in range(3)))\n```")
    return reply("ok")


async def latencies(tg: FakeTelegram, count: int) -> list[float]:
    took = []
    for n in range(count):
        sent = len(tg.sent)
        started = time.perf_counter()
        tg.push_text(ALICE, ALICE, f"ping {n}")
        await tg.wait_sent(sent + 1, timeout=30)
        took.append((time.perf_counter() - started) * 1000)
    return took


async def reply_latency(count: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp
        async with FakeOpenAI(fallback=model) as llm, FakeTelegram() as tg:
            config = config_for(llm.base_url, Path(tmp) / "workspace", mode="code")
            t = config.channels.telegram
            t.enabled, t.token, t.api_base, t.allow_from, t.streaming = True, tg.token, tg.api_base, [str(ALICE)], False
            config.gateway.heartbeat.enabled = False
            async with running_gateway(config, with_services=True) as gateway:
                idle = await latencies(tg, count)
                tg.push_text(ALICE, ALICE, "spawn three")
                await tg.wait_sent(count + 1, timeout=30)
                while (await gateway.runtime.db.fetchval("SELECT count(*) FROM tasks WHERE state = 'running'")) < 3:
                    await asyncio.sleep(0.05)
                busy = await latencies(tg, count)
    return statistics.median(idle), statistics.median(busy)


async def kill_to_running() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        calls: list[float] = []

        def answer(body: dict) -> dict:
            asked = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            if asked.startswith("TASK"):
                calls.append(time.monotonic())
                return delayed(reply("done"), 120 if len(calls) == 1 else 0)
            return reply("```python\nfinal_answer(spawn('TASK one'))\n```")

        async with FakeOpenAI(fallback=answer) as llm, FakeTelegram() as tg:
            (home / "config.json").write_text(json.dumps({
                "agents": {"defaults": {"workspace": str(Path(tmp) / "ws"), "model": "m", "executionMode": "code"}},
                "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
                "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                          "allowFrom": [str(ALICE)], "streaming": False}},
                "gateway": {"heartbeat": {"enabled": False}}}))
            env = {**os.environ, "NANOBOT_HOME": str(home)}
            spawn = lambda: asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway", env=env,  # noqa: E731
                                                           stderr=asyncio.subprocess.DEVNULL)
            first = await spawn()
            tg.push_text(ALICE, ALICE, "go")
            while not calls:
                await asyncio.sleep(0.02)
            killed = time.monotonic()
            first.send_signal(signal.SIGKILL)
            await first.wait()
            second = await spawn()
            while len(calls) < 2:
                await asyncio.sleep(0.02)
            second.terminate()
            await second.wait()
            return calls[1] - killed


async def main(count: int) -> None:
    idle, busy = await reply_latency(count)
    print(f"chat reply through the stand-in Telegram, instant model: p50 {idle:.1f} ms with no task running, "
          f"{busy:.1f} ms with 3 running")
    print(f"kill -9 of the gateway to the task's turn running again (restart included): {await kill_to_running():.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=30)
    asyncio.run(main(parser.parse_args().messages))
