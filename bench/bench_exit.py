"""How long a command takes to end once its work is done: from the reply of ``nanobot agent
-m hi`` (in this process, no gateway) reaching standard output to the process's exit,
``nanobot cron list`` from start to exit (p50 of 9 each), and the terminal chat on a
pseudo-terminal from Ctrl-D, typed once a reply is shown, to its exit (p50 of 5).

    python bench/bench_exit.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from common import p50, reference_ms

from tests.fakes.openai_server import FakeOpenAI, reply
from tests.test_terminal import Terminal, chat_on


async def reply_to_exit(home: Path) -> float:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "agent", "-m", "hi",
                                                env={**os.environ, "NANOBOT_HOME": str(home)},
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.readuntil(b"hi there\n")
    shown = time.perf_counter()
    await proc.wait()
    return (time.perf_counter() - shown) * 1000


async def ctrl_d_to_exit(home: Path) -> float:
    term = Terminal()
    async with chat_on(term, home) as proc:
        await term.wait_for("you>")
        term.type("hello\r")
        await term.wait_for("hi there")
        await asyncio.sleep(0.05)  # as a person would: the reply was just printed
        term.type("\x04")
        typed = time.perf_counter()
        await proc.wait()
        return (time.perf_counter() - typed) * 1000


async def whole_command(home: Path, *args: str) -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", *args,
                                                env={**os.environ, "NANOBOT_HOME": str(home)},
                                                stdout=asyncio.subprocess.DEVNULL)
    await proc.wait()
    return (time.perf_counter() - start) * 1000


async def main() -> None:
    print(f"machine reference {reference_ms():.1f} ms")
    async with FakeOpenAI() as llm:
        llm.fallback = reply("hi there")
        home = Path(tempfile.mkdtemp(prefix="nanobot-bench-"))
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(home / "ws"), "model": "m", "executionMode": "tools"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}}}))
        exits = [await reply_to_exit(home) for _ in range(9)]
        listings = [await whole_command(home, "cron", "list") for _ in range(9)]
        leaving = [await ctrl_d_to_exit(home) for _ in range(5)]
    print(f"agent -m: reply shown to exit, p50 {p50(exits):.0f} ms (min {min(exits):.0f}, max {max(exits):.0f})")
    print(f"cron list: start to exit, p50 {p50(listings):.0f} ms (min {min(listings):.0f}, max {max(listings):.0f})")
    print(f"terminal chat: Ctrl-D to exit, p50 {p50(leaving):.0f} ms (min {min(leaving):.0f}, max {max(leaving):.0f})")
    print(f"machine reference {reference_ms():.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
