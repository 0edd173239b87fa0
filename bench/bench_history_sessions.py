"""The gateway's memory under many distinct API sessions: a real ``nanobot gateway`` with the
API on, one key (rate limit raised for the bench), ``GET /v1/nanobot/history`` with a new
``X-Nanobot-Session`` each time. Before, every session opened stayed in memory (130 -> 252 MB
over 120,000); the open-sessions cache is now bounded.

    python bench/bench_history_sessions.py [--sessions 100000]

Prints the gateway's RSS (VmRSS) after a warm-up of 2,000 sessions and after all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

import common  # noqa: F401  (puts the repo on sys.path)
from bench_api import free_port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def sessions(http: aiohttp.ClientSession, url: str, key: str, start: int, count: int, clients: int = 16) -> None:
    async def client(c: int) -> None:
        for n in range(start + c, start + count, clients):
            async with http.get(url, headers={"Authorization": f"Bearer {key}", "X-Nanobot-Session": f"s{n}"}) as r:
                await r.read()
                assert r.status == 200, r.status

    await asyncio.gather(*(client(c) for c in range(clients)))


async def main(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, port = Path(tmp), free_port()
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(home / "workspace"), "model": "m"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": "http://127.0.0.1:9/v1"}},
            "gateway": {"heartbeat": {"enabled": False}, "api": {"enabled": True, "listen": f"127.0.0.1:{port}",
                                                                 "requestsPerMinute": 10_000_000}}}))
        env = {**os.environ, "NANOBOT_HOME": str(home)}
        key = subprocess.run([sys.executable, "-m", "nanobot", "api", "keys", "add", "bench"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway", env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/v1/nanobot/history"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as http:
                for _ in range(200):
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/v1/models"):
                            break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.1)
                await sessions(http, url, key, 0, 2000)
                before = rss_mib(proc.pid)
                started = time.perf_counter()
                await sessions(http, url, key, 2000, count)
                after = rss_mib(proc.pid)
                took = time.perf_counter() - started
        finally:
            proc.terminate()
            await proc.wait()
    print(f"gateway RSS after 2,000 sessions: {before:.1f} MiB; after {count:,} more distinct sessions: {after:.1f} MiB "
          f"(growth {after - before:+.1f} MiB, goal < 20 MB); {count / took:.0f} requests/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100_000)
    asyncio.run(main(parser.parse_args().sessions))
