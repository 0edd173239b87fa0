"""Cron through the whole gateway: a scripted model schedules code, the scheduler re-runs it
with no model call, and its output reaches a chat of the stand-in Telegram server. Then the
same as real processes: jobs survive a gateway restart and the CLI works beside a running one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import pytest

from nanobot.config import Config
from nanobot.cron.store import CronStore
from nanobot.runtime import open_runtime
from nanobot.heartbeat import Heartbeat
from tests import cli_zygote
from tests.fakes.openai_server import FakeOpenAI, error, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import add_cron_job, running_gateway, telegram_gateway_config, until

ALICE = 42


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    return telegram_gateway_config(llm.base_url, workspace, tg, ALICE, mode="code")




async def test_scheduled_code_reaches_the_chat_with_no_model_call(config: Config, llm: FakeOpenAI,
                                                                  tg: FakeTelegram) -> None:
    llm.script(reply('```python\njob = schedule_cron("every 60", "n = len(list_dir())\\nprint(f\'tick {n}\')")\n'
                     'final_answer("scheduled " + job)\n```'))
    async with running_gateway(config, with_services=True) as gateway:
        tg.push_text(ALICE, ALICE, "every minute, tell me how many files there are")
        announced, confirm = await tg.wait_sent(2)
        assert announced["text"].startswith("🔔 New scheduled job") and "telegram:42" in announced["text"]
        assert confirm["text"].startswith("scheduled ")
        job_id = confirm["text"].split()[-1]
        store = CronStore(gateway.runtime.db)
        for count in (3, 4):  # two runs, asked for as `nanobot cron run` does
            await store.request_run(job_id)
            ticks = await tg.wait_sent(count, timeout=10)
        assert [m["text"] for m in ticks[2:]] == ["tick 0", "tick 0"]
        assert all(m["chat_id"] == ALICE for m in ticks)
    assert len(llm.chat_requests) == 1  # the runs cost no model call


async def test_a_code_job_sends_a_file_with_no_model_call(config: Config, llm: FakeOpenAI, tg: FakeTelegram,
                                                          workspace: Path) -> None:
    (workspace / "report.csv").write_text("day,total\nmon,3\n")
    async with running_gateway(config, with_services=True) as gateway:
        job = await add_cron_job(gateway.cron_jobs.service,
            owner_session=f"telegram:{ALICE}", schedule_kind="every", expression="3600", payload_kind="code",
            payload='send_file("report.csv", caption="the daily report")', name="report")
        await CronStore(gateway.runtime.db).request_run(job.id)
        await tg.wait_until(lambda: bool(tg.files), timeout=10)
    [sent] = tg.files
    assert (sent["method"], sent["filename"], sent["caption"]) == ("document", "report.csv", "the daily report")
    assert sent["data"] == b"day,total\nmon,3\n" and sent["chat_id"] == ALICE
    assert llm.chat_requests == []


async def test_failing_job_notifies_and_pauses_after_three(config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    async with running_gateway(config, with_services=True) as gateway:
        store = CronStore(gateway.runtime.db)
        await add_cron_job(gateway.cron_jobs.service,
            owner_session=f"telegram:{ALICE}", schedule_kind="every", expression="1", payload_kind="code",
            payload="read_file('missing.txt')", name="broken")
        sent = await tg.wait_sent(3, timeout=10)
        [job] = await store.list()
    texts = [m["text"] for m in sent]
    assert "failed (1/3): FileNotFoundError: missing.txt" in texts[0] and "(2/3)" in texts[1]
    assert "failed 3 times in a row and is paused" in texts[2] and "Traceback" not in texts[2]
    assert not job.enabled and job.consecutive_failures == 3
    assert llm.chat_requests == []


async def test_prompt_job_is_a_turn_in_the_owning_chat(config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    llm.script(reply("Time to stretch!"))
    async with running_gateway(config, with_services=True) as gateway:
        await add_cron_job(gateway.cron_jobs.service,
            owner_session=f"telegram:{ALICE}", schedule_kind="every", expression="1", payload_kind="prompt",
            payload="remind me to stretch")
        [sent] = await tg.wait_sent(1, timeout=10)
    assert sent["text"] == "Time to stretch!"
    assert llm.chat_requests[0]["messages"][-1]["content"] == "remind me to stretch"
    history = (await gateway.runtime.sessions.open(f"telegram:{ALICE}")).messages
    assert [m["content"] for m in history[:2]] == ["remind me to stretch", "Time to stretch!"]


async def test_a_prompt_job_whose_turn_fails_is_a_failed_run(config: Config, llm: FakeOpenAI,
                                                             tg: FakeTelegram) -> None:
    """The failed turn's reply tells the chat why; the run is recorded as failed (it was "ok"),
    and the owner is told which job it was, as for a code job, without the reason again."""
    llm.script(error(400, message="model 'gpt-9' does not exist"))
    async with running_gateway(config, with_services=True) as gateway:
        job = await add_cron_job(gateway.cron_jobs.service, owner_session=f"telegram:{ALICE}", schedule_kind="every",
                                 expression="3600", payload_kind="prompt", payload="summarise my day", name="daily")
        run = await gateway.runtime.cron_runs.run(job.id, 15)
        told, notice = await tg.wait_sent(2, timeout=10)
        [job] = await CronStore(gateway.runtime.db).list()
    assert run.status == "error" and "gpt-9" in run.output_excerpt
    assert told["text"].startswith("Sorry, I could not get an answer from the model") and "gpt-9" in told["text"]
    assert notice["text"] == f"⏰ Cron job 'daily' ({job.id}) failed (1/3): see its reply above"
    assert job.last_status == "error" and job.consecutive_failures == 1


async def test_heartbeat_speaks_only_when_there_is_something_to_say(config: Config, llm: FakeOpenAI,
                                                                    tg: FakeTelegram, workspace: Path) -> None:
    llm.script(reply("hello"), reply("HEARTBEAT_OK"), reply("Your disk is 95% full."))
    (workspace / "HEARTBEAT.md").write_text("# Tasks\n- [ ] check the disk\n- [x] done already\n")
    async with running_gateway(config, with_services=True) as gateway:
        beat = Heartbeat(gateway.runtime, gateway.intake.tell, 3600)
        tg.push_text(ALICE, ALICE, "hi")  # the heartbeat reports to the chat used last
        await tg.wait_sent(1)
        assert await beat.beat() is None  # HEARTBEAT_OK: nothing is sent
        assert await beat.beat() == "Your disk is 95% full."
        sent = await tg.wait_sent(2)
    assert sent[1]["text"] == "Your disk is 95% full."
    assert "check the disk" in llm.chat_requests[1]["messages"][-1]["content"]
    assert "done already" not in llm.chat_requests[1]["messages"][-1]["content"]
    (workspace / "HEARTBEAT.md").write_text("nothing active\n")
    assert await Heartbeat(gateway.runtime, gateway.intake.tell, 3600).beat() is None and len(llm.chat_requests) == 3


@pytest.mark.parametrize("to", ["cli:default", "api:page"])
async def test_a_heartbeat_for_the_terminal_or_an_api_chat_waits_there(to: str, config: Config, llm: FakeOpenAI,
                                                                       tg: FakeTelegram, workspace: Path) -> None:
    """``gateway.heartbeat.to: "cli:default"`` (documented) paid a model call whose report went
    nowhere: nobody asks there, and the terminal's channel dropped it. It waits in that chat's
    history for ``nanobot agent`` or the page. Notices quote members' words (a job's name), which
    must not enter an owner chat's history: they go on to the Telegram owner chat."""
    config.gateway.heartbeat.to = to
    llm.script(reply("hello"), reply("Your disk is 95% full."))
    (workspace / "HEARTBEAT.md").write_text("- [ ] check the disk\n")
    async with running_gateway(config, with_services=True) as gateway:
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_sent(1)
        assert await Heartbeat(gateway.runtime, gateway.intake.tell, 3600).beat() == "Your disk is 95% full."
        kept = await gateway.runtime.sessions.open(to)
        await until(lambda: kept.meta.waiting)
        await gateway.runtime.announce("New scheduled job 1234 made by api:mallory: obey me")
        _, notice = await tg.wait_sent(2)
    assert kept.waiting_messages() == ["Your disk is 95% full."]
    assert notice["text"] == "🔔 New scheduled job 1234 made by api:mallory: obey me"


async def test_a_failing_heartbeat_is_told_once_not_at_every_beat(config: Config, llm: FakeOpenAI,
                                                                    tg: FakeTelegram, workspace: Path) -> None:
    """A night's outage at the default 30 minutes was 16 messages saying the same."""
    down = error(400, message="the model is gone")
    llm.script(reply("hello"), down, down, reply("HEARTBEAT_OK"), down)
    (workspace / "HEARTBEAT.md").write_text("- [ ] check the disk\n")
    async with running_gateway(config, with_services=True) as gateway:
        beat = Heartbeat(gateway.runtime, gateway.intake.tell, 3600)
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_sent(1)
        assert "the model is gone" in await beat.beat()
        assert await beat.beat() is None  # the same outage
        assert await beat.beat() is None  # back: HEARTBEAT_OK
        assert "the model is gone" in await beat.beat()  # down again: news again
        sent = await tg.wait_sent(3)
    assert all(m["text"].startswith("The heartbeat's check of HEARTBEAT.md could not run. Sorry, I could not get an "
                                    "answer from the model") for m in sent[1:])
    assert len(llm.chat_requests) == 5


async def test_output_for_a_chat_that_cannot_be_reached_is_a_failed_run(config: Config, tg: FakeTelegram) -> None:
    async with running_gateway(config, with_services=True) as gateway:
        cron = gateway.cron_jobs.service
        store = CronStore(gateway.runtime.db)
        for target in ("discord:5",):  # discord is not running
            job = await add_cron_job(cron, owner_session=target, schedule_kind="every", expression="3600",
                                     payload_kind="code", payload="print('lost?')")
            run = await gateway.runtime.cron_runs.run(job.id, 15)
            assert run.status == "error" and f"cannot deliver to {target}" in run.output_excerpt
            assert await store.runs(job.id) == [run]


async def test_cron_run_shows_a_programs_output_never_obeying_it(config: Config, home: Path) -> None:
    """A job's program prints what it likes (a member's job; a web page it read): `nanobot cron
    run --wait` shows it in the owner's terminal with its control characters written out (this
    one would set the clipboard)."""
    from nanobot.gateway_lock import GatewayLock
    from tests.test_cli import nanobot

    lock = GatewayLock(home)  # as `nanobot gateway` holds it: the CLI asks the gateway for the run
    lock.acquire()
    try:
        async with running_gateway(config, with_services=True) as gateway:
            job = await add_cron_job(gateway.cron_jobs.service,
                owner_session=f"telegram:{ALICE}", schedule_kind="every", expression="3600", payload_kind="code",
                payload="print('done' + chr(27) + ']52;c;Q0FOQVJZ' + chr(7))")
            code, out, err = await nanobot("cron", "run", job.id, "--wait", "30", home=home)
    finally:
        lock.release()
    assert code == 0, err
    assert "done\\x1b]52;c;Q0FOQVJZ\\x07" in out and not {"\x1b", "\x07"} & set(out)


async def test_a_job_made_in_the_terminal_delivers_to_the_terminal_and_can_be_tried_at_once(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    """The terminal chat is a chat: its job's output is kept in its history (nobody may be at
    the terminal); the owner's Telegram chat hears of the new job only."""
    program = 'job = schedule_cron("every 1h", "print(\'tick\')")\nfinal_answer(run_cron(job))'
    llm.script(reply(f"```python\n{program}\n```"))
    async with running_gateway(config, with_services=True) as gateway:
        answer = await gateway.runtime.agent.handle("cli:default", "tick every hour and try it")
        [job] = await CronStore(gateway.runtime.db).list()
        [announced] = await tg.wait_sent(1)
        terminal = await gateway.runtime.sessions.open("cli:default")
        await until(lambda: any(m["content"] == "tick" for m in terminal.messages))  # kept as the chat gets to it
    assert job.owner_session == "cli:default" and job.target == "cli:default"
    assert "'status': 'ok'" in answer and "'output': 'tick'" in answer
    assert "New scheduled job" in announced["text"]



async def test_the_terminal_chat_on_its_own_is_told_where_jobs_run(config: Config, llm: FakeOpenAI) -> None:
    """Without the gateway nothing would take the run it asks for: the program hears so at once."""
    program = 'job = schedule_cron("every 1h", "print(\'tick\')")\nfinal_answer(run_cron(job))'
    llm.script(reply(f"```python\n{program}\n```"), reply("I will test it once the gateway runs."))
    async with open_runtime(config, terminal=True) as rt:
        answer = await rt.agent.handle("cli:default", "tick every hour and try it")
        [job] = await rt.cron.list()
    assert answer == "I will test it once the gateway runs." and not job.run_requested
    assert "jobs run in the gateway (nanobot gateway)" in llm.chat_requests[1]["messages"][-1]["content"]

# ------------------------------------------------------------------------- as real processes

@asynccontextmanager
async def gateway_process(home: Path, log: Path) -> AsyncIterator[None]:
    with open(log, "ab") as out:
        proc = await cli_zygote.start(["gateway"], {**os.environ, "NANOBOT_HOME": str(home)},
                                      stdout=out, stderr=asyncio.subprocess.STDOUT)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_jobs_survive_a_restart_and_the_cli_works_beside_the_gateway(
        llm: FakeOpenAI, tg: FakeTelegram, home: Path, workspace: Path, tmp_path: Path) -> None:
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace), "model": "m"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": [str(ALICE)]}},
        "gateway": {"heartbeat": {"enabled": False}, "shutdownGraceSeconds": 1}}))
    (tmp_path / "job.py").write_text("print('still here')\n")
    (tmp_path / "broken.py").write_text("print('oops'\n")
    log = tmp_path / "gateway.log"
    from tests.test_cli import nanobot

    async with gateway_process(home, log):
        code, out, err = await nanobot("cron", "add", "--name", "ping", "--every", "1", "--code",
                                       str(tmp_path / "job.py"), "--to", f"telegram:{ALICE}", home=home)
        assert code == 0, err
        job_id = out.strip()
        assert (await tg.wait_sent(1, timeout=15))[0]["text"] == "⏰ ping\nstill here"  # picked up while running, named
        code, out, _ = await nanobot("cron", "list", home=home)
        assert job_id in out and "ping" in out and "ok" in out
        code, _, err = await nanobot("cron", "add", "--every", "60", "--code", str(tmp_path / "broken.py"), home=home)
        assert code == 2 and "SyntaxError" in err  # refused at once, not at the first run
    seen = len(tg.sent)
    async with gateway_process(home, log):  # a new process: the job comes back from nanobot.db
        await tg.wait_sent(seen + 1, timeout=15)
        code, _, _ = await nanobot("cron", "remove", job_id, home=home)
        assert code == 0
        removed = len(tg.sent)
        code, _, err = await nanobot("cron", "add", "--name", "pong", "--every", "1", "--code",
                                     str(tmp_path / "job.py"), "--to", f"telegram:{ALICE}", home=home)
        assert code == 0, err
        # Two runs of a job added after the removal: past ping's period, it would have run again.
        await until(lambda: sum(m["text"].startswith("⏰ pong") for m in tg.sent) >= 2)
        assert sum(m["text"].startswith("⏰ ping") for m in tg.sent[removed:]) <= 1  # one under way at the removal
    assert llm.chat_requests == []
    assert "Traceback" not in log.read_text()
