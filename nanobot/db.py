"""The SQLite database (``$NANOBOT_HOME/nanobot.db``) through aiosqlite.

Each store owns its tables and lists its own migrations; ``migrate`` applies the ones a
database has not seen yet, recorded per component in ``schema_versions``. WAL mode lets the
CLI and a running gateway use the same file at once.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiosqlite

from nanobot.config import private_dir


async def open_db(path: Path | str) -> aiosqlite.Connection:
    if str(path) != ":memory:":
        private_dir(Path(path).parent)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite's -wal/-shm files copy this mode
        os.chmod(path, 0o600)
    conn = await aiosqlite.connect(str(path), timeout=10)
    conn.row_factory = aiosqlite.Row
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=NORMAL")
    await conn.execute("PRAGMA busy_timeout=10000")
    await conn.execute("CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)")
    await conn.commit()
    return conn


async def migrate(conn: aiosqlite.Connection, component: str, migrations: list[str]) -> None:
    """Apply ``migrations[v:]`` where v is the component's recorded version; each item is a SQL script."""
    async with conn.execute("SELECT version FROM schema_versions WHERE component = ?", (component,)) as cur:
        row = await cur.fetchone()
    current = row[0] if row else 0
    if current > len(migrations):
        raise RuntimeError(f"{component}: database schema v{current} is newer than this nanobot (v{len(migrations)})")
    for version, script in enumerate(migrations[current:], start=current + 1):
        await conn.executescript(script)
        await conn.execute("INSERT INTO schema_versions (component, version) VALUES (?, ?) "
                           "ON CONFLICT(component) DO UPDATE SET version = excluded.version", (component, version))
    await conn.commit()
