"""kill -9 under load, again and again: is any message lost or answered twice?

    python bench/bench_kill_loop.py [--kills 100]

A real ``nanobot gateway`` process against the stand-in Telegram Bot API and the scripted
OpenAI server (answers take 0 to 40 ms, so kills land before, during and after turns). 20
chats send continuously (about 40 messages/s in all); the gateway is SIGKILLed at a random
moment every 0.3 to 1.5 s and started again. At the end every message sent must have exactly
one reply (a reply the platform took just before a kill, not yet marked, may come twice),
in order per chat; the histories and the database must be intact.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.delivery.intake import RESUMED_NOTE
from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.telegram_api import FakeTelegram

CHATS = 20
KILLED_AT: list[float] = []


REQUESTS = iter(range(1, 10**9))


def model(body: dict) -> object:
    """An echo that names the model call it came from: "re: m12 #345"."""
    text = [m["content"] for m in body["messages"] if m["role"] == "user" and m["content"] != RESUMED_NOTE][-1]
    return delayed(reply(f"re: {text.split(chr(10))[-1]} #{next(REQUESTS)}"), random.uniform(0, 0.04))


def write_config(home: Path, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    config = {
        "agents": {"defaults": {"workspace": str(home / "workspace"), "model": "fake-model",
                                "executionMode": "tools", "memoryWindow": 1000}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": ["*"], "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}},
    }
    (home / "config.json").write_text(json.dumps(config))


async def start(home: Path, tg: FakeTelegram, log) -> asyncio.subprocess.Process:
    polls = tg.calls.count("getUpdates")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway",
                                                env={**os.environ, "NANOBOT_HOME": str(home)},
                                                stdout=log, stderr=asyncio.subprocess.STDOUT)
    await tg.wait_until(lambda: tg.calls.count("getUpdates") > polls, timeout=30)
    return proc


async def sender(tg: FakeTelegram, sent: list[tuple[int, str]], stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        chat = random.randint(1, CHATS)
        text = f"m{n}"
        tg.push_text(chat, chat, text)
        sent.append((chat, text))
        n += 1
        await asyncio.sleep(0.025)


async def main(kills: int) -> None:
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # a killed client's dropped requests
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        async with FakeOpenAI(fallback=model) as llm, FakeTelegram() as tg:
            write_config(home, llm, tg)
            log = open(home / "gateway.log", "wb")
            sent: list[tuple[int, str]] = []
            stop = asyncio.Event()
            proc = await start(home, tg, log)
            feeding = asyncio.create_task(sender(tg, sent, stop))
            started = time.monotonic()
            for k in range(kills):
                await asyncio.sleep(random.uniform(0.3, 1.5))
                KILLED_AT.append(time.monotonic())
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                proc = await start(home, tg, log)
            stop.set()
            await feeding
            expected = {text for _, text in sent}
            try:
                await tg.wait_until(lambda: expected <= {_message_of(m["text"]) for m in tg.sent}, timeout=60)
            except TimeoutError:
                pass
            await asyncio.sleep(1)
            proc.terminate()
            await proc.wait()
            print(_report(sent, tg, llm, home, kills, time.monotonic() - started))


def _message_of(reply_text: str) -> str:
    """"re: m12 #345" -> "m12"."""
    return reply_text[4:].rsplit(" #", 1)[0]


def _report(sent: list[tuple[int, str]], tg: FakeTelegram, llm: FakeOpenAI, home: Path, kills: int,
            seconds: float) -> str:
    replies = Counter(_message_of(m["text"]) for m in tg.sent)
    lost = [t for _, t in sent if replies[t] == 0]
    doubled = [t for _, t in sent if replies[t] > 1]
    calls = {t: {m["text"].rsplit("#", 1)[1] for m in tg.sent if _message_of(m["text"]) == t} for t in doubled}
    rerun_twice = [t for t in doubled if len(calls[t]) > 1]  # two turns each got to send a reply: a real repeat
    resumed = sum(1 for r in llm.chat_requests if RESUMED_NOTE in r["messages"][-1]["content"])
    before_kill = []  # how long before the next kill each repeated reply had first gone out
    for text in doubled:
        first = min(m["at"] for m in tg.sent if _message_of(m["text"]) == text)
        before_kill.append(min((k - first for k in KILLED_AT if k >= first), default=-1) * 1000)
    out_of_order = 0
    for chat in range(1, CHATS + 1):
        order = {t: i for i, (c, t) in enumerate(sent) if c == chat}
        got = [order[_message_of(m["text"])] for m in tg.sent
               if m["chat_id"] == chat and _message_of(m["text"]) in order]
        firsts = list(dict.fromkeys(got))
        out_of_order += sum(1 for a, b in zip(firsts, firsts[1:]) if b < a)
    corrupt = 0
    for path in (home / "sessions").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                json.loads(line)
            except ValueError:
                corrupt += 1
    integrity = sqlite3.connect(home / "nanobot.db").execute("PRAGMA integrity_check").fetchone()[0]
    log = (home / "gateway.log").read_text(errors="replace")
    resent = sum(int(n) for n in re.findall(r"sending (\d+) message\(s\) the last run did not get out", log))
    errors = len(re.findall(r" ERROR ", log))
    return (f"{kills} kills in {seconds:.0f} s; {len(sent)} messages sent to {CHATS} chats\n"
            f"lost (no reply): {len(lost)}; reply sent twice: {len(doubled)} (of which the turn ran twice: "
            f"{len(rerun_twice)}; the rest were sent just before a kill, not yet marked, and sent again)\n"
            f"turns resumed after a kill: {resumed}; replies out of order: {out_of_order}\n"
            f"a repeated reply had first gone out this long before a kill: median "
            f"{statistics.median(before_kill) if before_kill else 0:.0f} ms, max {max(before_kill, default=0):.0f} ms; "
            f"messages sent at a start that the last run had not seen accepted: {resent}; errors logged: {errors}\n"
            f"corrupt history lines: {corrupt}; database integrity: {integrity}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=100)
    asyncio.run(main(parser.parse_args().kills))
