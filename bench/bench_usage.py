"""What a status costs in a home that has recorded many model calls: the usage queries of an
owner's ``/status`` (and ``nanobot status``), a member's, and ``/tasks``, and how long a
message's write waits behind an owner's ``/status`` on SQLite's one connection. The home is
the embedded default (SQLite), filled through ``UsageStore`` with calls over 200 chats, a
minute apart.

    python bench/bench_usage.py [--calls 1000000] [--runs 5]

Prints the median of ``--runs`` for each.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import common
from nanobot.database import SqliteDatabase
from nanobot.usage import UsageStore


async def fill(path: Path, calls: int) -> None:
    """``calls`` model calls and as many executions, written as the store writes them (its triggers too)."""
    db = await SqliteDatabase.open(path)
    await UsageStore.create(db)
    await db.close()
    now, chats = time.time(), [f"telegram:{n}" for n in range(200)]
    with sqlite3.connect(path) as conn:
        rows = [(now - (calls - i) * 60, random.choice(chats)) for i in range(calls)]
        conn.executemany("INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, "
                         "completion_tokens, outcome, provider, cost_usd, member, cached_tokens) "
                         "VALUES (?, ?, 'code', 'turn', 'gpt-4.1-mini', 3000, 200, 'ok', 'openai', 0.001, 0, 2500)", rows)
        conn.executemany("INSERT INTO executions (ts, session_key, mode, duration_ms, function_calls, outcome) "
                         "VALUES (?, ?, 'code', 12.0, 3, 'ok')", rows)


async def timed(work) -> float:
    started = time.perf_counter()
    await work()
    return (time.perf_counter() - started) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "nanobot.db"
        await fill(path, args.calls)
        db = await SqliteDatabase.open(path)
        usage = UsageStore(db)

        async def owner_status() -> None:
            await usage.totals()
            await usage.cost_lines("UTC")

        async def tasks() -> None:
            for n in range(10):
                await usage.of_chat(f"telegram:5:task:{n}")

        async def write_alone() -> None:
            await usage.record_call("telegram:7", "code", "gpt-4.1-mini", 3000, 200, provider="openai")

        print(f"{args.calls:,} model calls recorded; machine reference {common.reference_ms():.1f} ms")
        for name, work in [("owner's /status (usage part)", owner_status),
                           ("member's /status (its chat's totals)", lambda: usage.totals("telegram:5")),
                           ("/tasks (10 tasks' calls and cost)", tasks),
                           ("a call recorded alone", write_alone)]:
            print(f"{name:40} {common.p50([await timed(work) for _ in range(args.runs)]):9.1f} ms")
        waits = []
        for _ in range(args.runs):
            status = asyncio.create_task(owner_status())
            await asyncio.sleep(0)
            waits.append(await timed(write_alone))
            await status
        print(f"{'a call recorded during an owner /status':40} {common.p50(waits):9.1f} ms")
        await db.close()


if __name__ == "__main__":
    asyncio.run(main())
