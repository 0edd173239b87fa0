"""Background tasks: a row each, recorded before ``spawn`` returns, so a task outlives the turn
that started it and the process that runs it.

A task's whole state is its row: queued, running (on which worker, how many attempts), or
done, failed or stopped with its result. A runner (``nanobot.gateway.task_runner``) claims
queued rows; at start it puts back what its own last run left running (on PostgreSQL also
what dead workers left), so a kill -9 resumes a task once. Its result reaches the chat through
the durable intake, under a delivery key of its own, so it is sent once.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Mapping

from nanobot.database import Database, Migrations
from nanobot.usage import plural

ACTIVE = ("queued", "running")
ENDED = ("done", "failed", "stopped")
# Runs a task may begin: the first and the resumptions after crashes. A graceful stop (a
# deploy) hands its tasks back without counting; what this limits is a crash loop (a task that
# takes the process down every time), not restarts.
MAX_ATTEMPTS = 5
# Ended tasks older than this are forgotten, as cron's run records are: a task a day for the
# months the daemon runs must not grow the table (each row holds its whole result) without bound.
KEEP_ENDED_S = 30 * 86400

# Who a task counts for (``trust.quota_holder``: an API key's sessions together) and whether a
# member chat started it (members together keep a share of maxTotal free for the owner).
_QUOTAS = """
ALTER TABLE tasks ADD COLUMN holder TEXT;
ALTER TABLE tasks ADD COLUMN member INTEGER NOT NULL DEFAULT 0;
"""
MIGRATIONS: Migrations = {
    "sqlite": ["""
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY, chat TEXT NOT NULL, label TEXT, task TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'queued', worker TEXT, attempts INTEGER NOT NULL DEFAULT 0,
        stop_requested INTEGER NOT NULL DEFAULT 0, result TEXT,
        created REAL NOT NULL, started REAL, finished REAL);
    CREATE INDEX tasks_active ON tasks (state, created);
    """, _QUOTAS],
    "postgresql": ["""
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY, chat TEXT NOT NULL, label TEXT, task TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'queued', worker TEXT, attempts INTEGER NOT NULL DEFAULT 0,
        stop_requested INTEGER NOT NULL DEFAULT 0, result TEXT,
        created DOUBLE PRECISION NOT NULL, started DOUBLE PRECISION, finished DOUBLE PRECISION);
    CREATE INDEX tasks_active ON tasks (state, created);
    """, _QUOTAS],
}


@dataclass(frozen=True)
class Task:
    id: str
    chat: str
    label: str | None
    task: str
    state: str
    worker: str | None
    attempts: int
    stop_requested: bool
    result: str | None
    created: float
    started: float | None  # when its first run began: maxMinutes counts from here, across resumptions
    finished: float | None
    holder: str | None = None
    member: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        data = dict(row)
        data["stop_requested"], data["member"] = bool(data["stop_requested"]), bool(data.get("member"))
        return cls(**data)

    @property
    def name(self) -> str:
        return f"{self.label} ({self.id})" if self.label else self.id


class TaskStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    async def open(cls, db: Database) -> TaskStore:
        await db.migrate("tasks", MIGRATIONS)
        return cls(db)

    async def add(self, chat: str, task: str, label: str | None, *, holder: str | None = None,
                  member: bool = False) -> Task:
        task_id = "t" + secrets.token_hex(3)
        await self.db.execute("INSERT INTO tasks (id, chat, label, task, created, holder, member) "
                              "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                              task_id, chat, label, task, time.time(), holder or chat, int(member))
        found = await self.get(task_id)
        assert found is not None
        return found

    async def get(self, task_id: str) -> Task | None:
        row = await self.db.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
        return Task.from_row(row) if row else None

    async def of_chat(self, chat: str, limit: int = 20) -> list[Task]:
        rows = await self.db.fetch("SELECT * FROM tasks WHERE chat = $1 ORDER BY created DESC LIMIT $2", chat, limit)
        return [Task.from_row(r) for r in rows]

    async def active(self, *, holder: str | None = None, members: bool = False) -> int:
        """Queued and running tasks: all, one quota holder's, or member chats' together."""
        where = "state IN ('queued', 'running')"
        if holder is not None:
            return int(await self.db.fetchval(f"SELECT count(*) FROM tasks WHERE {where} "
                                              "AND coalesce(holder, chat) = $1", holder))
        return int(await self.db.fetchval(f"SELECT count(*) FROM tasks WHERE {where}"
                                          + (" AND member = 1" if members else "")))

    async def status_line(self) -> str:
        """How many run and wait (``nanobot status``, the page's status)."""
        rows = await self.db.fetch("SELECT state, count(*) FROM tasks WHERE state IN ('queued', 'running') "
                                   "GROUP BY state")
        counts = {row[0]: int(row[1]) for row in rows}
        return f"{plural(counts.get('running', 0), 'background task')} running, {counts.get('queued', 0)} waiting"

    async def claim(self, worker: str) -> Task | None:
        """The oldest queued task, now running here; None when none waits. Workers claiming at
        once get different ones (PostgreSQL: SKIP LOCKED; SQLite: one writer)."""
        pick = "SELECT id FROM tasks WHERE state = 'queued' ORDER BY created LIMIT 1"
        if self.db.engine == "postgresql":
            pick += " FOR UPDATE SKIP LOCKED"
        async with self.db.transaction() as tx:  # a write that returns rows: committed here
            row = await tx.fetchrow(
                f"UPDATE tasks SET state = 'running', worker = $1, attempts = attempts + 1, "
                f"started = coalesce(started, $2) WHERE id = ({pick}) RETURNING *", worker, time.time())
        return Task.from_row(row) if row else None

    async def requeue(self, worker: str, *, dead_workers: bool = False) -> list[str]:
        """Put back what a crash left running: this worker's own (its last run), or with
        ``dead_workers`` what other workers no longer alive held (PostgreSQL; not its own: cut off
        and not alive itself, it still runs them). Ids of the resumed."""
        where = "worker <> $1 AND worker NOT IN (SELECT id FROM live_workers)" if dead_workers else "worker = $1"
        async with self.db.transaction() as tx:
            rows = await tx.fetch(f"UPDATE tasks SET state = 'queued', worker = NULL WHERE state = 'running' "
                                  f"AND {where} RETURNING id", worker)
        return [r["id"] for r in rows]

    async def moved(self, worker: str, task_ids: list[str]) -> list[str]:
        """Of these tasks running on ``worker``, those another worker put back or runs (it took
        this one for dead)."""
        rows = await self.db.fetch("SELECT id FROM tasks WHERE id = ANY($1::text[]) AND state IN ('queued', "
                                   "'running') AND worker IS DISTINCT FROM $2", task_ids, worker)
        return [row["id"] for row in rows]

    async def running_on(self, worker: str) -> list[str]:
        rows = await self.db.fetch("SELECT id FROM tasks WHERE state = 'running' AND worker = $1", worker)
        return [row["id"] for row in rows]

    async def hand_back(self, worker: str, task_ids: list[str]) -> None:
        """A graceful stop (or a claim whose answer was lost): these tasks wait again for the next
        start (or another worker), and the run cut short or never begun does not count as an attempt."""
        await self.db.executemany("UPDATE tasks SET state = 'queued', worker = NULL, attempts = attempts - 1 "
                                  "WHERE id = $1 AND state = 'running' AND worker = $2",
                                  [(task_id, worker) for task_id in task_ids])

    async def finish(self, task_id: str, state: str, result: str) -> None:
        """The task ended (``state``: one of ENDED) with ``result``; ended tasks a month old go."""
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE tasks SET state = $2, result = $3, finished = $4 WHERE id = $1",
                             task_id, state, result, now)
            await tx.execute("DELETE FROM tasks WHERE finished < $1", now - KEEP_ENDED_S)

    async def request_stop(self, chat: str, task_id: str) -> Task | None:
        """``/stop ID``: a queued task ends at once, a running one at its runner's next look."""
        await self.db.execute("UPDATE tasks SET stop_requested = 1 WHERE id = $1 AND chat = $2 "
                              "AND state IN ('queued', 'running')", task_id, chat)
        return await self.get(task_id)

    async def request_stop_all(self, chat: str) -> list[str]:
        """Every queued or running task of the chat asked to stop (``request_stop``); their ids."""
        async with self.db.transaction() as tx:  # a write that returns rows: committed here
            rows = await tx.fetch("UPDATE tasks SET stop_requested = 1 WHERE chat = $1 "
                                  "AND state IN ('queued', 'running') RETURNING id", chat)
        return [row["id"] for row in rows]

    async def stops(self, worker: str) -> list[Task]:
        """Tasks asked to stop: queued anywhere, or running here."""
        rows = await self.db.fetch("SELECT * FROM tasks WHERE stop_requested = 1 AND (state = 'queued' OR "
                                   "state = 'running' AND worker = $1)", worker)
        return [Task.from_row(r) for r in rows]
