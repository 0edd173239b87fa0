"""The API's own cost: a real ``nanobot gateway`` process with gateway.api on, the scripted
model server answering at once (so what is timed is nanobot, not a model).

    python bench/bench_api.py [--requests 200]

Reports request -> first streamed byte (p50, p90), request -> whole plain reply, requests per
second for short turns from 8 clients at once (each its own session), and ``nanobot agent -m``
with the gateway running (over api.sock) and without (in-process): spawn to reply, peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI, reply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def first_byte(http: aiohttp.ClientSession, url: str, key: str, n: int) -> tuple[float, float]:
    body = {"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": f"hi {n}"}]}
    start = time.perf_counter()
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        first = None
        async for line in resp.content:
            if first is None and b'"content"' in line and b'"content": ""' not in line:
                first = time.perf_counter() - start
        return (first or 0.0) * 1000, (time.perf_counter() - start) * 1000


async def plain(http: aiohttp.ClientSession, url: str, key: str, session: str) -> float:
    body = {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]}
    start = time.perf_counter()
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}",
                                                  "X-Nanobot-Session": session}) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    return (time.perf_counter() - start) * 1000


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        port = free_port()
        async with FakeOpenAI(fallback=lambda body: reply("re: " + body["messages"][-1]["content"])) as llm:
            (home / "config.json").write_text(json.dumps({
                "agents": {"defaults": {"workspace": str(home / "workspace"), "model": "m", "executionMode": "tools"}},
                "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
                "gateway": {"heartbeat": {"enabled": False}, "api": {"enabled": True, "listen": f"127.0.0.1:{port}",
                                                                     "requestsPerMinute": 100000,
                                                                     "concurrentTurns": 64}}}))
            env = {**os.environ, "NANOBOT_HOME": str(home)}
            key = subprocess.run([sys.executable, "-m", "nanobot", "api", "keys", "add", "bench", "--owner"],
                                 env=env, capture_output=True, text=True, check=True).stdout.strip()
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway", env=env,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            try:
                async with aiohttp.ClientSession() as http:
                    for _ in range(100):
                        try:
                            async with http.get(f"http://127.0.0.1:{port}/v1/models"):
                                break
                        except aiohttp.ClientConnectionError:
                            await asyncio.sleep(0.1)
                    await first_byte(http, url, key, -1)  # warm up
                    firsts, wholes = zip(*[await first_byte(http, url, key, n) for n in range(requests)])
                    plains = [await plain(http, url, key, "one") for _ in range(requests)]
                    started = time.perf_counter()
                    async def client(c: int) -> None:
                        for _ in range(requests // 8):
                            await plain(http, url, key, f"c{c}")

                    await asyncio.gather(*(client(c) for c in range(8)))
                    rate = (requests // 8 * 8) / (time.perf_counter() - started)
                via_socket = await agent_runs(env, 5)
                in_process = await agent_runs(env, 3, "--local")
            finally:
                proc.terminate()
                await proc.wait()
    q = lambda xs, p: sorted(xs)[int(len(xs) * p)]  # noqa: E731
    print(f"request -> first streamed byte: p50 {statistics.median(firsts):.1f} ms, p90 {q(firsts, 0.9):.1f} ms "
          f"(goal p50 < 20 ms); whole streamed reply p50 {statistics.median(wholes):.1f} ms")
    print(f"plain request -> whole reply: p50 {statistics.median(plains):.1f} ms, p90 {q(plains, 0.9):.1f} ms")
    print(f"short turns, 8 clients at once: {rate:.0f} requests/s; machine reference {common.reference_ms():.1f} ms")
    print(f"nanobot agent -m hi, gateway running (api.sock): spawn -> reply p50 {statistics.median(via_socket[0]):.0f} ms, "
          f"peak RSS {via_socket[1]:.1f} MiB (goals < 300 ms, < 30 MiB); in-process (--local): "
          f"{statistics.median(in_process[0]):.0f} ms, {in_process[1]:.0f} MiB")


async def agent_runs(env: dict[str, str], runs: int, *extra: str) -> tuple[list[float], float]:
    """Wall time of ``nanobot agent -m hi`` and its largest peak RSS (each run's own, from wait4)."""
    def one() -> tuple[float, float]:
        # Through /usr/bin/time: Linux keeps a child's peak RSS across exec, so a child spawned
        # straight from this (large) process would report this process's size.
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "nanobot", "agent", *extra,
                               "-m", "hi"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return (time.perf_counter() - start) * 1000, int(done.stderr.strip().splitlines()[-1]) / 1024

    results = [await asyncio.to_thread(one) for _ in range(runs)]
    return [t for t, _ in results], max(r for _, r in results)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    asyncio.run(main(parser.parse_args().requests))
