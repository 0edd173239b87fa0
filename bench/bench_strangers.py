"""A flood of strangers: what it costs the gateway, and how far it pushes back the owner's reply.

    python bench/bench_strangers.py [--strangers 1000] [--runs 3]

A real ``nanobot gateway`` process against the stand-in Telegram Bot API and the scripted
OpenAI server (instant answers). Each run queues N private messages from N different
strangers at once, then one message from the owner, and reports:
- the owner's wait: from the owner's message being queued to the reply (the goal: 0.5 s);
- the gateway's CPU for the whole burst, against what python-telegram-bot alone needs to
  parse the same updates (``Update.de_json``, timed here) (the goal: at most 4x);
- how many pairing codes went out and how many database writes the strangers caused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from bench_delivery import cpu_ms
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram

OWNER = 1


def write_config(home: Path, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(home / "workspace"), "model": "fake-model",
                                "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": [str(OWNER)], "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}},
    }))


def library_parse_ms(updates: list[dict]) -> float:
    """What python-telegram-bot alone spends turning these updates into objects."""
    from telegram import Bot, Update

    bot = Bot("1:x")
    start = time.process_time()
    for update in updates:
        Update.de_json(update, bot)
    return (time.process_time() - start) * 1000


async def burst(tg: FakeTelegram, pid: int, strangers: int, first_id: int) -> dict:
    sent0 = len(tg.sent)
    cpu0 = cpu_ms(pid)
    pushed = [tg.push_text(uid, uid, f"hello {uid}", username=None)
              for uid in range(first_id, first_id + strangers)]
    asked = time.monotonic()
    tg.push_text(OWNER, OWNER, "owner here", username="owner")
    await tg.wait_until(lambda: any(m["chat_id"] == OWNER for m in tg.sent[sent0:]), timeout=120)
    waited = time.monotonic() - asked
    await tg.wait_until(lambda: not tg._updates, timeout=120)  # every update confirmed: the burst is handled
    await asyncio.sleep(0.5)
    codes = sum(1 for m in tg.sent[sent0:] if m["chat_id"] != OWNER)
    return {"waited": waited, "cpu": cpu_ms(pid) - cpu0, "codes": codes, "library": library_parse_ms(pushed)}


async def main(strangers: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        async with FakeOpenAI(fallback=lambda body: reply("hi owner")) as llm, FakeTelegram() as tg:
            write_config(home, llm, tg)
            log = open(home / "gateway.log", "wb")
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway",
                                                        env={**os.environ, "NANOBOT_HOME": str(home)},
                                                        stdout=log, stderr=asyncio.subprocess.STDOUT)
            try:
                await tg.wait_until(lambda: "getUpdates" in tg.calls, timeout=30)
                print(f"{strangers} strangers, then the owner; machine reference {common.reference_ms():.1f} ms")
                for run in range(runs):
                    r = await burst(tg, proc.pid, strangers, 10_000 + run * strangers)
                    print(f"run {run + 1}: owner's reply after {r['waited'] * 1000:5.0f} ms; gateway CPU "
                          f"{r['cpu']:6.0f} ms = {r['cpu'] / r['library']:.1f}x the library's parse "
                          f"({r['library']:.0f} ms); pairing codes sent {r['codes']}")
            finally:
                proc.terminate()
                await proc.wait()
            lines = (home / "gateway.log").read_text().count("\n")
            print(f"gateway log: {lines} lines")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strangers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.strangers, args.runs))
