"""A day's memory, compressed: the gateway's resident size per 1,000 messages answered.

    python bench/bench_soak.py [--messages 6000] [--chats 50]

One in-process gateway (SQLite, the default), the stand-in Telegram and the scripted model
answering at once (what the stand-ins record of each request is dropped as it goes: it would
be the biggest thing in the process); messages go round the chats, 20 at a time. After each 1,000 answered, a
full garbage collection, then the RSS (``/proc/self/status``) and the size of what the open
chats hold (the histories in memory). The model folds memory when asked, so a chat holds what is not folded
yet and the newest ``KEEP_IN_MEMORY`` messages: the histories stay flat, and so should the RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import running_gateway, telegram_gateway_config
from tests.fakes.openai_server import reply
from tests.test_memory import is_consolidation
from tests.test_workers import echo

BATCH = 20


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def answer(body: dict) -> dict:
    """Echo, and fold memory when asked (so each chat lets go of what memory has folded)."""
    if is_consolidation(body):
        return reply('{"memory": "# Long-term memory\\n- The user asks how things are going.", '
                     '"history": "They asked how things were going; I answered."}')
    return echo(body)


async def main(messages: int, chats: int) -> None:
    ids = list(range(1000, 1000 + chats))
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeOpenAI(fallback=answer) as llm, FakeTelegram() as tg:
            config = telegram_gateway_config(llm.base_url, Path(tmp) / "workspace", tg, *ids)
            config.channels.telegram.streaming = False
            (Path(tmp) / "home").mkdir()
            config.use_home(Path(tmp) / "home")
            async with running_gateway(config) as gateway:
                print("answered  RSS MiB  messages held in open chats  open chats")
                sent = 0
                while sent < messages:
                    for n in range(BATCH):
                        chat = ids[(sent + n) % chats]
                        tg.push_text(chat, chat, f"message {sent + n}: how are things going today?")
                    sent += BATCH
                    await tg.wait_sent(BATCH, timeout=60)
                    for record in (llm.requests, llm.raw_requests, tg.sent, tg.calls, tg.actions, tg.pushed_at):
                        record.clear()  # the stand-ins' records are not the gateway's memory
                    if sent % 1000 == 0:
                        gc.collect()
                        open_chats = list(gateway.runtime.sessions._open.values())  # what it holds
                        held = sum(len(s.messages) for s in open_chats)
                        print(f"{sent:8d}  {rss_mib():7.1f}  {held:27d}  {len(open_chats):10d}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--chats", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.chats))
