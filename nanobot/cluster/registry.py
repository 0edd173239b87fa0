"""Who the workers are: one row each, renewed by a heartbeat, and the chats they lease.

A worker is alive while its line's backend exists (``pg_stat_activity``: a killed worker is
dead at once) and its heartbeat is fresh (``expires``: a worker that cannot reach the database
is dead after ``gateway.failoverSeconds``). A line older than the server was lost to a restart:
its worker is reconnecting, alive while its heartbeat lasts, so a restart moves nothing of
anybody's (chats, replies, tasks). The view ``live_workers`` says which are; every
takeover decision reads it, inside PostgreSQL, with the server's clock (hosts' clocks may
differ). A chat lease is valid while its holder is alive, so one heartbeat renews them all.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanobot.database import Migrations
    from nanobot.postgres import PostgresDatabase

MIGRATIONS: Migrations = {"sqlite": [], "postgresql": ["""
CREATE FUNCTION nanobot_now() RETURNS DOUBLE PRECISION LANGUAGE sql VOLATILE
    AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;
CREATE TABLE workers (
    id TEXT PRIMARY KEY,  -- gateway.workerId, HOST:PID by default
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    backend_pid INTEGER NOT NULL,  -- its line's server process: gone = the worker is gone
    backend_start TIMESTAMPTZ NOT NULL,
    started DOUBLE PRECISION NOT NULL,
    heartbeat DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION NOT NULL,  -- heartbeat + (its failoverSeconds - 1.5 s)
    holds TEXT NOT NULL DEFAULT ''  -- the singletons it holds, for status
);
CREATE VIEW live_workers AS
    SELECT w.* FROM workers w JOIN pg_stat_activity a ON a.pid = w.backend_pid AND a.backend_start = w.backend_start
    WHERE w.expires > nanobot_now();
CREATE TABLE chat_leases (
    chat TEXT PRIMARY KEY,  -- the session key
    worker TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL
);
CREATE INDEX chat_leases_worker ON chat_leases (worker);
""",
# Singletons a worker waits for that a session which is no worker holds (what it saw, for status).
"ALTER TABLE workers ADD COLUMN blocked TEXT NOT NULL DEFAULT '';",
# The assistant's workspace, recorded by its first worker: every worker must use the same one.
"""
CREATE TABLE assistant (key TEXT PRIMARY KEY, value TEXT NOT NULL);
ALTER TABLE workers ADD COLUMN workspace TEXT NOT NULL DEFAULT '';
""",
# A worker whose line began before the server did lost it to a restart: it is reconnecting, not
# dead, while its heartbeat lasts (else its chats, replies and tasks moved while it ran them on).
"""
CREATE OR REPLACE VIEW live_workers AS
    SELECT w.* FROM workers w LEFT JOIN pg_stat_activity a ON a.pid = w.backend_pid
        AND a.backend_start = w.backend_start
    WHERE w.expires > nanobot_now() AND (a.pid IS NOT NULL OR w.backend_start < pg_postmaster_start_time());
"""]}

FORGET_DEAD_AFTER_S = 86400  # a dead worker's row stays this long, for status


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    return True


class WorkerIdInUse(Exception):
    """Another live worker registered under the same gateway.workerId."""


class OtherWorkspace(Exception):
    """This worker's agents.defaults.workspace is not the assistant's (memory and files would split)."""


@dataclass(frozen=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    alive: bool
    heartbeat: float
    now: float
    holds: str
    chats: int
    blocked: str  # "name: who" lines: singletons held by sessions that are not workers
    workspace: str


class Registry:
    def __init__(self, db: PostgresDatabase, worker_id: str, lapse: float) -> None:
        self.db, self.id, self.lapse = db, worker_id, lapse  # a heartbeat is good for ``lapse`` seconds

    async def check_workspace(self, workspace: str, *, new: bool = False) -> None:
        """The first worker records the assistant's workspace; OtherWorkspace for one whose
        workspace differs (each worker would otherwise grow its own memory and files). A
        workspace this start just made from the template (``new``) is not recorded over a
        database that already holds the assistant's history: it is a wrong path, not the
        assistant's (recording it would lock every worker out of the right one)."""
        if new and await self.db.fetchval(
                "SELECT NOT EXISTS (SELECT 1 FROM assistant WHERE key = 'workspace') "
                "AND (EXISTS (SELECT 1 FROM inbound) OR EXISTS (SELECT 1 FROM history))"):
            raise OtherWorkspace(f"agents.defaults.workspace: {workspace} did not exist and was just made from the "
                                 "template, but this database already holds the assistant's history: set it to the "
                                 "assistant's workspace (shared by every worker), or, if this one is right, record it "
                                 f"with: nanobot db set-workspace {workspace}")
        await self.db.execute("INSERT INTO assistant (key, value) VALUES ('workspace', $1) ON CONFLICT DO NOTHING",
                              workspace)
        theirs = await self.db.fetchval("SELECT value FROM assistant WHERE key = 'workspace'")
        if theirs != workspace:
            raise OtherWorkspace(f"agents.defaults.workspace: this worker's is {workspace}, but the assistant's "
                                 f"is {theirs} (every worker uses the one workspace, on shared storage if on "
                                 "several hosts)")

    async def register(self, backend: tuple[int, datetime], pid: int, started: float, workspace: str) -> None:
        """Join (or rejoin after a lost line); WorkerIdInUse if a live worker has our id. Ours
        still: the row of this process, and of a process with our id on this host whose line and
        process are gone (a crash, then a start within its heartbeat: after a restart it counts
        as reconnecting)."""
        row = await self.db.fetchrow("SELECT host, pid FROM workers WHERE id = $1", self.id)
        gone = row is not None and row["host"] == socket.gethostname() and not _running(row["pid"])
        joined = await self.db.fetchval(
            "INSERT INTO workers AS w (id, host, pid, backend_pid, backend_start, started, heartbeat, expires, "
            "workspace) VALUES ($1, $2, $3, $4, $5, $6, nanobot_now(), nanobot_now() + $7, $8) "
            "ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
            "backend_pid = excluded.backend_pid, backend_start = excluded.backend_start, started = excluded.started, "
            "heartbeat = excluded.heartbeat, expires = excluded.expires, holds = '', workspace = excluded.workspace "
            "WHERE w.id NOT IN (SELECT id FROM live_workers) OR w.backend_pid = excluded.backend_pid "
            "OR (w.host, w.pid, w.started) = (excluded.host, excluded.pid, excluded.started) OR $9 AND NOT EXISTS "
            "(SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.backend_pid AND a.backend_start = w.backend_start) "
            "RETURNING id",
            self.id, socket.gethostname(), pid, backend[0], backend[1], started, self.lapse, workspace, gone)
        if joined is None:
            row = await self.db.fetchrow("SELECT host, pid FROM workers WHERE id = $1", self.id)
            raise WorkerIdInUse(f"gateway.workerId: {self.id!r} is the id of a running worker "
                                f"(host {row['host']}, pid {row['pid']}); give each worker its own")

    async def forget_previous_run(self) -> None:
        """What a previous process with our id left: its leases go, its unsent replies become
        anyone's (they are sent by the chat's next holder)."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM chat_leases WHERE worker = $1", self.id)
            await tx.execute("UPDATE outbox SET worker = NULL WHERE worker = $1 AND state = 'pending'", self.id)

    async def heartbeat(self, backend: tuple[int, datetime], holds: list[str], blocked: dict[str, str]) -> bool:
        """Renew our row (and so our leases); False if it is no longer ours (we were taken for dead)."""
        return bool(await self.db.execute(
            "UPDATE workers SET heartbeat = nanobot_now(), expires = nanobot_now() + $2, holds = $3, blocked = $5 "
            "WHERE id = $1 AND backend_pid = $4", self.id, self.lapse, ", ".join(sorted(holds)), backend[0],
            "\n".join(f"{name}: {who}" for name, who in sorted(blocked.items()))))

    async def leave(self, backend: tuple[int, datetime]) -> None:
        """A normal stop: our chats are free at once, not after a timeout. Only if the row is
        still ours (not if our id was taken over, or we never joined)."""
        async with self.db.transaction() as tx:
            if await tx.execute("UPDATE workers SET expires = nanobot_now(), holds = '' WHERE id = $1 "
                                "AND backend_pid = $2", self.id, backend[0]):
                await tx.execute("DELETE FROM chat_leases WHERE worker = $1", self.id)
                await tx.execute("SELECT pg_notify('nanobot_free', '*')")  # the others may take them at once

    async def prune(self) -> None:
        await self.db.execute("DELETE FROM workers WHERE expires < nanobot_now() - $1", FORGET_DEAD_AFTER_S)


async def list_workers(db: Any) -> list[WorkerRow]:
    """Every worker seen in the last day, live ones first (``nanobot status``, the page)."""
    rows = await db.fetch(
        "SELECT w.id, w.host, w.pid, w.heartbeat, w.holds, w.blocked, w.workspace, nanobot_now() AS now, "
        "w.id IN (SELECT id FROM live_workers) AS alive, "
        "(SELECT count(*) FROM chat_leases l WHERE l.worker = w.id) AS chats "
        "FROM workers w ORDER BY alive DESC, w.started")
    return [WorkerRow(r["id"], r["host"], r["pid"], bool(r["alive"]), r["heartbeat"], r["now"],
                      r["holds"] if r["alive"] else "", int(r["chats"]) if r["alive"] else 0,
                      r["blocked"] if r["alive"] else "", r["workspace"]) for r in rows]


async def worker_lines(db: Any) -> list[str]:
    """``Workers:`` and one line per worker, as ``nanobot status`` and the page show them."""
    rows = await list_workers(db)
    alive = [r for r in rows if r.alive]
    lines = [f"Workers:   {len(alive)} alive" + (f", {len(rows) - len(alive)} gone in the last day"
                                                   if len(rows) > len(alive) else "")]
    for r in rows:
        ago = f"{max(0.0, r.now - r.heartbeat):.0f} s ago"
        if r.alive:
            lines.append(f"  {r.id} (host {r.host}, pid {r.pid}): {r.chats} chat(s); "
                         f"holds {r.holds or 'no singleton'}; heartbeat {ago}; workspace {r.workspace or '?'}")
        else:
            lines.append(f"  {r.id} (host {r.host}, pid {r.pid}): gone; last heartbeat {ago}")
    for seen in sorted({line for r in rows for line in r.blocked.splitlines() if line}):
        name, _, who = seen.partition(": ")
        lines.append(f"  WARNING: {name} held by a session that is not a worker: {who}")
    if await db.fetchval("SELECT has_database_privilege('public', current_database(), 'CONNECT')"):
        lines.append("  WARNING: every role may connect to this database (and so NOTIFY and take advisory "
                     "locks): REVOKE CONNECT ON DATABASE ... FROM PUBLIC (docs/storage.md)")
    return lines


async def record_workspace(db: PostgresDatabase, workspace: str) -> str | None:
    """Record ``workspace`` as the assistant's (``nanobot db set-workspace``); the one before."""
    await db.migrate("workers", MIGRATIONS)
    before = await db.fetchval("SELECT value FROM assistant WHERE key = 'workspace'")
    await db.execute("INSERT INTO assistant (key, value) VALUES ('workspace', $1) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", workspace)
    return before
