"""PostgreSQL through asyncpg: the connection pool for ``database.url`` and schema migrations.

The counterpart of sqlite_file.py for the second store engine. Errors come out as one line naming the
key and where it points (host and port, or the socket folder), never the password. Several
workers may start at once against one database: migrations take a transaction-scoped advisory
lock, so one applies them and the others find them done. A database migrated by a newer
nanobot is refused rather than misread.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Any, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit

import asyncpg

from nanobot.eventloop import raise_cancel_under
from nanobot.sqlite_file import HomeError, StoreUnavailable, schema_too_new

SCHEMA_VERSIONS = ("CREATE TABLE IF NOT EXISTS schema_versions "
                   "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)")
CONNECT_TIMEOUT_S = 10.0


def where(url: str) -> str:
    """Where a URL points, for messages: ``host:port/db`` or ``socket /dir, db`` (no credentials)."""
    parts = urlsplit(url)
    socket_dir = parse_qs(parts.query).get("host", [""])[0]
    database = parts.path.lstrip("/") or "(default database)"
    if socket_dir.startswith("/") or not parts.hostname:
        return f"the socket in {socket_dir or '(the default folder)'}, database {database}"
    return f"{parts.hostname}:{parts.port or 5432}, database {database}"


async def open_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool for ``database.url``, checked with one query; HomeError in one line when the server
    cannot be reached or refuses us."""
    try:
        pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, timeout=CONNECT_TIMEOUT_S,
                                         reset=_keep_session)
        async with pool.acquire() as conn, conn.transaction():
            # Under the migrations' lock: workers starting at once would otherwise race to create
            # it ("IF NOT EXISTS" is not safe against a concurrent CREATE: a unique violation).
            await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key("schema versions"))
            await conn.execute(SCHEMA_VERSIONS)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        raise HomeError(f"database.url: cannot use PostgreSQL at {where(url)}: {_reason(exc)}") from None
    return pool


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What the pool does to a connection given back, after asyncpg rolls back an open
    transaction: nothing more. Its default (RESET ALL, UNLISTEN *, unlock all...) is a round trip
    per statement outside a transaction (a tenth of a worker's time under load), and the
    stores never change session state: locks and LISTEN live on the workers' own line."""
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def migrate(pool: asyncpg.Pool, component: str, migrations: list[str]) -> None:
    """Apply ``migrations[v:]`` (SQL scripts) where v is the component's recorded version, each in
    one transaction with its version, under an advisory lock held until it commits."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(f"schema {component}"))
        current = await conn.fetchval("SELECT version FROM schema_versions WHERE component = $1", component) or 0
        if current > len(migrations):
            raise schema_too_new(component, current, len(migrations))
        for version, script in enumerate(migrations[current:], start=current + 1):
            await conn.execute(script)
            await conn.execute("INSERT INTO schema_versions (component, version) VALUES ($1, $2) "
                               "ON CONFLICT (component) DO UPDATE SET version = excluded.version", component, version)


def lock_key(name: str) -> int:
    """A stable advisory lock number per name (Python's hash() changes per process)."""
    return zlib.crc32(f"nanobot {name}".encode()) | (1 << 40)


# Failures of the connection, not of the statement: the server is down, restarting, or gone.
# InternalClientError: a pooled connection asyncpg left mid-operation as the server restarted
# ("cannot switch to state 15; another operation is in progress", at BEGIN): a write failed so
# was a reply sent unrecorded, past the check that its worker still holds the chat.
CONNECTION_LOST = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                   asyncpg.AdminShutdownError, asyncpg.CannotConnectNowError, asyncpg.InternalClientError)


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"PostgreSQL cannot be reached: {_reason(exc)}")


class _PostgresQueries:
    """The Queries of database.py on a pool (each statement commits) or on one connection. A
    lost connection, or one that cannot be had, is StoreUnavailable: callers wait and retry."""

    def __init__(self, target: asyncpg.Pool | asyncpg.Connection) -> None:
        self.target = target

    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """A failure of the connection (not of the statement) becomes StoreUnavailable."""
        try:
            yield
        except Exception as exc:
            # When the server closes the connection (a restart) as a statement is cancelled,
            # asyncpg raises over the cancel: its pool finds the connection given back already
            # (InternalClientError), or a transaction's rollback finds it closed.
            raise_cancel_under(exc)
            refused = isinstance(exc, asyncpg.PostgresError) and isinstance(self.target, asyncpg.Pool) \
                and _refused_at_connect(exc)
            if isinstance(exc, CONNECTION_LOST) or refused:
                raise _unavailable(exc) from None
            raise

    async def execute(self, sql: str, *args: Any) -> int:
        with self._reachable():
            status = await self.target.execute(sql, *args)  # e.g. "UPDATE 3", "INSERT 0 1"
        count = status.rsplit(" ", 1)[-1]
        return int(count) if count.isdigit() else 0

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._reachable():
            await self.target.executemany(sql, list(rows))

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        with self._reachable():
            return list(await self.target.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        with self._reachable():
            return await self.target.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        with self._reachable():
            return await self.target.fetchval(sql, *args)

def _refused_at_connect(exc: asyncpg.PostgresError) -> bool:
    """The server refused a new connection (the database does not accept connections now, too
    many clients): a statement never ran."""
    return exc.sqlstate in ("55000", "53300", "57P03", "3D000", "28000")


class PostgresDatabase(_PostgresQueries):
    """``database.url``: a pool shared by the process's stores."""

    engine = "postgresql"

    def __init__(self, pool: asyncpg.Pool, url: str) -> None:
        super().__init__(pool)
        self.pool, self.url = pool, url

    @classmethod
    async def open(cls, url: str) -> PostgresDatabase:
        return cls(await open_pool(url), url)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_PostgresQueries]:
        try:
            conn = await self.pool.acquire()
        except (*CONNECTION_LOST, asyncpg.PostgresError) as exc:
            raise _unavailable(exc) from None
        try:
            async with conn.transaction():
                yield _PostgresQueries(conn)
        except CONNECTION_LOST as exc:  # at BEGIN or COMMIT
            raise_cancel_under(exc)  # see _reachable
            raise _unavailable(exc) from None
        finally:
            with self._reachable():
                await self.pool.release(conn)

    async def migrate(self, component: str, migrations: Mapping[str, list[str]]) -> None:
        await migrate(self.pool, component, migrations["postgresql"])

    async def make_durable(self) -> None:
        return None  # a commit is durable already (synchronous_commit is on)

    async def close(self) -> None:
        await self.pool.close()
