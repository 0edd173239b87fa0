"""Issue 2 figures: CLI start to first model request, agent overhead per turn, peak RSS.

    python bench/bench_agent.py
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import p50

from tests.fakes.openai_server import FakeOpenAI, reply


def write_home(base_url: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix="nanobot-bench-"))
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(home / "ws"), "model": "m", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": base_url}}}))
    return home


async def startup_to_first_request(llm: FakeOpenAI, home: Path, runs: int = 7) -> list[float]:
    times = []
    for _ in range(runs):
        llm.request_event.clear()
        first: list[float] = []
        llm.script(lambda body: first.append(time.perf_counter()) or reply("hi"))
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "agent", "-m", "hi",
                                                    env={**os.environ, "NANOBOT_HOME": str(home)},
                                                    stdout=asyncio.subprocess.DEVNULL)
        await proc.wait()
        times.append((first[0] - start) * 1000)
    return times


async def overhead(llm: FakeOpenAI, home: Path, turns: int = 200) -> tuple[float, float]:
    """A nanobot turn against a bare SDK call sending the very same request body.

    The bare calls replay what the agent sent (system prompt, history, tool schemas), so the
    difference is nanobot's own work: prompt building, history, tools, usage and session writes.
    """
    import openai

    os.environ["NANOBOT_HOME"] = str(home)
    from nanobot.config import load_config
    from nanobot.runtime import open_runtime

    llm.fallback = reply("ok")
    config, _ = load_config(home / "config.json")
    agent_times = []
    async with open_runtime(config) as rt:
        for i in range(turns):
            t = time.perf_counter()
            await rt.agent.handle(f"cli:bench{i % 10}", "hi")
            agent_times.append((time.perf_counter() - t) * 1000)
    bodies = llm.chat_requests[-turns:]
    client = openai.AsyncOpenAI(api_key="k", base_url=llm.base_url)
    bare = []
    for body in bodies:
        t = time.perf_counter()
        await client.chat.completions.create(**body)
        bare.append((time.perf_counter() - t) * 1000)
    await client.close()
    return p50(bare), p50(agent_times)


def peak_rss_kib(base_url: str, home: Path) -> int:
    result = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "nanobot", "agent", "-m", "hi"],
                            env={**os.environ, "NANOBOT_HOME": str(home)}, capture_output=True, text=True)
    return int(result.stderr.strip().splitlines()[-1])


async def main() -> None:
    async with FakeOpenAI(fallback=reply("hi")) as llm:
        home = write_home(llm.base_url)
        starts = await startup_to_first_request(llm, home)
        print(f"nanobot agent -m: process start to first model request: p50 {p50(starts):.0f} ms "
              f"(min {min(starts):.0f}, max {max(starts):.0f}; target < 500 ms)")
        bare, agent = await overhead(llm, home)
        print(f"per turn: bare openai SDK call p50 {bare:.2f} ms, nanobot turn p50 {agent:.2f} ms, "
              f"overhead {agent - bare:.2f} ms (target < 5 ms)")
        rss = await asyncio.to_thread(peak_rss_kib, llm.base_url, home)
        print(f"peak RSS of nanobot agent -m hi: {rss / 1024:.1f} MiB (target < 80 MiB)")


if __name__ == "__main__":
    asyncio.run(main())
