"""Usage counters in ``nanobot.db``: every model call's tokens and every code execution.

``nanobot status`` reads the totals per execution mode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiosqlite

from nanobot.db import migrate

MIGRATIONS = [
    """
    CREATE TABLE model_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, session_key TEXT NOT NULL,
        mode TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL);
    CREATE TABLE executions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, session_key TEXT NOT NULL,
        mode TEXT NOT NULL, duration_ms REAL NOT NULL, function_calls INTEGER NOT NULL,
        outcome TEXT NOT NULL);
    """,
    # Failed model calls are recorded too (tokens 0), so status shows how often the server fails.
    "ALTER TABLE model_calls ADD COLUMN outcome TEXT NOT NULL DEFAULT 'ok';",
]


@dataclass
class ModeTotals:
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    executions: int = 0
    failures: int = 0
    failed_calls: int = 0

    def summary(self) -> str:
        failed_calls = f" ({self.failed_calls} failed)" if self.failed_calls else ""
        return (f"{self.model_calls} model calls{failed_calls}, {self.prompt_tokens} prompt + {self.completion_tokens} "
                f"completion tokens, {self.executions} executions, {self.failures} failed")


class UsageStore:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    @classmethod
    async def create(cls, conn: aiosqlite.Connection) -> "UsageStore":
        await migrate(conn, "usage", MIGRATIONS)
        return cls(conn)

    async def record_call(self, session_key: str, mode: str, model: str, prompt_tokens: int,
                          completion_tokens: int, purpose: str = "turn", *, outcome: str = "ok") -> None:
        await self.conn.execute(
            "INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, completion_tokens, outcome) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), session_key, mode, purpose, model, prompt_tokens, completion_tokens, outcome))
        await self.conn.commit()

    async def record_execution(self, session_key: str, mode: str, duration_ms: float, function_calls: int,
                               outcome: str) -> None:
        await self.conn.execute(
            "INSERT INTO executions (ts, session_key, mode, duration_ms, function_calls, outcome) VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), session_key, mode, duration_ms, function_calls, outcome))
        await self.conn.commit()

    async def totals(self) -> dict[str, ModeTotals]:
        result: dict[str, ModeTotals] = {}
        async with self.conn.execute(
                "SELECT mode, count(*), sum(prompt_tokens), sum(completion_tokens), sum(outcome != 'ok') "
                "FROM model_calls GROUP BY mode") as cur:
            async for mode, calls, prompt, completion, failed in cur:
                result.setdefault(mode, ModeTotals()).__dict__.update(
                    model_calls=calls, prompt_tokens=prompt or 0, completion_tokens=completion or 0,
                    failed_calls=failed or 0)
        async with self.conn.execute(
                "SELECT mode, count(*), sum(outcome != 'ok') FROM executions GROUP BY mode") as cur:
            async for mode, runs, failures in cur:
                totals = result.setdefault(mode, ModeTotals())
                totals.executions, totals.failures = runs, failures or 0
        return result
