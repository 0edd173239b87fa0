"""The cron tables in nanobot.db: the jobs, their schedule (each row's ``next_run_at``) and
their run history.

The gateway's clock reads and claims rows here (nanobot.cron.service); the CLI writes here
from another process, and the clock sees it at its next look. (``cron_meta`` held a change
counter the clock once polled; it is no longer read.)
Timestamps are stored as UTC ISO 8601 text with microseconds, so they also sort as text.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Mapping

from pathlib import Path

from nanobot.database import Database, Migrations, SqliteDatabase

PayloadKind = Literal["code", "prompt"]
RunStatus = Literal["ok", "error", "missed"]
RUN_RETENTION_DAYS = 30  # run records older than this are pruned
OUTPUT_EXCERPT_CHARS = 2000

def _tables(run_id: str, counter: str) -> str:
    """The cron tables; only the run ids' and the change counter's types differ by engine."""
    return f"""
    CREATE TABLE cron_jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner_session TEXT NOT NULL,
        schedule_kind TEXT NOT NULL CHECK (schedule_kind IN ('cron', 'every', 'at')),
        expression TEXT NOT NULL,
        timezone TEXT NOT NULL,
        payload_kind TEXT NOT NULL CHECK (payload_kind IN ('code', 'prompt')),
        payload TEXT NOT NULL,
        deliver_to TEXT,
        enabled INTEGER NOT NULL DEFAULT 1,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        last_run_at TEXT,
        next_run_at TEXT,
        last_status TEXT CHECK (last_status IN ('ok', 'error', 'missed')),
        consecutive_failures INTEGER NOT NULL DEFAULT 0,
        run_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE cron_runs (
        id {run_id},
        job_id TEXT NOT NULL,
        started_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'error', 'missed')),
        output_excerpt TEXT NOT NULL DEFAULT '',
        function_calls INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX cron_runs_by_job ON cron_runs (job_id, id);
    CREATE TABLE cron_meta (key TEXT PRIMARY KEY, value {counter} NOT NULL);
    INSERT INTO cron_meta (key, value) VALUES ('change_token', 0);
    """


RUNS_BY_START = "CREATE INDEX cron_runs_by_start ON cron_runs (started_at);"  # for pruning old run records
MIGRATIONS: Migrations = {
    "sqlite": [_tables("INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER"), RUNS_BY_START],
    "postgresql": [_tables("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "BIGINT") + RUNS_BY_START],
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _to_text(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _from_text(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@dataclass
class CronJob:
    id: str
    name: str
    owner_session: str
    schedule_kind: str
    expression: str
    timezone: str
    payload_kind: str
    payload: str
    deliver_to: str | None
    enabled: bool
    created_at: datetime
    updated_at: datetime
    last_run_at: datetime | None
    next_run_at: datetime | None
    last_status: str | None
    consecutive_failures: int
    run_requested: bool

    @property
    def target(self) -> str:
        """Where results go: ``deliver_to``, or the owning session when unset."""
        return self.deliver_to or self.owner_session

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CronJob:
        data = dict(row)
        for key in ("created_at", "updated_at", "last_run_at", "next_run_at"):
            data[key] = _from_text(data[key])
        data["enabled"] = bool(data["enabled"])
        data["run_requested"] = bool(data["run_requested"])
        return cls(**data)


@dataclass
class CronRun:
    id: int
    job_id: str
    started_at: datetime
    duration_ms: int
    status: str
    output_excerpt: str
    function_calls: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CronRun:
        data = dict(row)
        data["started_at"] = _from_text(data["started_at"])
        return cls(**data)


class CronStore:
    """Async access to ``cron_jobs`` / ``cron_runs``. Every write commits at once: another
    process (the CLI, another worker) sees only committed rows."""

    def __init__(self, db: Database, *, owns_db: bool = False):
        self.db = db
        self._owns_db = owns_db  # opened from a path: close() closes it

    @classmethod
    async def open(cls, where: Database | Path | str) -> CronStore:
        """The store on a database, or on the SQLite file at a path (then the store owns it);
        its tables migrated."""
        owned = isinstance(where, (str, Path))
        store = cls(await SqliteDatabase.open(where) if owned else where, owns_db=owned)  # type: ignore[arg-type]
        try:
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def migrate(self) -> None:
        await self.db.migrate("cron", MIGRATIONS)

    async def close(self) -> None:
        if self._owns_db:
            await self.db.close()

    # ---- reads ----------------------------------------------------------------------
    async def get(self, job_id: str) -> CronJob | None:
        row = await self.db.fetchrow("SELECT * FROM cron_jobs WHERE id = $1", job_id)
        return CronJob.from_row(row) if row else None

    async def list(self, owner_session: str | None = None) -> list[CronJob]:
        sql, args = "SELECT * FROM cron_jobs", ()
        if owner_session is not None:
            sql, args = sql + " WHERE owner_session = $1", (owner_session,)
        return [CronJob.from_row(row) for row in await self.db.fetch(sql + " ORDER BY created_at, id", *args)]

    async def runs(self, job_id: str, limit: int = 20) -> list[CronRun]:
        """The job's most recent runs, newest first."""
        rows = await self.db.fetch("SELECT * FROM cron_runs WHERE job_id = $1 ORDER BY id DESC LIMIT $2", job_id, limit)
        return [CronRun.from_row(row) for row in rows]

    # ---- writes ---------------------------------------------------------------------
    async def add(self, *, name: str, owner_session: str, schedule_kind: str, expression: str, timezone: str,
                  payload_kind: str, payload: str, deliver_to: str | None = None,
                  next_run_at: datetime | None = None) -> CronJob:
        """Insert a job (the caller validated it) under a fresh 8-hex-digit id."""
        now = _to_text(utcnow())
        for _ in range(5):  # 2**32 ids: a collision is rare, a retry cheap
            job_id = secrets.token_hex(4)
            if await self.db.execute(
                    "INSERT INTO cron_jobs (id, name, owner_session, schedule_kind, expression, timezone, payload_kind,"
                    " payload, deliver_to, created_at, updated_at, next_run_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING",
                    job_id, name, owner_session, schedule_kind, expression, timezone, payload_kind, payload,
                    deliver_to, now, now, _to_text(next_run_at)):
                job = await self.get(job_id)
                assert job is not None
                return job
        raise RuntimeError("could not allocate a cron job id")

    async def remove(self, job_id: str) -> bool:
        """Delete the job (its run history stays); False if there was no such job."""
        return await self.db.execute("DELETE FROM cron_jobs WHERE id = $1", job_id) > 0

    async def set_enabled(self, job_id: str, enabled: bool) -> bool:
        """Pause or resume. Clears next_run_at: the clock gives a resumed job its next time at its
        next look, and a stale time must not read as a run missed while paused."""
        return await self.db.execute(
            "UPDATE cron_jobs SET enabled = $1, next_run_at = NULL, consecutive_failures = "
            "CASE WHEN $1 = 1 THEN 0 ELSE consecutive_failures END, updated_at = $2 WHERE id = $3",
            int(enabled), _to_text(utcnow()), job_id) > 0

    async def request_run(self, job_id: str) -> bool:
        """Ask the running clock (maybe in another process) to run the job now (``claim_request``)."""
        return await self.db.execute("UPDATE cron_jobs SET run_requested = 1 WHERE id = $1", job_id) > 0

    async def record_run(self, job_id: str, started: datetime, duration_ms: int, status: RunStatus,
                         output: str = "", function_calls: int = 0) -> CronJob | None:
        """Log one run and fold it into the job's status; returns the updated job (None if gone).

        'ok' resets the failure streak, 'error' extends it, 'missed' leaves it alone.
        """
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO cron_runs (job_id, started_at, duration_ms, status, output_excerpt, function_calls)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                job_id, _to_text(started), int(duration_ms), status, output[:OUTPUT_EXCERPT_CHARS], function_calls)
            # A job every minute for months must not grow the database without bound.
            await tx.execute("DELETE FROM cron_runs WHERE started_at < $1",
                             _to_text(started - timedelta(days=RUN_RETENTION_DAYS)))
            await tx.execute(
                "UPDATE cron_jobs SET last_run_at = $1, last_status = $2, consecutive_failures = CASE $2"
                " WHEN 'ok' THEN 0 WHEN 'error' THEN consecutive_failures + 1 ELSE consecutive_failures END"
                " WHERE id = $3", _to_text(started), status, job_id)
        return await self.get(job_id)

    # ---- the schedule (nanobot.cron.service's clock) ------------------------------------
    async def due(self, now: datetime) -> list[CronJob]:
        """Jobs a clock must act on: due, without a next time yet, or asked to run."""
        rows = await self.db.fetch("SELECT * FROM cron_jobs WHERE run_requested = 1 OR (enabled = 1 AND"
                                   " (next_run_at IS NULL OR next_run_at <= $1)) ORDER BY next_run_at, id",
                                   _to_text(now))
        return [CronJob.from_row(row) for row in rows]

    async def earliest_run(self) -> datetime | None:
        return _from_text(await self.db.fetchval("SELECT MIN(next_run_at) FROM cron_jobs WHERE enabled = 1"))

    async def claim(self, job_id: str, due: datetime, next_run_at: datetime | None) -> bool:
        """Move a due job on to its next time; False when another clock (or an edit) moved it first."""
        return await self.db.execute("UPDATE cron_jobs SET next_run_at = $1 WHERE id = $2 AND next_run_at = $3",
                                     _to_text(next_run_at), job_id, _to_text(due)) > 0

    async def claim_request(self, job_id: str) -> bool:
        """Take a run asked for (``request_run``); False when another clock took it first."""
        return await self.db.execute("UPDATE cron_jobs SET run_requested = 0 WHERE id = $1 AND run_requested = 1",
                                     job_id) > 0

    async def set_first_runs(self, pairs: list[tuple[str, datetime]]) -> None:
        """Next times for jobs that had none, in one transaction (1,000 jobs at start: one commit)."""
        if pairs:
            await self.db.executemany("UPDATE cron_jobs SET next_run_at = $1 WHERE id = $2 AND next_run_at IS NULL",
                                      [(_to_text(moment), job_id) for job_id, moment in pairs])
