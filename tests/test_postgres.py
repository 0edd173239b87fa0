"""PostgreSQL as the second store engine: database.url, the pool, migrations (real server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nanobot import logs
from nanobot.config import ConfigError, load_config
from nanobot.db import HomeError
from nanobot.postgres import PostgresDatabase, migrate, open_pool
from nanobot.runtime import Runtime
from tests.fakes.openai_server import reply
from tests.helpers import config_for, running_gateway, telegram_gateway_config

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


# ---------------------------------------------------------------- every piece of state in it

async def test_a_chat_lives_in_postgresql_across_restarts(pg_url: str, llm, workspace: Path, home: Path) -> None:
    """With database.url PostgreSQL the history, usage and settings are rows there: a new
    process (another worker) continues the chat, and the home holds no database or JSONL."""
    config = config_for(llm.base_url, workspace, mode="tools")
    config.database.url = pg_url
    llm.script(reply("hello Ada"), reply("you are Ada"))
    async with Runtime(config) as rt:
        assert await rt.agent.handle("telegram:5", "/mode code") == "Mode set to code for this chat."
        assert await rt.agent.handle("telegram:5", "I am Ada", mode="tools") == "hello Ada"
    async with Runtime(config) as rt:
        assert rt.agent.mode_name(await rt.sessions.open("telegram:5")) == "code"
        assert await rt.agent.handle("telegram:5", "who am I?", mode="tools") == "you are Ada"
        records = await rt.sessions.records("telegram:5")
        totals = await rt.usage.totals()
    sent = [m["content"] for m in llm.chat_requests[1]["messages"][1:]]
    assert sent == ["I am Ada", "hello Ada", "who am I?"]
    assert records[0]["_meta"]["key"] == "telegram:5" and records[-1]["content"] == "you are Ada"
    assert totals["tools"].model_calls == 2
    assert not (home / "nanobot.db").exists() and not (home / "sessions").exists()


async def test_the_gateway_runs_on_postgresql_end_to_end(pg_url: str, llm, tg, workspace: Path) -> None:
    """Telegram in, the durable intake and outbox in PostgreSQL, the reply out."""
    config = telegram_gateway_config(llm.base_url, workspace, tg, 42)
    config.channels.telegram.streaming = False
    config.database.url = pg_url
    llm.fallback = lambda body: reply("re: " + body["messages"][-1]["content"])
    async with running_gateway(config):
        for text in ("one", "two", "three"):
            tg.push_text(42, 42, text)
        await tg.wait_sent(3)
    assert [m["text"] for m in tg.sent if m["chat_id"] == 42] == ["re: one", "re: two", "re: three"]
    db = await PostgresDatabase.open(pg_url)
    try:
        assert await db.fetchval("SELECT count(*) FROM inbound WHERE done = 1") == 3
        assert [r[0] for r in await db.fetch("SELECT state FROM outbox ORDER BY id")] == ["sent"] * 3
    finally:
        await db.close()
