"""The SQLite database (``$NANOBOT_HOME/nanobot.db``) through aiosqlite.

Each store owns its tables and lists its own migrations; ``migrate`` applies the ones a
database has not seen yet, recorded per component in ``schema_versions``. WAL mode lets the
CLI and a running gateway use the same file at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path

import aiosqlite

from nanobot.config import private_dir


class HomeError(Exception):
    """The home or the database cannot be used (not writable, say): one line for the user, exit 1."""


class StoreUnavailable(Exception):
    """The database cannot be reached now (a server down or restarting); the same write will
    work once it is back. Writers that must not lose anything wait and retry."""


def schema_too_new(component: str, found: int, known: int) -> HomeError:
    """A database written by a newer nanobot: refused, since this one would misread it."""
    return HomeError(f"the database's {component} tables are schema version {found}, newer than this "
                     f"nanobot knows ({known}); upgrade nanobot (or point it at another database)")


def check_writable(directory: Path, what: str = "NANOBOT_HOME") -> None:
    """Fail early, in one line, on a directory we cannot write (instead of a traceback, or a hang)."""
    try:
        private_dir(directory)
        probe = directory / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise HomeError(f"{what} {directory} is not writable: {exc.strerror or exc}") from None


async def open_db(path: Path | str) -> aiosqlite.Connection:
    """The connection, ready; on any failure it is closed again (an open aiosqlite connection's
    thread would keep the process alive after the error) and the error is a HomeError line."""
    if str(path) != ":memory:":
        check_writable(Path(path).parent)
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite's -wal/-shm files copy this mode
            os.chmod(path, 0o600)
        except OSError as exc:
            raise HomeError(f"database {path}: {exc.strerror or exc}") from None
    conn = await aiosqlite.connect(str(path), timeout=10)
    try:
        conn.row_factory = aiosqlite.Row
        await _use_wal(conn)
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA busy_timeout=10000")
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_versions "
                           "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)")
        await conn.commit()
    except BaseException as exc:
        await conn.close()
        if isinstance(exc, sqlite3.Error):
            raise HomeError(f"database {path}: {exc}") from None
        raise
    return conn


async def _use_wal(conn: aiosqlite.Connection, wait_s: float = 10.0) -> None:
    """WAL mode, waited for as long as any lock is: the switch (once, on a fresh file) takes an
    exclusive lock without SQLite's busy handler, so a process opening the file at that moment
    (six ``nanobot cron add`` at once) got "database is locked" at once."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def migrate(conn: aiosqlite.Connection, component: str, migrations: list[str]) -> None:
    """Apply ``migrations[v:]`` where v is the component's recorded version; each item is a SQL script.

    Processes migrate one at a time (a lock file beside the database): two ``nanobot cron add``
    on a fresh database would otherwise both see version 0, and the second would fail on
    "table already exists". (A SQL transaction cannot hold them apart: executescript commits.)
    """
    async with _migration_lock(conn):
        await _migrate(conn, component, migrations)


@contextlib.asynccontextmanager
async def _migration_lock(conn: aiosqlite.Connection):
    async with conn.execute("PRAGMA database_list") as cur:
        path = next((row[2] for row in await cur.fetchall() if row[1] == "main"), "")
    if not path:  # an in-memory database: nobody else can see it
        yield
        return
    fd = os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


async def _migrate(conn: aiosqlite.Connection, component: str, migrations: list[str]) -> None:
    async with conn.execute("SELECT version FROM schema_versions WHERE component = ?", (component,)) as cur:
        row = await cur.fetchone()
    current = row[0] if row else 0
    if current > len(migrations):
        raise schema_too_new(component, current, len(migrations))
    if not component.isidentifier():
        raise ValueError(f"bad component name {component!r}")
    for version, script in enumerate(migrations[current:], start=current + 1):
        # One transaction per step, its version included: executescript would otherwise commit
        # each statement, and a crash half-way left tables that the next start tried to create
        # again ("table cron_jobs already exists"). SQLite's DDL is transactional.
        try:
            await conn.executescript(
                f"BEGIN;\n{script}\n;INSERT INTO schema_versions (component, version) VALUES ('{component}', {version}) "
                "ON CONFLICT(component) DO UPDATE SET version = excluded.version;\nCOMMIT;")
        except BaseException:
            await conn.rollback()
            raise
