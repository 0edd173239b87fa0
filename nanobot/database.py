"""One store interface, two engines: the embedded SQLite file (the default) and PostgreSQL.

Every store (pairing, usage, cron, delivery, per-chat Python state) writes its queries once,
with ``$1, $2, ...`` parameters: PostgreSQL's own syntax, which SQLite also takes natively as
named parameters (bound here from a dict), so no SQL is rewritten for either engine. Only the
table definitions differ, so a store's migrations are listed per engine.

Writes outside ``transaction()`` commit at once; inside it, together. SQLite has one
connection for the process, so a transaction holds it (other writes wait, reads do not).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Literal, Mapping, Protocol, Sequence

import aiosqlite

from nanobot.sqlite_file import StoreUnavailable, migrate, open_db

__all__ = ["Database", "Migrations", "Queries", "SqliteDatabase", "StoreUnavailable", "open_database"]

if TYPE_CHECKING:
    from nanobot.config import Config

Engine = Literal["sqlite", "postgresql"]

Migrations = Mapping[Engine, list[str]]  # per engine: SQL scripts, applied in order, each once
Row = Mapping[str, Any]  # aiosqlite.Row and asyncpg.Record both index by column name and number


class Queries(Protocol):
    """What a store runs: a connection, or a transaction on one."""

    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the number of rows it changed."""

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    async def fetchrow(self, sql: str, *args: Any) -> Row | None: ...

    async def fetchval(self, sql: str, *args: Any) -> Any: ...


class Database(Queries, Protocol):
    engine: Engine

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Queries]:
        """Statements that commit together, or not at all."""

    async def migrate(self, component: str, migrations: Migrations) -> None: ...

    async def make_durable(self) -> None:
        """What is committed survives a power cut too (SQLite: the WAL is synced)."""

    async def close(self) -> None: ...


def _named(args: Sequence[Any]) -> dict[str, Any]:
    return {str(number): value for number, value in enumerate(args, start=1)}


class _SqliteQueries:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    async def _run(self, sql: str, args: Sequence[Any]) -> int:
        cursor = await self.conn.execute(sql, _named(args))
        await cursor.close()
        return cursor.rowcount

    async def execute(self, sql: str, *args: Any) -> int:
        return await self._run(sql, args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.conn.executemany(sql, [_named(row) for row in rows])

    # Executed and read in one step on the connection's thread: a statement left half-read
    # across an await would make another task's COMMIT fail ("SQL statements in progress").
    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return list(await self.conn.execute_fetchall(sql, _named(args)))

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = await self.conn.execute_fetchall(sql, _named(args))
        return next(iter(rows), None)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]


class SqliteDatabase(_SqliteQueries):
    """``$NANOBOT_HOME/nanobot.db`` through one aiosqlite connection."""

    engine: Engine = "sqlite"

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        super().__init__(conn)
        self.path = path  # "" in memory
        self._writing = asyncio.Lock()  # one transaction at a time on the one connection

    @classmethod
    async def open(cls, path: Path | str) -> SqliteDatabase:
        return cls(await open_db(path), str(path) if str(path) != ":memory:" else "")

    async def execute(self, sql: str, *args: Any) -> int:
        async with self._writing:
            changed = await self._run(sql, args)
            await self.conn.commit()
            return changed

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        async with self._writing:
            await super().executemany(sql, rows)
            await self.conn.commit()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Queries]:
        async with self._writing:
            try:
                yield _SqliteQueries(self.conn)
                await self.conn.commit()
            except BaseException:
                await self.conn.rollback()
                raise

    async def migrate(self, component: str, migrations: Migrations) -> None:
        async with self._writing:  # its own BEGIN ... COMMIT must not meet another's transaction
            await migrate(self.conn, component, migrations["sqlite"])

    async def make_durable(self) -> None:
        await asyncio.to_thread(_sync_wal, self.path)

    async def close(self) -> None:
        await self.conn.close()


def _sync_wal(path: str) -> None:
    """synchronous=NORMAL (kept for speed) syncs the WAL only at checkpoints: sync it now."""
    if not path:
        return
    try:
        fd = os.open(f"{path}-wal", os.O_RDONLY)
    except FileNotFoundError:  # checkpointed away: the data is in the main file, synced by SQLite
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def open_database(config: Config) -> Database:
    """The configured engine: ``database.url`` PostgreSQL, else the home's SQLite file."""
    if config.database.engine == "postgresql":
        from nanobot.postgres import PostgresDatabase

        return await PostgresDatabase.open(config.database.url)
    return await SqliteDatabase.open(config.home / "nanobot.db")
