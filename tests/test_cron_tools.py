"""schedule_cron / list_cron / remove_cron / enable_cron from a chat, through the real agent and sandbox."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from nanobot.cron.store import CronStore
from nanobot.runtime import open_runtime
from nanobot.tools.cron_tools import parse_expression
from nanobot.trust import OWNER
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for


@pytest.mark.parametrize("text, parsed", [
    ("0 9 * * 1-5", ("cron", "0 9 * * 1-5")),
    ("every 30", ("every", "30")),
    ("every 10m", ("every", "600")),
    ("every 2 hours", ("every", "7200")),
    ("at 2030-01-01T09:00", ("at", "2030-01-01T09:00")),
])
def test_expression_forms(text: str, parsed: tuple[str, str]) -> None:
    assert parse_expression(text) == parsed


async def test_code_mode_schedules_lists_and_removes(workspace: Path, home: Path) -> None:
    async with FakeOpenAI() as llm:
        llm.script(reply('```python\njob = schedule_cron("0 9 * * 0", "print(\'weekly\')", name="weekly")\n'
                         'final_answer(job)\n```'),
                   reply("```python\nfinal_answer(list_cron())\n```"))
        async with open_runtime(config_for(llm.base_url, workspace, mode="code", timezone="Europe/Berlin")) as rt:
            job_id = await rt.agent.handle("telegram:7", "every sunday at 9")
            listing = await rt.agent.handle("telegram:7", "list")
            store = CronStore(rt.db)
            job = await store.get(job_id)
            assert job.owner_session == "telegram:7" and job.timezone == "Europe/Berlin"
            local = job.next_run_at.astimezone(ZoneInfo("Europe/Berlin"))
            assert job.payload == "print('weekly')" and (local.weekday(), local.hour) == (6, 9)  # Sunday, 09:00
            assert job_id in listing and "weekly" in listing


async def test_broken_code_is_refused_when_scheduled(workspace: Path, home: Path) -> None:
    async with FakeOpenAI() as llm:
        llm.script(tool_call("schedule_cron", {"expression": "every 60", "code": "print('unclosed'"}),
                   tool_call("schedule_cron", {"expression": "61 * * * *", "code": "print(1)"}),
                   reply("could not"))
        async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
            assert await rt.agent.handle("discord:1", "schedule") == "could not"
            assert await CronStore(rt.db).list() == []
        errors = [r["messages"][-1]["content"] for r in llm.chat_requests[1:]]
        assert "rejected" in errors[0] and "SyntaxError" in errors[0]
        assert errors[1].startswith("Error: ValueError")


async def test_remove_only_in_the_owning_chat(workspace: Path, home: Path) -> None:
    async with FakeOpenAI() as llm:
        async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
            from nanobot.tools.registry import ToolContext

            mine = ToolContext(rt.config, workspace, "telegram:1", OWNER, services=rt)
            other = ToolContext(rt.config, workspace, "telegram:2", OWNER, services=rt)
            job_id = await rt.tools.call("schedule_cron", {"expression": "every 5m", "message": "stretch!"}, mine)
            with pytest.raises(ValueError, match="no job"):
                await rt.tools.call("remove_cron", {"job_id": job_id}, other)
            assert await rt.tools.call("list_cron", {}, other) == []
            assert await rt.tools.call("remove_cron", {"job_id": job_id}, mine) == f"removed {job_id}"


async def test_a_paused_job_is_resumed_from_its_chat(workspace: Path, home: Path) -> None:
    """A job paused after 3 failures tells its chat "ask me here to resume it": the model can,
    in that chat only (the failure count starts again), and can pause one too."""
    async with FakeOpenAI() as llm:
        async with open_runtime(config_for(llm.base_url, workspace, mode="code")) as rt:
            from nanobot.tools.registry import ToolContext

            mine = ToolContext(rt.config, workspace, "telegram:1", OWNER, services=rt)
            other = ToolContext(rt.config, workspace, "telegram:2", OWNER, services=rt)
            job_id = await rt.tools.call("schedule_cron", {"expression": "every 5m", "code": "print(1)"}, mine)
            store = CronStore(rt.db)
            for _ in range(3):
                await store.record_run(job_id, datetime.now(timezone.utc), 1, "error", "boom")
            await store.set_enabled(job_id, False)  # as the service pauses it
            with pytest.raises(ValueError, match="no job"):
                await rt.tools.call("enable_cron", {"job_id": job_id}, other)
            llm.script(reply(f'```python\nfinal_answer(enable_cron("{job_id}"))\n```'))
            assert await rt.agent.handle("telegram:1", "resume it") == f"resumed {job_id}"
            [job] = await store.list()
            assert job.enabled and job.consecutive_failures == 0
            assert await rt.tools.call("enable_cron", {"job_id": job_id, "enabled": False}, mine) == f"paused {job_id}"
            assert not (await store.list())[0].enabled


async def test_from_the_terminal_a_job_delivers_to_the_terminal_or_to(workspace: Path, home: Path) -> None:
    """The terminal chat is a chat like any other: with no owner chat configured at all, a job
    made there delivers to it (kept in its history); ``to`` names another chat."""
    async with FakeOpenAI() as llm:
        config = config_for(llm.base_url, workspace, mode="code")
        t = config.channels.telegram
        t.enabled, t.token, t.allow_from = True, "1:x", ["*"]  # "*" names no owner chat
        llm.script(reply('```python\nfinal_answer(schedule_cron("every 1h", "print(1)"))\n```'),
                   reply('```python\nfinal_answer(schedule_cron("every 1h", "print(1)", to="telegram:555"))\n```'))
        async with open_runtime(config) as rt:
            here = await CronStore(rt.db).get(await rt.agent.handle("cli:default", "hourly"))
            job_id = await rt.agent.handle("cli:default", "hourly, to 555")
            job = await CronStore(rt.db).get(job_id)
        assert here.target == "cli:default" and here.deliver_to is None
        assert job.target == "telegram:555" and job.owner_session == "cli:default"
