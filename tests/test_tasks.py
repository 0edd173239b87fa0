"""Background tasks through the gateway: the scripted model spawns them from code mode and tools
mode, the chat goes on while they run, each result reaches the chat once, /tasks and /stop ID
work, limits refuse in one line, and a kill -9 mid-task is resumed once after the restart."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from nanobot.config import Config
from nanobot.trust import OWNER
from tests.fakes.openai_server import FakeOpenAI, delayed, reply, tool_call
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import keep_discord_urls, nanobot_process, running_gateway, telegram_gateway_config, until

ALICE = 42
FINISHED = "Background task "


def last_user(body: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def model(body: dict[str, Any]) -> dict[str, Any]:
    """The chat asks for tasks; a task's turn (its message begins "TASK") answers after a while."""
    asked = last_user(body)
    if asked.startswith("<python_result>") or asked.startswith("<tool_result"):
        return reply("done")
    if "TASK" in asked:
        return delayed(reply(f"RESULT of {asked.split()[1]}"), 1.0 if "slow" not in asked else 30)
    if asked.startswith("spawn "):
        words = asked.split()[1:]
        program = "\n".join(f"ids.append(spawn('TASK {w}', label='{w}'))" for w in words)
        return reply(f"```python\nids = []\n{program}\nfinal_answer('started ' + ' '.join(ids))\n```")
    return reply(f"re: {asked}")


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    keep_discord_urls(monkeypatch)
    cfg = telegram_gateway_config(llm.base_url, workspace, tg, ALICE, mode="code")
    cfg.channels.telegram.streaming = False
    llm.fallback = model
    return cfg


def texts(tg: FakeTelegram) -> list[str]:
    return [m["text"] for m in tg.sent]


async def test_tasks_run_in_the_background_while_the_chat_goes_on(config: Config, llm: FakeOpenAI,
                                                                  tg: FakeTelegram) -> None:
    async with running_gateway(config, with_services=True) as gateway:
        tg.push_text(ALICE, ALICE, "spawn alpha beta")
        [started] = await tg.wait_sent(1, timeout=10)
        assert started["text"].startswith("started t")
        tg.push_text(ALICE, ALICE, "hello")  # answered while both tasks run
        await tg.wait_until(lambda: "re: hello" in texts(tg), timeout=10)
        assert not any(t.startswith(FINISHED) for t in texts(tg))
        await tg.wait_until(lambda: sum(t.startswith(FINISHED) for t in texts(tg)) == 2, timeout=15)
        await asyncio.sleep(0.6)  # nothing more may come
        results = sorted(t for t in texts(tg) if t.startswith(FINISHED))
        assert len(results) == 2 and "finished:\nRESULT of alpha" in results[0] and "RESULT of beta" in results[1]
        history = [m["content"] for m in (await gateway.runtime.sessions.open(f"telegram:{ALICE}")).messages]
        assert any("RESULT of alpha" in h for h in history)  # the model knows what came back
        tg.push_text(ALICE, ALICE, "/tasks")
        await tg.wait_until(lambda: any(t.startswith("Background tasks, newest first") for t in texts(tg)), timeout=10)
        listing = next(t for t in texts(tg) if t.startswith("Background tasks, newest first"))
        assert "alpha — done" in listing and "beta — done" in listing and "1 model call" in listing


async def test_spawn_from_tools_mode_and_the_limits(config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    config.agents.defaults.execution_mode = "tools"
    config.agents.defaults.tasks.max_per_chat = 1
    script = [tool_call("find_tools", {"query": "spawn background task"}),
              tool_call("spawn", {"task": "TASK gamma", "label": "gamma"}),
              tool_call("spawn", {"task": "TASK delta", "label": "delta"}), reply("one started")]
    llm.script(*script)
    async with running_gateway(config, with_services=True):
        tg.push_text(ALICE, ALICE, "start two")
        await tg.wait_until(lambda: any(t.startswith(FINISHED) for t in texts(tg)), timeout=15)
    refused = llm.chat_requests[3]["messages"][-1]["content"]
    assert "1 background tasks running or waiting already (agents.defaults.tasks.maxPerChat)" in refused
    assert [t for t in texts(tg) if t.startswith(FINISHED)] == [next(t for t in texts(tg) if "gamma" in t)]


async def test_stop_id_stops_a_task_and_a_tainted_turn_may_not_spawn(config: Config, llm: FakeOpenAI,
                                                                     tg: FakeTelegram) -> None:
    async with running_gateway(config, with_services=True):
        tg.push_text(ALICE, ALICE, "spawn slow")
        [started] = await tg.wait_sent(1, timeout=10)
        task_id = started["text"].split()[-1]
        await until(lambda: any("TASK slow" in last_user(r) for r in llm.chat_requests))  # it runs: its call waits
        tg.push_text(ALICE, ALICE, f"/stop {task_id}")
        await tg.wait_until(lambda: any(t.startswith(FINISHED) for t in texts(tg)), timeout=10)
        assert any(t.startswith(f"Stopping task slow ({task_id})") for t in texts(tg))
        assert f"Background task slow ({task_id}) stopped:\nstopped (/stop)" in texts(tg)
    from nanobot.trust import TurnGuard

    turn = TurnGuard()
    turn.taint("the web page https://evil.example")
    with pytest.raises(PermissionError, match="spawn refused: this turn read external content"):
        await _spawn(config, turn)


async def _spawn(config: Config, turn) -> str:  # noqa: ANN001
    from nanobot.runtime import open_runtime
    from nanobot.tools.registry import ToolContext

    async with open_runtime(config) as rt:
        ctx = ToolContext(config, config.workspace_path, f"telegram:{ALICE}", OWNER, services=rt,
                          guard=turn)
        return await rt.tools.call("spawn", {"task": "x"}, ctx)


async def test_a_task_survives_kill_9_and_reports_once(tg: FakeTelegram, home: Path, workspace: Path) -> None:
    """The gateway dies while a task's model call is in flight; started again, it resumes the
    task (told so), and the chat gets one result."""
    async with FakeOpenAI() as llm:
        calls: list[str] = []

        def answer(body: dict[str, Any]) -> dict[str, Any]:
            asked = last_user(body)
            if "TASK" in asked:
                calls.append(asked)
                return delayed(reply("RESULT of omega"), 60 if len(calls) == 1 else 0.1)
            return model(body)

        llm.fallback = answer
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(workspace), "model": "m", "executionMode": "code"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                      "allowFrom": [str(ALICE)], "streaming": False}},
            "gateway": {"heartbeat": {"enabled": False}}}))
        async with nanobot_process("gateway", home=home, stderr=asyncio.subprocess.DEVNULL) as first:
            tg.push_text(ALICE, ALICE, "spawn omega")
            await tg.wait_sent(1, timeout=30)
            await until(lambda: len(calls) == 1)
            first.send_signal(signal.SIGKILL)
            await first.wait()
        async with nanobot_process("gateway", home=home, stderr=asyncio.subprocess.DEVNULL) as second:
            await until(lambda: any(t.startswith(FINISHED) for t in texts(tg)))
            await asyncio.sleep(1.0)
            second.send_signal(signal.SIGTERM)
            await second.wait()
    assert len(calls) == 2 and "cut off by a restart" in calls[1]
    assert [t for t in texts(tg) if t.startswith(FINISHED)] == ["Background task omega (" + texts(tg)[0].split()[-1]
                                                                + ") finished:\nRESULT of omega"]


async def test_a_task_past_max_minutes_is_stopped_and_says_so(config: Config, llm: FakeOpenAI,
                                                              tg: FakeTelegram) -> None:
    config.agents.defaults.tasks.max_minutes = 0.02  # 1.2 s
    async with running_gateway(config, with_services=True):
        tg.push_text(ALICE, ALICE, "spawn slow")
        await tg.wait_until(lambda: any(t.startswith(FINISHED) for t in texts(tg)), timeout=10)
    [ended] = [t for t in texts(tg) if t.startswith(FINISHED)]
    assert "stopped:\nstopped: it ran past 0.02 minutes (agents.defaults.tasks.maxMinutes)" in ended


async def test_task_limits_count_per_key_and_members_leave_the_owner_a_share(config: Config) -> None:
    """A member key's sessions count together for maxPerChat, and member chats together keep
    one chat's worth of maxTotal free: the owner's spawn is never refused because of members."""
    from nanobot.runtime import open_runtime
    from nanobot.tools.registry import ToolContext
    from nanobot.trust import MEMBER

    tasks = config.agents.defaults.tasks
    tasks.max_total, tasks.max_per_chat = 4, 2  # members together: 2
    async with open_runtime(config) as rt:
        async def spawn(chat: str, trust: str = MEMBER) -> str:
            ctx = ToolContext(config, config.workspace_path, chat, trust, services=rt)
            try:
                return await rt.tools.call("spawn", {"task": "x"}, ctx)
            except PermissionError as exc:
                return f"refused: {exc}"

        assert not (await spawn("api:bob:s1")).startswith("refused")
        assert not (await spawn("api:bob:s2")).startswith("refused")
        assert "this chat has 2 background tasks" in await spawn("api:bob:s3")  # one key, many sessions
        assert "member chats have 2 background tasks" in await spawn("api:carol")
        assert not (await spawn(f"telegram:{ALICE}", "owner")).startswith("refused")  # the owner's share
        assert not (await spawn(f"telegram:{ALICE}", "owner")).startswith("refused")
        assert "4 background tasks are running or waiting already" in await spawn("cli:default", "owner")


async def test_deploys_hand_tasks_back_and_max_minutes_counts_from_the_first_start(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    """Three graceful stops while a task runs: it is resumed each time (not failed "cut off
    twice"), its attempts not counted; its time limit is wall clock from its first start."""
    from nanobot.runtime import open_runtime
    from nanobot.tasks import TaskStore

    runs: list[str] = []

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        asked = last_user(body)
        if "TASK" in asked:
            runs.append(asked)
            return delayed(reply("RESULT of long"), 60 if len(runs) <= 3 else 0.05)
        return model(body)

    llm.fallback = answer
    for restart in range(4):
        async with running_gateway(config, with_services=True) as gateway:
            if restart == 0:
                tg.push_text(ALICE, ALICE, "spawn long")
                await tg.wait_sent(1, timeout=10)
            if restart < 3:
                await until(lambda: len(runs) == restart + 1)
            else:
                await tg.wait_until(lambda: any(t.startswith(FINISHED) for t in texts(tg)), timeout=15)
            store = await TaskStore.open(gateway.runtime.db)
            [task] = await store.of_chat(f"telegram:{ALICE}")
        if restart < 3:
            async with open_runtime(config) as rt:  # no gateway: nothing runs it; it waits, handed back
                [task] = await (await TaskStore.open(rt.db)).of_chat(f"telegram:{ALICE}")
                assert (task.state, task.attempts) == ("queued", 0)
    assert [t for t in texts(tg) if t.startswith(FINISHED)] == [f"Background task {task.name} finished:\nRESULT of long"]
    # The limit: a task first started long ago is stopped at once when it is resumed.
    config.agents.defaults.tasks.max_minutes = 1
    tg.sent.clear()
    async with open_runtime(config) as rt:
        store = await TaskStore.open(rt.db)
        old = await store.add(f"telegram:{ALICE}", "TASK old", "old")
        await rt.db.execute("UPDATE tasks SET started = $1 WHERE id = $2", 1.0, old.id)
    async with running_gateway(config, with_services=True):
        await tg.wait_until(lambda: any(t.startswith(FINISHED) for t in texts(tg)), timeout=15)
    assert [t for t in texts(tg) if t.startswith(FINISHED)] == [
        f"Background task old ({old.id}) stopped:\nstopped: it ran past 1 minutes (agents.defaults.tasks.maxMinutes)"]


async def test_ended_tasks_a_month_old_are_forgotten(config: Config) -> None:
    """A task a day for months must not grow the table: when a task ends, those ended over 30
    days ago go (as cron's runs do); those ended lately and those still waiting stay."""
    import time

    from nanobot.runtime import open_runtime
    from nanobot.tasks import TaskStore

    chat = f"telegram:{ALICE}"
    async with open_runtime(config) as rt:
        store = await TaskStore.open(rt.db)
        old, recent, waiting, now = [await store.add(chat, f"TASK {n}", n) for n in ("old", "recent", "waiting", "now")]
        for task, days in ((old, 31), (recent, 29)):
            await store.finish(task.id, "done", "a long report")
            await rt.db.execute("UPDATE tasks SET finished = $1 WHERE id = $2", time.time() - days * 86400, task.id)
        await store.finish(now.id, "failed", "cut off")
        assert {t.label: t.state for t in await store.of_chat(chat)} == {
            "recent": "done", "waiting": "queued", "now": "failed"}
