"""PostgreSQL as the second store engine: database.url, the pool, migrations (real server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nanobot import logs
from nanobot.config import ConfigError, load_config
from nanobot.db import HomeError
from nanobot.postgres import migrate, open_pool

STEPS = ["CREATE TABLE notes (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL);",
         "ALTER TABLE notes ADD COLUMN created DOUBLE PRECISION;"]


async def test_workers_starting_at_once_migrate_exactly_once(pg_url: str) -> None:
    pools = [await open_pool(pg_url, max_size=2) for _ in range(4)]
    try:
        await asyncio.gather(*(migrate(pool, "notes", STEPS) for pool in pools))
        await migrate(pools[0], "notes", STEPS)  # again: nothing to do
        async with pools[0].acquire() as conn:
            assert await conn.fetchval("SELECT version FROM schema_versions WHERE component = 'notes'") == 2
            await conn.execute("INSERT INTO notes (body, created) VALUES ('x', 1.5)")
    finally:
        await asyncio.gather(*(pool.close() for pool in pools))


async def test_a_database_from_a_newer_nanobot_is_refused(pg_url: str) -> None:
    pool = await open_pool(pg_url)
    try:
        await migrate(pool, "notes", STEPS)
        with pytest.raises(HomeError, match="schema version 2, newer than this nanobot knows \\(1\\)"):
            await migrate(pool, "notes", STEPS[:1])
    finally:
        await pool.close()


@pytest.mark.parametrize("url, shown", [
    ("postgresql://bob:CANARY-pw-1@127.0.0.1:1/nanobot", "127.0.0.1:1, database nanobot"),
    ("postgresql://bob:CANARY-pw-1@/nanobot?host=/nonexistent-socket-dir", "the socket in /nonexistent-socket-dir"),
])
async def test_an_unreachable_server_is_one_line_without_the_password(url: str, shown: str) -> None:
    with pytest.raises(HomeError) as caught:
        await open_pool(url)
    message = str(caught.value)
    assert message.startswith("database.url: cannot use PostgreSQL at " + shown) and "\n" not in message
    assert "CANARY" not in message


def test_an_unknown_database_scheme_names_the_key_and_hides_the_password(home: Path) -> None:
    (home / "config.json").write_text('{"database": {"url": "mysql://bob:CANARY-pw-2@db/nanobot"}}')
    with pytest.raises(ConfigError, match=r"config.json: invalid value for 'database.url'") as caught:
        load_config()
    assert "CANARY" not in str(caught.value) and "postgresql://USER:PASSWORD@HOST" in str(caught.value)


def test_the_url_may_come_from_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_DATABASE__URL", "sqlite3:///x.db")
    with pytest.raises(ConfigError, match="environment variable NANOBOT_DATABASE__URL: invalid value for "
                                          "'database.url'"):
        load_config()
    monkeypatch.setenv("NANOBOT_DATABASE__URL", "postgresql://bob:CANARY-pw-3@db.example:5432/nanobot")
    config, _ = load_config()
    assert config.database.engine == "postgresql"


def test_the_database_password_never_reaches_a_log(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_DATABASE__URL", "postgresql://bob:CANARY-pw-4@db.example/nanobot")
    logs.remember_secrets(load_config()[0])
    assert logs.redact("connecting with CANARY-pw-4") == "connecting with ***"
