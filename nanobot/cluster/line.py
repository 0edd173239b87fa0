"""A worker's own connection to PostgreSQL, outside the pool.

It carries what must live exactly as long as the worker does: the advisory locks of the
singletons it holds, its ``LISTEN``, and its liveness: the other workers consider it alive
while this connection's backend exists (``pg_stat_activity``), so a killed process is seen as
dead at once, not after a timeout. TCP keepalives make the server drop the backend within
``gateway.failoverSeconds`` when the worker's host vanishes without closing the socket.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Callable

import asyncpg

from nanobot.postgres import CONNECT_TIMEOUT_S, CONNECTION_LOST, lock_key

log = logging.getLogger(__name__)

LISTEN = ("nanobot_work", "nanobot_done", "nanobot_free")  # see nanobot.cluster.router


def keepalive(failover: float) -> dict[str, str]:
    """TCP keepalives for the line, so that the server drops a vanished host's backend (and
    frees its singletons) within ``failover`` seconds: idle for half of it, then probes 1 s
    apart (failover 10: 5 s idle, 3 probes, about 8 s)."""
    idle = max(1, int(failover // 2))
    return {"tcp_keepalives_idle": str(idle), "tcp_keepalives_interval": "1",
            "tcp_keepalives_count": str(max(1, int(failover) - idle - 2))}

Notified = Callable[[str, str], None]  # (channel, payload)


class WorkerLine:
    def __init__(self, url: str, on_notify: Notified, failover: float) -> None:
        self.url = url
        self.on_notify = on_notify
        self.failover = failover
        self.lost = asyncio.Event()  # set when the connection is gone: every lock on it is gone too
        self.backend: tuple[int, datetime] | None = None  # (pid, start) of its server process
        self._conn: asyncpg.Connection | None = None
        self._busy = asyncio.Lock()  # one statement at a time on one connection

    async def open(self) -> None:
        conn = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT_S,
                                     server_settings={"application_name": "nanobot worker",
                                                                      **keepalive(self.failover)})
        self.lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: self.lost.set())
        for channel in LISTEN:
            await conn.add_listener(channel, self._notified)
        row = await conn.fetchrow("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        self.backend = (row["pid"], row["backend_start"])
        self._conn = conn

    def _notified(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        self.on_notify(channel, payload)

    async def try_lock(self, name: str, timeout: float) -> bool:
        """Take the advisory lock ``name`` if free. A line that does not answer within
        ``timeout`` counts as lost (a half-open connection would otherwise hang forever)."""
        return bool(await self._query("SELECT pg_try_advisory_lock($1)", lock_key(name), timeout=timeout))

    async def outsider(self, name: str, timeout: float) -> tuple[int, str, str] | None:
        """(pid, role, application) of a session that is no worker's line and holds the lock
        ``name`` (any role that may connect can take advisory locks), or None."""
        row = await self._query(
            "SELECT ARRAY[l.pid::text, coalesce(a.usename::text, '?'), coalesce(a.application_name, '')] "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
            "AND l.granted AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 "
            "AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.backend_pid = l.pid) LIMIT 1",
            lock_key(name), timeout=timeout)
        return (int(row[0]), row[1], row[2]) if row else None

    async def terminate(self, pid: int, timeout: float) -> bool:
        """End another session (its locks go with it); False where this role may not."""
        try:
            return bool(await self._query("SELECT pg_terminate_backend($1)", pid, timeout=timeout))
        except asyncpg.InsufficientPrivilegeError:
            return False

    async def unlock(self, name: str, timeout: float) -> None:
        await self._query("SELECT pg_advisory_unlock($1)", lock_key(name), timeout=timeout)

    async def _query(self, sql: str, *args: object, timeout: float) -> object:
        if self._conn is None or self.lost.is_set():
            raise ConnectionError("the worker's database connection is lost")
        conn = self._conn
        try:
            async with asyncio.timeout(timeout):
                async with self._busy:
                    return await conn.fetchval(sql, *args)
        except (*CONNECTION_LOST, asyncpg.PostgresError) as exc:
            if isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, CONNECTION_LOST) \
                    and not conn.is_closed():
                raise  # the statement failed, not the line
            self.lost.set()  # terminated by another worker (57P01), a server restart, a dead network...
            raise ConnectionError(f"the worker's database connection is lost: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), timeout=5)
            except Exception:
                conn.terminate()
        self.lost.set()
