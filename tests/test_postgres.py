"""PostgreSQL as the second store engine: database.url, the pool, migrations (real server)."""

from __future__ import annotations

from urllib.parse import urlsplit

import asyncio
import json
from pathlib import Path

import pytest

from nanobot import logs
from nanobot.api.keys import ApiKeys
from nanobot.config import ConfigError, load_config
from nanobot.cron.store import CronStore
from nanobot.sqlite_file import HomeError
from nanobot.postgres import PostgresDatabase, migrate, open_pool
from nanobot.runtime import open_runtime
from nanobot.tasks import TaskStore
from nanobot.usage import UsageStore
from tests.fakes.openai_server import reply
from tests.helpers import config_for, running_gateway, telegram_gateway_config, until
from tests.test_cli import nanobot, write_config

STEPS = ["CREATE TABLE notes (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL);",
         "ALTER TABLE notes ADD COLUMN created DOUBLE PRECISION;"]


async def test_workers_starting_at_once_migrate_exactly_once(pg_url: str) -> None:
    pools = await asyncio.gather(*(open_pool(pg_url, max_size=2) for _ in range(4)))  # at once: no race
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
    monkeypatch.setenv("NANOBOT_DATABASE__URL", "postgresql://bob:CANARY-pw-3@db.example:5432/nanobot?sslmode=verify-full")
    config, _ = load_config()
    assert config.database.engine == "postgresql"


def test_the_database_password_never_reaches_a_log(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_DATABASE__URL", "postgresql://bob:CANARY-pw-4@db.example/nanobot?sslmode=require")
    logs.remember_secrets(load_config()[0])
    assert logs.redact("connecting with CANARY-pw-4") == "connecting with ***"


# ---------------------------------------------------------------- every piece of state in it

async def test_a_chat_lives_in_postgresql_across_restarts(pg_url: str, llm, workspace: Path, home: Path) -> None:
    """With database.url PostgreSQL the history, usage and settings are rows there: a new
    process (another worker) continues the chat, and the home holds no database or JSONL."""
    config = config_for(llm.base_url, workspace, mode="tools")
    config.database.url = pg_url
    llm.script(reply("hello Ada"), reply("you are Ada"))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("telegram:5", "/mode code") == "Mode set to code for this chat."
        assert await rt.agent.handle("telegram:5", "I am Ada", mode="tools") == "hello Ada"
    async with open_runtime(config) as rt:
        assert rt.agent.mode_name(await rt.sessions.open("telegram:5")) == "code"
        assert await rt.agent.handle("telegram:5", "who am I?", mode="tools") == "you are Ada"
        records = await rt.sessions.records("telegram:5")
        totals = await rt.usage.totals()
    sent = [m["content"] for m in llm.chat_requests[1]["messages"][1:]]
    assert sent == ["I am Ada", "hello Ada", "who am I?"]
    assert records[0]["_meta"]["key"] == "telegram:5" and records[-1]["content"] == "you are Ada"
    assert totals["tools"].model_calls == 2
    assert not (home / "nanobot.db").exists() and not (home / "sessions").exists()


async def test_a_task_result_counts_as_answered_only_once_its_history_record_is_in(
        pg_url: str, llm, workspace: Path, home: Path) -> None:
    """A background task's result (or a job's output kept for a reader) comes in as a message;
    its answer settles that message, after which it never runs again. The history record has to
    be in first, as a turn's records are before its reply: a crash between the two lost it."""
    from nanobot.agent.loop import Origin, TurnRequest
    from nanobot.bus import Identity
    from tests.test_workers import history_locked

    config = config_for(llm.base_url, workspace, mode="tools")
    config.database.url = pg_url
    async with open_runtime(config) as rt:
        await rt.sessions.open("telegram:5")
        async with history_locked(pg_url) as locker:
            answering = asyncio.create_task(rt.agent.answer(TurnRequest(
                "telegram:5", "RESULT of the task", origin=Origin(Identity("task-result:t1"), source="task"))))
            await until(lambda: locker.fetchval("SELECT count(*) FROM pg_locks WHERE relation = 'history'::regclass "
                                                "AND NOT granted"))  # its record is on its way
            assert not answering.done()
        assert await answering == "RESULT of the task"
        assert (await rt.sessions.records("telegram:5"))[-1]["content"] == "RESULT of the task"


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


# ------------------------------------------------------------------ a home moved into it

async def test_a_home_moves_into_postgresql_and_the_chat_goes_on(pg_url: str, llm, workspace: Path,
                                                                  home: Path) -> None:
    write_config(home, workspace, llm.base_url)
    llm.script(reply("noted: tea"), reply("```python\nx = 41\nprint('kept')\n```"), reply("done"),
               reply("tea, and x is 42"))
    async with open_runtime(load_config()[0]) as rt:  # a week of use in the embedded store
        await rt.agent.handle("telegram:5", "I like tea")
        await rt.agent.handle("telegram:5", "remember x", mode="code")
        await rt.pairing.request("discord", "77", "zed")
        await (await ApiKeys.open(rt.db)).add("phone")
        await (await CronStore.open(rt.db)).add(name="n", owner_session="telegram:5", schedule_kind="every", expression="3600",
                                   timezone="UTC", payload_kind="code", payload="print(1)")
        task = await (await TaskStore.open(rt.db)).add("telegram:5", "sum the receipts", "receipts")
        # as an older nanobot left it: its pairing tables are of version 2 (no owner chats yet)
        await rt.db.execute("DROP TABLE owner_chats")
        await rt.db.execute("UPDATE schema_versions SET version = 2 WHERE component = 'pairing'")
    code, out, err = await nanobot("db", "migrate", "--to", pg_url, home=home)
    assert code == 0, err
    assert "owner_chats: 0 in the home, 0 in PostgreSQL" in out
    for line in ("model_calls: 3 in the home, 3 in PostgreSQL", "cron_jobs: 1 in the home, 1 in PostgreSQL",
                 "code_state: 1 in the home, 1 in PostgreSQL", "pairing_requests: 1 in the home, 1 in PostgreSQL",
                 "api_keys: 1 in the home, 1 in PostgreSQL", "tasks: 1 in the home, 1 in PostgreSQL"):
        assert line in out, out
    again = await nanobot("db", "migrate", "--to", pg_url, home=home)  # harmless: nothing copied twice
    assert again[0] == 0 and "history (records): " in again[1] and "Nothing to copy" in again[1]
    exported_home = await nanobot("history", "export", "telegram:5", home=home)
    config = load_config()[0]
    config.database.url = pg_url
    async with open_runtime(config) as rt:
        records = await rt.sessions.records("telegram:5")
        assert [j.name for j in await CronStore(rt.db).list()] == ["n"]
        assert (await TaskStore(rt.db).get(task.id)).task == "sum the receipts"  # type: ignore[union-attr]
        assert [r.sender_id for r in await rt.pairing.pending()] == ["77"]
        assert sum(t.model_calls for t in (await rt.usage.totals()).values()) == 3  # counted as they were copied
        assert await rt.agent.handle("telegram:5", "what do I like? and x+1?", mode="code") == "tea, and x is 42"
    assert exported_home[1].splitlines() == [json.dumps(r, ensure_ascii=False) for r in records]
    asked = [m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] == "user"]
    assert asked[0] == "I like tea"  # the history came along
    db = await PostgresDatabase.open(pg_url)
    try:  # and the chat's Python state (x = 41), as the sandbox dumped it
        assert await db.fetchval("SELECT length(state) FROM code_state WHERE session_key = 'telegram:5'") > 0
    finally:
        await db.close()


async def test_history_export_from_postgresql(pg_url: str, llm, workspace: Path, home: Path, tmp_path: Path) -> None:
    write_config(home, workspace, llm.base_url)
    config = load_config()[0]
    config.database.url = pg_url
    llm.script(reply("hi"))
    async with open_runtime(config) as rt:
        await rt.agent.handle("telegram:8", "hello")
    env = {"NANOBOT_DATABASE__URL": pg_url}
    code, _, err = await nanobot("history", "export", "telegram:8", "--out", str(tmp_path / "h.jsonl"), home=home, env=env)
    assert code == 0 and "Wrote 3 records" in err
    lines = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [m.get("content") for m in lines[1:]] == ["hello", "hi"]
    assert (await nanobot("history", "export", "telegram:9", home=home, env=env))[0] == 1
    assert (await nanobot("history", "list", home=home, env=env))[1] == "telegram:8\n"


async def test_a_count_that_does_not_match_copies_nothing(pg_url: str, llm, workspace: Path, home: Path) -> None:
    write_config(home, workspace, llm.base_url)
    llm.script(reply("hi"))
    async with open_runtime(load_config()[0]) as rt:
        await rt.agent.handle("telegram:5", "hello")
    db = await PostgresDatabase.open(pg_url)
    try:
        usage = await UsageStore.create(db)  # the target already holds calls the home does not know
        for _ in range(2):
            await usage.record_call("telegram:9", "tools", "m", 1, 1)
        code, _, err = await nanobot("db", "migrate", "--to", pg_url, home=home)
        assert code == 1 and "model_calls: 1 in the home, 2 in PostgreSQL" in err
        assert await db.fetchval("SELECT count(*) FROM history") == 0  # nothing left half-done
    finally:
        await db.close()


async def test_a_second_worker_with_the_same_id_is_refused_and_status_lists_the_workers(
        pg_url: str, tmp_path: Path, home: Path, llm, workspace: Path) -> None:
    """Every gateway on one database is a worker; two with one gateway.workerId would take
    each other's chats, so the second refuses in one line (exit 2). Status lists the workers."""
    config = config_for(llm.base_url, workspace)
    config.database.url, config.gateway.worker_id = pg_url, "w1"
    config.gateway.heartbeat.enabled = False
    async with running_gateway(config, with_services=True):
        other_home = tmp_path / "other-home"
        other_home.mkdir()
        (other_home / "config.json").write_text(json.dumps({
            "database": {"url": pg_url}, "gateway": {"heartbeat": {"enabled": False}, "workerId": "w1"},
            "agents": {"defaults": {"workspace": str(workspace)}},  # the assistant's one workspace
            "providers": {"openai": {"apiKey": "k", "apiBase": "http://127.0.0.1:9/v1"}}}))
        code, _, err = await nanobot("gateway", home=other_home)
        assert code == 2 and "gateway.workerId: 'w1' is the id of a running worker" in err, err
        code, out, _ = await nanobot("status", home=other_home)
        assert code == 0 and "Workers:   1 alive" in out, out
        [line] = [line for line in out.splitlines() if line.startswith("  w1 (host ")]
        assert "0 chat(s); holds cron clock, delivery pruner, pairing welcome; heartbeat " in line, out


async def _outage(server: str, url: str, *, away: bool) -> None:
    """The database refuses connections and drops the ones it has (a server restarting, say)."""
    import asyncpg

    name = urlsplit(url).path.lstrip("/")
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS {'false' if away else 'true'}")
        if away:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
    finally:
        await admin.close()


async def test_a_database_that_goes_away_loses_nothing(pg_server: str, pg_url: str, llm, tg, workspace: Path,
                                                       home: Path) -> None:
    """While PostgreSQL is away a message waits unconfirmed at Telegram and nothing is
    answered; once it is back the message is recorded, answered, and the chat goes on."""
    config = telegram_gateway_config(llm.base_url, workspace, tg, 42)
    config.channels.telegram.streaming = False
    config.database.url = pg_url
    llm.fallback = lambda body: reply("re: " + body["messages"][-1]["content"])
    async with running_gateway(config):
        tg.push_text(42, 42, "before")
        await tg.wait_sent(1)
        await _outage(pg_server, pg_url, away=True)
        tg.push_text(42, 42, "during")
        # status, in another process, meanwhile (the gateway has the message in hand by then)
        code, out, _ = await nanobot("status", home=home, env={"NANOBOT_DATABASE__URL": pg_url})
        assert code == 1 and "UNREACHABLE" in out
        assert len(llm.chat_requests) == 1 and len(tg.sent) == 1
        await _outage(pg_server, pg_url, away=False)
        await tg.wait_sent(2)
        tg.push_text(42, 42, "after")
        await tg.wait_sent(3)
    assert [m["text"] for m in tg.sent] == ["re: before", "re: during", "re: after"]
    db = await PostgresDatabase.open(pg_url)
    try:
        records = [json.loads(r[0]) for r in await db.fetch("SELECT record FROM history ORDER BY id")]
        assert [r["content"] for r in records if r.get("role") == "user"] == ["before", "during", "after"]
    finally:
        await db.close()


@pytest.mark.parametrize("inside", ["statement", "transaction"])
async def test_a_statement_cancelled_as_the_server_closes_its_connection_stays_cancelled(
        pg_url: str, inside: str) -> None:
    """A worker that loses its database cancels its turns, and in a restart the server closes the
    connections at the same instant. asyncpg gives a connection back to its pool in a task of
    its own; when the close lands before that task runs, asyncpg raised its InternalClientError
    over the cancel, and the turn was told to the user as failed. The close is made here at that
    instant: by aborting the connection's transport, as the event loop does when the server
    closes it."""
    db = await PostgresDatabase.open(pg_url)
    try:
        async def long_statement() -> None:
            if inside == "statement":
                await db.execute("SELECT pg_sleep(60)")
            else:
                async with db.transaction() as tx:
                    await tx.execute("SELECT pg_sleep(60)")

        task = asyncio.create_task(long_statement())
        while not await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                    "AND query LIKE 'SELECT pg_sleep(60)%'"):
            await asyncio.sleep(0.02)
        [busy] = [h for h in db.pool._holders if h._in_use is not None]  # asyncpg's, the statement's
        task.cancel()
        busy._con._transport.abort()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await db.fetchval("SELECT 1") == 1  # and the pool goes on
    finally:
        await db.close()


async def test_a_reply_sent_while_its_mark_failed_is_not_sent_again_after_a_restart(
        pg_url: str, llm, tg, workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A batch of "sent" marks that fails with an error that is not a lost connection (here a
    lock timeout; in a restart, asyncpg's own errors) keeps its marks for the next batch of marks.
    The next batch of any other write cleared them unwritten: the reply stayed 'pending', and the
    next start sent it again."""
    import asyncpg

    admin = await asyncpg.connect(pg_url)
    await admin.execute(f"ALTER DATABASE {urlsplit(pg_url).path.lstrip('/')} SET lock_timeout = '200ms'")
    config = telegram_gateway_config(llm.base_url, workspace, tg, 42)
    config.channels.telegram.streaming = False
    config.database.url = pg_url
    llm.fallback = lambda body: reply("re: " + body["messages"][-1]["content"])
    try:
        async with running_gateway(config):
            answered = tg.hold("sendMessage")
            tg.push_text(42, 42, "one")
            await tg.wait_until(lambda: len(tg.sent) == 1)  # sent; Telegram's answer held back
            async with admin.transaction():
                await admin.execute("LOCK TABLE outbox IN SHARE MODE")  # the mark waits, and times out
                answered.set()
                while not any("a write failed" in r.getMessage() for r in caplog.records):
                    await asyncio.sleep(0.02)
            tg.push_text(42, 42, "two")
            await tg.wait_sent(2)
        async with running_gateway(config):
            tg.push_text(42, 42, "three")
            await tg.wait_sent(3)
            await asyncio.sleep(0.5)  # a repeat would come now
    finally:
        await admin.close()
    assert [m["text"] for m in tg.sent] == ["re: one", "re: two", "re: three"]


async def test_a_turn_whose_history_read_loses_its_connection_waits_and_answers(
        pg_url: str, llm, tg, workspace: Path) -> None:
    """A chat's history is read before its message is handed on, and by the turn. When that read
    lost its connection (a restart), the message was left unqueued while the worker held its chat
    (here), or the turn failed and told the user "something went wrong" (seen under load). The
    read waits for the database, as the message and the reply do. It is held back here by a lock
    on the table, and its connection cut then."""
    from tests.test_workers import history_locked

    config = telegram_gateway_config(llm.base_url, workspace, tg, 42)
    config.channels.telegram.streaming = False
    config.database.url = pg_url
    llm.fallback = lambda body: reply("re: " + body["messages"][-1]["content"])
    async with running_gateway(config):
        async with history_locked(pg_url) as locker:
            tg.push_text(42, 42, "hello")
            while not (reading := await locker.fetchval(
                    "SELECT pid FROM pg_locks WHERE relation = 'history'::regclass AND NOT granted")):
                await asyncio.sleep(0.02)
            await locker.execute("SELECT pg_terminate_backend($1)", reading)
        await tg.wait_sent(1)
    assert [m["text"] for m in tg.sent] == ["re: hello"]


async def test_a_migration_refuses_a_running_gateway_and_offers_a_way_forward(pg_url: str, llm, workspace: Path,
                                                                             home: Path) -> None:
    """While the home's gateway runs it refuses in one line; when PostgreSQL holds rows the home
    does not (a copy made while a gateway still wrote), the message says --replace, which works."""
    from tests.helpers import nanobot_process

    write_config(home, workspace, llm.base_url)
    llm.script(reply("one"))
    async with open_runtime(load_config()[0]) as rt:
        await rt.agent.handle("telegram:5", "first")
    async with nanobot_process("gateway", home=home):
        for _ in range(200):
            if (home / "api.sock").exists():
                break
            await asyncio.sleep(0.05)
        code, out, err = await nanobot("db", "migrate", "--to", pg_url, home=home)
    assert code == 1 and "a gateway is running on" in err and "stop it first" in err and len(err.splitlines()) == 1
    assert (await nanobot("db", "migrate", "--to", pg_url, home=home))[0] == 0
    db = await PostgresDatabase.open(pg_url)
    try:  # what a gateway wrote there after the copy
        await db.execute("INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, "
                         "completion_tokens) VALUES (0, 'telegram:5', 'tools', 'turn', 'm', 1, 1)")
    finally:
        await db.close()
    code, out, err = await nanobot("db", "migrate", "--to", pg_url, home=home)
    assert code == 1 and "model_calls: 1 in the home, 2 in PostgreSQL" in err and "--replace" in err
    code, out, err = await nanobot("db", "migrate", "--to", pg_url, "--replace", home=home)
    assert code == 0 and "model_calls: 1 in the home, 1 in PostgreSQL" in out, err
    db = await PostgresDatabase.open(pg_url)
    try:  # the running totals went with the rows they counted, and count the copy once
        assert (await UsageStore(db).totals())["tools"].model_calls == 1
    finally:
        await db.close()
