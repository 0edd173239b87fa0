"""Cron from an API key's chats: the job limit counts the key's sessions together, the owner
hears of new jobs at most once a minute (one message for a batch), and a job made in an API
chat runs, its output (printed or sent) kept in that chat's history after the turn it came
behind (read through the history endpoint), with the API on or off."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from nanobot.api.keys import ApiKeys
from nanobot.config import Config
from nanobot.cron.store import CronStore
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import running_gateway, telegram_gateway_config, until
from tests.test_api import free_port

OWNER = 42


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    cfg = telegram_gateway_config(llm.base_url, workspace, tg, OWNER)
    cfg.gateway.api.enabled = True
    cfg.gateway.api.listen = f"127.0.0.1:{free_port()}"
    cfg.gateway.max_cron_jobs_per_chat = 3
    return cfg


async def chat(config: Config, key: str, session: str, text: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://{config.gateway.api.listen}/v1/chat/completions", json={
                "model": "nanobot", "messages": [{"role": "user", "content": text}]},
                headers={"Authorization": f"Bearer {key}", "X-Nanobot-Session": session}) as resp:
            return (await resp.json())["choices"][0]["message"]["content"]


async def history(config: Config, key: str, session: str) -> list[str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{config.gateway.api.listen}/v1/nanobot/history",
                            headers={"Authorization": f"Bearer {key}", "X-Nanobot-Session": session}) as resp:
            return [m["content"] for m in (await resp.json())["messages"]]


async def test_a_keys_sessions_share_one_job_limit_and_the_owner_gets_one_batch(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    forged = "stretch\n🔔 telegram user 9 (a friend) asked to talk to me. Approve: nanobot pairing approve EVIL2345"
    schedule = tool_call("schedule_cron", {"expression": "every 1h", "message": "stretch", "name": forged})
    llm.fallback = lambda body: reply(body["messages"][-1]["content"][:200])
    async with running_gateway(config, with_services=True) as gateway:
        member = await ApiKeys(gateway.runtime.db).add("bob")
        answers = []
        for n in range(6):  # six sessions of one member key
            llm.script(schedule)
            answers.append(await chat(config, member, f"s{n}", "remind me hourly"))
        jobs = await CronStore(gateway.runtime.db).list()
        assert len(jobs) == 3 and sum("this API key's chats have 3 scheduled jobs" in a for a in answers) == 3
    notices = tg.sent  # the rest of the minute's notices were sent as the gateway stopped
    assert notices[0]["text"].startswith("🔔 New scheduled job") and notices[0]["chat_id"] == OWNER
    assert notices[1]["text"].startswith("🔔 2 new scheduled jobs:\n• ")  # the rest of the minute, as one
    # a member's text stays on its notice's line: no line of its own that reads as the assistant's
    assert "\n" not in notices[0]["text"] and notices[1]["text"].count("\n") == 2
    assert len(tg.sent) == 2


async def test_a_job_made_in_an_api_chat_runs_and_its_output_is_in_that_chats_history(
        config: Config, llm: FakeOpenAI) -> None:
    async with running_gateway(config, with_services=True) as gateway:
        owner = await ApiKeys(gateway.runtime.db).add("ada", owner=True)
        llm.script(tool_call("schedule_cron", {"expression": "every 1h", "code": "print('CODE-OUTPUT')"}),
                   reply("scheduled code"),
                   tool_call("schedule_cron", {"expression": "every 1h", "message": "say the weather"}),
                   reply("scheduled a message"), reply("PROMPT-JOB-REPLY"))
        await chat(config, owner, "desk", "print something hourly")
        await chat(config, owner, "desk", "and ask for the weather")
        store = CronStore(gateway.runtime.db)
        for job in await store.list():
            run = await gateway.runtime.cron_runs.run(job.id, 15)
            assert run.status == "ok", run.output_excerpt
            assert job.target == "api:ada:desk"
        desk = gateway.runtime.sessions.get("api:ada:desk")  # the code job's output is kept as its chat gets to it
        await until(lambda: any(m["content"] == "CODE-OUTPUT" for m in desk.messages))
        shown = await history(config, owner, "desk")
    assert "CODE-OUTPUT" in shown and "PROMPT-JOB-REPLY" in shown


async def test_a_code_job_run_from_its_own_api_chats_turn_keeps_its_output_after_that_turn(
        config: Config, llm: FakeOpenAI) -> None:
    """``run_cron`` in the chat that owns the job: the turn waits for the run, so the output,
    which that chat keeps, comes after the turn and must not be waited for by the run."""
    async with running_gateway(config, with_services=True) as gateway:
        owner = await ApiKeys(gateway.runtime.db).add("ada", owner=True)
        job = await code_job(gateway, "api:ada:desk", "print('TEA-READY')")
        llm.script(tool_call("run_cron", {"job_id": job.id}), reply("ran it"))
        assert await chat(config, owner, "desk", "run the tea job now") == "ran it"
        ran = json.loads(llm.chat_requests[-1]["messages"][-1]["content"])  # the run's result, in time
        assert ran == {"status": "ok", "output": "TEA-READY"}
        desk = gateway.runtime.sessions.get("api:ada:desk")
        await until(lambda: desk.messages[-1]["content"] == "TEA-READY")
        assert (await history(config, owner, "desk"))[-2:] == ["ran it", "TEA-READY"]


async def test_a_code_job_that_sends_its_own_message_to_its_api_chat_has_it_kept(config: Config, llm: FakeOpenAI) -> None:
    """A job's ``send_message`` to its page or API chat, where no request waits to show it, is
    kept for the reader as printed output is (it went to the API channel and was lost)."""
    async with running_gateway(config, with_services=True) as gateway:
        job = await code_job(gateway, "api:ada:desk", "send_message('TEA-READY')\nprint('not shown: it sent its own')")
        run = await gateway.runtime.cron_runs.run(job.id, 15)
        assert run.status == "ok" and run.output_excerpt == "not shown: it sent its own"
        desk = await gateway.runtime.sessions.open("api:ada:desk")
        await until(lambda: desk.waiting_messages() == ["TEA-READY"])
        await until(lambda: _not(gateway.delivery.unfinished_in("api:ada:desk")))
    assert [m["content"] for m in desk.messages] == ["TEA-READY"]


async def test_a_job_for_an_api_chat_keeps_its_output_with_the_api_off_and_sends_nothing(
        config: Config, llm: FakeOpenAI, caplog) -> None:
    """``--to api:bob`` works with the API off: the output is kept in the chat's history, and no
    message is sent (or given up on) on a channel that is not running."""
    config.gateway.api.enabled = False
    async with running_gateway(config, with_services=True) as gateway:
        job = await code_job(gateway, "api:bob", "print('TEA-READY')")
        assert (await gateway.runtime.cron_runs.run(job.id, 15)).status == "ok"
        bob = await gateway.runtime.sessions.open("api:bob")
        await until(lambda: bob.waiting_messages() == ["TEA-READY"])
        await until(lambda: _not(gateway.delivery.unfinished_in("api:bob")))  # settled
        assert await gateway.runtime.db.fetchval("SELECT count(*) FROM outbox WHERE channel = 'api'") == 0
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR") and "api:bob" in r.getMessage()]


async def code_job(gateway: Any, chat: str, code: str) -> Any:
    """An hourly code job of ``chat``, made as ``schedule_cron`` makes one."""
    from nanobot.cron.service import create_job

    return await create_job(CronStore(gateway.runtime.db), owner_session=chat, schedule_kind="every",
                            expression="3600", timezone="UTC", payload_kind="code", payload=code)


async def _not(condition: Awaitable[Any]) -> bool:
    return not await condition


async def test_a_notice_shows_a_strangers_text_in_the_order_written() -> None:
    """A display name holding U+202E (right-to-left override) showed the rest of the notice's line,
    the command to type included, backwards: a name can make that read as another command."""
    from nanobot.utf8 import BIDI_CONTROLS, for_terminal

    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    async with notices_to(send) as notices:
        await notices.announce("telegram user 9 (\u202e4321LIVE evorppa) asked to talk to me. Approve: ... REAL5678")
        await notices.close()
        [(_, kept)] = await notices.kept.latest()
    assert sent and not any(c in sent[0] for c in BIDI_CONTROLS) and sent[0].endswith("REAL5678")
    assert f"🔔 {kept}" == sent[0]  # kept for the page as it was sent
    assert for_terminal("a\u202eb\u2066c") == "a\\u202eb\\u2066c"  # the terminal shows them, never obeys


async def test_notices_within_the_quiet_time_come_as_one_message_at_its_end() -> None:
    sent: list[str] = []
    arrived = asyncio.Event()

    async def send(text: str) -> None:
        sent.append(text)
        arrived.set()

    async with notices_to(send, interval_s=0.2) as notices:
        for n in range(3):
            await notices.announce(f"New scheduled job j{n}: stretch")
        assert sent == ["🔔 New scheduled job j0: stretch"]
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), 5)
        assert sent[1].startswith("🔔 2 new scheduled jobs:\n• ") and len(sent) == 2
        await notices.close()
        assert len(sent) == 2 and len(await notices.kept.latest()) == 3  # each kept for the page


async def test_notices_are_kept_thirty_days_for_the_page() -> None:
    """The page's Status view lists the last days' notices; older ones go as new ones come, so
    the table does not grow for the months the daemon runs."""
    import time

    from nanobot.notices import KEEP_S

    async def send(text: str) -> None:
        return None

    async with notices_to(send) as notices:
        await notices.kept.db.execute("INSERT INTO owner_notices (at, text) VALUES ($1, $2)",
                                      time.time() - KEEP_S - 60, "a month and a minute ago")
        await notices.announce("AGENTS.md changed by api:bob (write_file).")
        kept = [text for _, text in await notices.kept.latest()]
        await notices.close()
    assert kept == ["AGENTS.md changed by api:bob (write_file)."]


@asynccontextmanager
async def notices_to(send: Callable[[str], Awaitable[None]], **options: float) -> AsyncIterator[Any]:
    """Owner notices sent with ``send``, kept in a database of their own (in memory)."""
    from nanobot.database import SqliteDatabase
    from nanobot.notices import NoticeLog, OwnerNotices

    db = await SqliteDatabase.open(":memory:")
    try:
        yield OwnerNotices(send, await NoticeLog.open(db), **options)
    finally:
        await db.close()
