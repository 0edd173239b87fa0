"""What workers trust is rows, not notifications or locks: a second role with no grants at all
(PostgreSQL lets every role that may connect NOTIFY and take advisory locks) tries to steer
the workers on the real server, and fails; a lock it holds is named in the log and status."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest

from nanobot.cluster.registry import worker_lines
from nanobot.postgres import PostgresDatabase, lock_key
from tests.fakes.openai_server import delayed
from tests.test_api import free_port
from tests.test_workers import echo, fast, worker_config, workers  # noqa: F401  (fixtures)


async def _role(server: str, name: str) -> None:
    admin = await asyncpg.connect(server)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", name):
            await admin.execute(f"CREATE ROLE {name} LOGIN")
    finally:
        await admin.close()


def as_role(url: str, role: str) -> str:
    return url.replace("postgres:@", f"{role}@", 1)


@pytest.fixture
async def mallory(pg_server: str, pg_url: str) -> str:
    """A role with no grants at all; PUBLIC may connect to the test database, as by default."""
    await _role(pg_server, "mallory")
    return as_role(pg_url, "mallory")


async def test_notifications_from_another_role_steer_nothing(llm, tg, pg_url: str, mallory: str, workspace: Path,
                                                             tmp_path: Path, fast,  # noqa: F811
                                                             caplog: pytest.LogCaptureFixture) -> None:
    import openai

    from nanobot.api.keys import ApiKeys

    caplog.set_level(logging.INFO)
    llm.fallback = lambda body: delayed(echo(body), 1.5)
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    for config in configs:
        config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with workers(configs, with_services=True) as gateways:
        key = await ApiKeys(gateways["w1"].runtime.db).add("ada", owner=True)
        clients = [openai.AsyncOpenAI(base_url=f"http://{c.gateway.api.listen}/v1", api_key=key, max_retries=0,
                                      timeout=20, default_headers={"X-Nanobot-Session": "s1"}) for c in configs]
        first = asyncio.create_task(clients[0].chat.completions.create(
            model="nanobot", messages=[{"role": "user", "content": "one"}]))
        await asyncio.wait_for(llm.request_event.wait(), 10)  # w1 holds the chat
        second = asyncio.create_task(clients[1].chat.completions.create(  # waits on w2 for w1's reply
            model="nanobot", messages=[{"role": "user", "content": "two"}]))
        await asyncio.sleep(0.3)
        intruder = await asyncpg.connect(mallory)
        try:
            for n in range(1, 200):
                await intruder.execute(f"NOTIFY nanobot_done, '{n}'")
            for n in range(300):
                await intruder.execute(f"NOTIFY nanobot_work, '{n} api:nobody:x{n}'")
            for junk in ("x", "", "12", " api:a", "9" * 40 + " telegram:1"):
                await intruder.execute(f"NOTIFY nanobot_work, '{junk}'")
        finally:
            await intruder.close()
        assert (await first).choices[0].message.content == "re: one"
        assert (await second).choices[0].message.content == "re: two"  # not "" on a forged wake-up
        leased = await gateways["w1"].runtime.db.fetchval("SELECT count(*) FROM chat_leases")
        assert leased <= 1  # the one real chat; none for chats without a message
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


async def test_a_lock_held_by_another_role_is_named_and_then_taken(llm, tg, pg_server: str, pg_url: str,
                                                                   mallory: str, workspace: Path, tmp_path: Path,
                                                                   fast, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    """The workers run as a role of their own that owns the database (as the README says), so
    they may not cut off another role's session: they say who holds the cron clock, in the log
    and in status, and take it once that session is gone."""
    await _role(pg_server, "nanobot_owner")
    admin = await asyncpg.connect(pg_server)
    database = pg_url.split("/")[3].split("?")[0]
    await admin.execute(f"ALTER DATABASE {database} OWNER TO nanobot_owner")
    await admin.close()
    caplog.set_level(logging.INFO)
    intruder = await asyncpg.connect(mallory, server_settings={"application_name": "psql"})
    assert await intruder.fetchval("SELECT pg_try_advisory_lock($1)", lock_key("cron clock"))
    config = worker_config(llm, workspace, tg, as_role(pg_url, "nanobot_owner"), "w1", tmp_path)
    async with workers([config], with_services=True) as gateways:
        gateway = gateways["w1"]
        db = gateway.runtime.db

        async def status() -> list[str]:
            return await worker_lines(db)

        for _ in range(100):
            if any("cron clock held by a session that is not a worker" in line for line in await status()):
                break
            await asyncio.sleep(0.1)
        lines = await status()
        assert any(f"cron clock held by a session that is not a worker: pid " in line and "role mallory" in line
                   for line in lines), lines
        assert any("every role may connect to this database" in line for line in lines)
        assert any("cron clock held by a session that is not a worker" in r.getMessage() and "mallory" in r.getMessage()
                   for r in caplog.records)
        assert "cron clock" not in gateway.cluster.singletons.held
        await intruder.close()
        for _ in range(100):
            if "cron clock" in gateway.cluster.singletons.held:
                break
            await asyncio.sleep(0.1)
        assert "cron clock" in gateway.cluster.singletons.held
        await db.execute(f"REVOKE CONNECT ON DATABASE {database} FROM PUBLIC")
        for _ in range(50):
            if not any("not a worker" in line for line in await status()):
                break
            await asyncio.sleep(0.1)
        lines = await status()
        assert not any("not a worker" in line or "every role may connect" in line for line in lines), lines
