"""The gateway's idle memory with Telegram only (SQLite, no API): a real ``nanobot gateway``
against the stand-in Bot API, RSS read once it is READY and idle, and what it imported that
such a gateway does not use.

    python bench/bench_idle.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)
from bench_gateway import rss_kib

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram

UNUSED_HERE = ("asyncpg", "nanobot.postgres", "nanobot.cluster.worker", "nanobot.api.server", "discord", "nio",
               "prometheus_client", "opentelemetry", "slack_bolt", "slack_sdk", "aioimaplib", "aiosmtplib")


async def one_run(root: Path) -> tuple[float, list[str]]:
    home = root / "home"
    home.mkdir()
    async with FakeOpenAI() as llm, FakeTelegram() as tg:
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(root / "workspace"), "model": "fake"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "gateway": {"heartbeat": {"enabled": False}},
            "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                      "allowFrom": ["42"]}}}))
        rss = await idle_gateway_rss(home, root / "modules.txt")
    loaded = (root / "modules.txt").read_text().split()
    return rss, [m for m in UNUSED_HERE if m in loaded]


async def idle_gateway_rss(home: Path, modules_file: Path, ready_within: float = 30) -> float:
    """A real ``nanobot gateway`` on ``home``: its RSS in MiB once it said READY=1 and idled 3 s.
    It is stopped with SIGTERM after, and writes the modules it loaded to ``modules_file``."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(f"\0nanobot-bench-{os.getpid()}")
    notify.setblocking(False)
    env = {**os.environ, "NANOBOT_HOME": str(home), "NOTIFY_SOCKET": f"@nanobot-bench-{os.getpid()}",
           "NANOBOT_BENCH_MODULES": str(modules_file)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRAPPER, env=env,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(ready_within):
            while b"READY=1" not in await loop.sock_recv(notify, 4096):
                pass
        await asyncio.sleep(3)
        rss = rss_kib(proc.pid) / 1024
        proc.send_signal(15)
        await asyncio.wait_for(proc.wait(), 30)
        return rss
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        notify.close()


# The gateway, writing the names of the modules it loaded when it exits.
WRAPPER = """
import atexit, os, sys
atexit.register(lambda: open(os.environ["NANOBOT_BENCH_MODULES"], "w").write("\\n".join(sys.modules)))
sys.argv = ["nanobot", "gateway"]
from nanobot.entry import main
main()
"""


async def main(runs: int) -> None:
    figures = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            rss, unused = await one_run(Path(tmp))
            figures.append(rss)
    print(f"idle gateway, Telegram only, SQLite, no API: RSS {', '.join(f'{r:.1f}' for r in figures)} MiB "
          f"(median {statistics.median(figures):.1f}; goal < 100 MiB)")
    print(f"loaded though unused here: {', '.join(unused) or 'none'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args().runs))
