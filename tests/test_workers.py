"""Several gateways on one PostgreSQL act as one assistant (nanobot.cluster): in-process
workers here, each with its own home and the shared workspace and database; the kill -9
cases with real processes are in test_workers_failover.py."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest

from nanobot.cluster.registry import OtherWorkspace, list_workers
from nanobot.config import Config, TelegramWebhook
from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.postgres import PostgresDatabase
from tests.fakes.loopback import free_port
from tests.fakes.openai_server import error, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import add_cron_job, keep_discord_urls, running_gateway, telegram_gateway_config, until

CHATS = (41, 42, 43)


@pytest.fixture
def fast(monkeypatch) -> None:
    keep_discord_urls(monkeypatch)


def echo(body: dict) -> dict:
    return reply("re: " + asked(body))


def asked(body: dict) -> str:
    """The last message the user wrote (a resumed turn ends with a note, not a repeat)."""
    return [m["content"] for m in body["messages"] if m["role"] == "user" and m["content"] != RESUMED_NOTE][-1]


def asks(llm: Any, text: str) -> int:
    """How many turns for ``text`` the model was asked (a resumed task's is told so below its text)."""
    return sum(asked(body).startswith(text) for body in llm.chat_requests)


def worker_config(llm, workspace: Path, tg: FakeTelegram, pg_url: str, name: str, tmp_path: Path) -> Config:
    config = telegram_gateway_config(llm.base_url, workspace, tg, *CHATS)
    config.database.url = pg_url
    config.gateway.worker_id = name
    config.channels.telegram.streaming = False
    home = tmp_path / f"home-{name}"
    home.mkdir()
    config.use_home(home)
    return config


@asynccontextmanager
async def workers(configs: list[Config], *, with_services: bool = False) -> AsyncIterator[dict]:
    """Gateways started one after another; ``{worker id: gateway}``; each is stopped on the
    way out unless the test stopped it (``stop(gateways, id)``)."""
    async with AsyncExitStack() as stack:
        gateways = {}
        for config in configs:
            gateways[config.gateway.worker_id] = await stack.enter_async_context(
                running_gateway(config, with_services=with_services))
        yield gateways


def holder(gateways: dict, singleton: str) -> list[str]:
    return [name for name, gw in gateways.items() if gw.cluster and singleton in gw.cluster.singletons.held]


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in tg.sent if m["chat_id"] == chat]


async def test_three_workers_answer_every_message_once_in_order(llm, tg, pg_url: str, workspace: Path,
                                                                 tmp_path: Path, fast) -> None:
    llm.fallback = echo
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2, 3)]
    async with workers(configs) as gateways:
        assert len(holder(gateways, "telegram polling")) == 1
        for n in range(5):
            for chat in CHATS:
                tg.push_text(chat, chat, f"{chat}-{n}")
        await tg.wait_sent(15, timeout=20)
        await asyncio.sleep(0.3)  # nothing more may come
        for chat in CHATS:
            assert texts(tg, chat) == [f"re: {chat}-{n}" for n in range(5)]
        assert tg.conflicts == 0
        db = await PostgresDatabase.open(pg_url)
        try:
            rows = await list_workers(db)
        finally:
            await db.close()
        assert {r.id for r in rows if r.alive} == {"w1", "w2", "w3"}
        assert sum(r.chats for r in rows) == 3 and sum("telegram polling" in r.holds for r in rows) == 1
        # Any worker may send a chat's reply: no one of them may hold a device's keys (Matrix's encryption)
        assert [gw.channels.ctx.keys_dir for gw in gateways.values()] == [None] * 3


async def test_the_next_worker_polls_within_seconds_when_the_poller_stops(llm, tg, pg_url: str, workspace: Path,
                                                                          tmp_path: Path, fast) -> None:
    llm.fallback = echo
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs[:1]) as first, workers(configs[1:]) as second:
        assert holder(first, "telegram polling") == ["w1"] and holder(second, "telegram polling") == []
        tg.push_text(41, 41, "before")
        await tg.wait_sent(1, timeout=10)
        await first["w1"].stop()  # a normal stop hands polling over at once
        tg.push_text(41, 41, "after")
        await tg.wait_sent(2, timeout=10)
        assert holder(second, "telegram polling") == ["w2"]
        assert texts(tg, 41) == ["re: before", "re: after"] and tg.conflicts == 0


async def test_a_cron_job_fires_once_per_tick_across_workers(llm, tg, pg_url: str, workspace: Path,
                                                             tmp_path: Path, fast) -> None:
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2, 3)]
    async with workers(configs, with_services=True) as gateways:
        clock = holder(gateways, "cron clock")
        assert len(clock) == 1
        service = gateways["w2"].cron_jobs.service  # any worker may add a job
        await add_cron_job(service, owner_session="telegram:41", schedule_kind="every", expression="1",
                           payload_kind="code", payload="print('tick')")
        await tg.wait_sent(2, timeout=10)
        await gateways[clock[0]].stop()  # the clock moves to another worker
        await tg.wait_sent(4, timeout=15)
        runs = await service.store.runs((await service.store.list())[0].id, limit=100)
        started = sorted(r.started_at.timestamp() for r in runs)
        # once per tick: no two runs of the one job within the same second
        assert all(b - a > 0.5 for a, b in zip(started, started[1:])), started
        assert set(texts(tg, 41)) == {"tick"}


async def post_update(http: aiohttp.ClientSession, port: int, path: str, update: object,
                      secret: str | None = None) -> int:
    """What Telegram does with a webhook: POST the update (``bytes`` as they are); the status."""
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret is not None else {}
    body = {"data": update} if isinstance(update, bytes) else {"json": update}
    async with http.post(f"http://127.0.0.1:{port}{path}", headers=headers, **body) as response:
        return response.status


async def test_webhook_workers_record_before_answering_and_refuse_without_the_secret(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast, caplog) -> None:
    llm.fallback = echo
    secret = "s3cret-token-for-tests"
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    ports = [free_port(), free_port()]
    for config, port in zip(configs, ports):
        config.channels.telegram.webhook = TelegramWebhook(url="https://bot.example.org/tg",
                                                           listen=f"127.0.0.1:{port}", secret_token=secret)
    async with workers(configs), aiohttp.ClientSession() as http:
        assert tg.webhook and tg.webhook["url"] == "https://bot.example.org/tg" and \
            tg.webhook["secret_token"] == secret
        assert "getUpdates" not in tg.calls and "deleteWebhook" not in tg.calls
        update = tg.push_text(41, 41, "via the webhook")
        assert await post_update(http, ports[0], "/tg", update) == 401
        assert await post_update(http, ports[0], "/tg", update, "wrong" * 4) == 401
        for n, port in enumerate([*ports, *ports]):  # behind a load balancer: any worker gets any update
            update = tg.push_text(42, 42, f"m{n}")
            assert await post_update(http, port, "/tg", update, secret) == 200
            assert await post_update(http, port, "/tg", update, secret) == 200  # Telegram retrying: dropped
        await tg.wait_sent(4, timeout=10)
        # A group's talk heard by one worker comes with the mention another one receives.
        said = tg.push_text(-100500, 41, "the meeting moved to 5pm", chat_type="group", username="bob")
        assert await post_update(http, ports[0], "/tg", said, secret) == 200
        mention = tg.push_text(-100500, 42, "@nanobot_test_bot when?", chat_type="group")
        assert await post_update(http, ports[1], "/tg", mention, secret) == 200
        await tg.wait_sent(5, timeout=10)
        await asyncio.sleep(0.3)
        assert texts(tg, 42) == [f"re: m{n}" for n in range(4)] and texts(tg, 41) == []
        assert texts(tg, -100500) == ["re: [said here since the last message to me:\n@bob: the meeting moved to 5pm]"
                                      "\nwhen?"]
    assert tg.webhook is not None  # not deleted at stop: other workers may still serve it
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_one_worker_holds_the_discord_connection_and_another_takes_it(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    from tests.fakes.discord_api import FakeDiscord

    llm.fallback = echo
    async with FakeDiscord() as dc:
        configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
        for config in configs:
            dc.connect(config, 7).streaming = False
        async with workers(configs[:1]) as first, workers(configs[1:]) as second:
            assert holder(first, "discord shard 0") == ["w1"] and holder(second, "discord shard 0") == []
            await dc.push_message(5, 7, "one", username="friend")
            await dc.wait_sent(1)
            await first["w1"].stop()
            async with asyncio.timeout(10):  # w2 connects once w1 let go
                while dc.identifies < 2:
                    await asyncio.sleep(0.02)
            await dc.wait_connected(timeout=10)
            await dc.push_message(5, 7, "two", username="friend")
            await dc.wait_sent(2)
            assert [m["content"] for m in dc.sent] == ["re: one", "re: two"]
            assert holder(second, "discord shard 0") == ["w2"] and dc.most_connections == 1


async def test_an_api_request_on_another_worker_than_its_chat_gets_the_reply(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """Behind a load balancer a conversation's requests land on any worker: the one holding
    the chat runs the turn, the one holding the request answers it (streamed or not)."""
    import openai

    from nanobot.api.keys import ApiKeys
    from tests.fakes.openai_server import delayed

    llm.fallback = lambda body: delayed(echo(body), 0.3)
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    for config in configs:
        config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with workers(configs, with_services=True) as gateways:
        key = await ApiKeys(gateways["w1"].runtime.db).add("ada", owner=True)
        clients = [openai.AsyncOpenAI(base_url=f"http://{c.gateway.api.listen}/v1", api_key=key, max_retries=0,
                                      timeout=15, default_headers={"X-Nanobot-Session": "s1"}) for c in configs]
        first = asyncio.create_task(clients[0].chat.completions.create(
            model="nanobot", messages=[{"role": "user", "content": "one"}]))
        await asyncio.wait_for(llm.request_event.wait(), 10)  # w1 holds the chat and runs its turn
        second = await clients[1].chat.completions.create(model="nanobot",
                                                          messages=[{"role": "user", "content": "two"}])
        assert (await first).choices[0].message.content == "re: one"
        assert second.choices[0].message.content == "re: two"
        stream = await clients[1].chat.completions.create(
            model="nanobot", messages=[{"role": "user", "content": "three"}], stream=True)
        assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "re: three"
        assert gateways["w1"].cluster.router.held == {"api:ada:s1"}
        assert not gateways["w2"].cluster.router.held
        on_w2 = {"Authorization": f"Bearer {key}", "X-Nanobot-Session": "s1"}
        async with aiohttp.ClientSession() as http:  # the page's status view lists the workers
            async with http.get(f"http://{configs[1].gateway.api.listen}/v1/nanobot/status",
                                headers=on_w2) as status:
                lines = (await status.json())["lines"]
            assert "Workers:   2 alive" in lines and any(line.startswith("  w1 (host ") and "1 chat(s)" in line
                                                          for line in lines), lines

            async def history_on_w2() -> list[str]:
                async with http.get(f"http://{configs[1].gateway.api.listen}/v1/nanobot/history",
                                    headers=on_w2) as response:
                    return [m["content"] for m in (await response.json())["messages"]]

            await gateways["w1"].runtime.sessions.flush()
            assert (await history_on_w2())[-2:] == ["three", "re: three"]
            await clients[0].chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "four"}])
            await gateways["w1"].runtime.sessions.flush()  # written behind: committed now
            assert (await history_on_w2())[-2:] == ["four", "re: four"]  # read afresh, not w2's old copy
            for config in configs:  # a new conversation's first reply, spoken, in code mode (nothing is sent
                config.tools.speech.provider, config.tools.speech.reply = "openai", "always"  # before its answer)
                config.agents.defaults.execution_mode = "code"
            async with http.post(f"http://{configs[1].gateway.api.listen}/v1/chat/completions",
                                 headers={**on_w2, "X-Nanobot-Session": "s2"},
                                 json={"model": "nanobot", "messages": [{"role": "user", "content": "five"}]}) as resp:
                [voice] = (await resp.json())["nanobot"]["asides"]  # it was closed at the answer, without it
            assert voice["file"]["name"] == "reply.ogg" and "api:ada:s2" in gateways["w2"].cluster.router.held


async def test_a_cron_prompt_job_runs_in_its_chat_wherever_that_is_held(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    llm.fallback = echo
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs, with_services=True) as gateways:
        [clock] = holder(gateways, "cron clock")
        [other] = set(gateways) - {clock}
        tg.push_text(41, 41, "hello")
        await tg.wait_sent(1, timeout=10)
        chat = "telegram:41"
        if chat in gateways[clock].cluster.router.held:  # the chat must be held by the other worker
            await gateways[clock].cluster.router.release(chat)
            await gateways[other].cluster.router.pull(chat, claim=True)
        assert chat in gateways[other].cluster.router.held
        job = await add_cron_job(  # asked on one worker, run by the clock's
            gateways[other].cron_jobs.service, owner_session=chat, schedule_kind="every", expression="3600",
            payload_kind="prompt", payload="report please")
        run = await gateways[other].runtime.cron_runs.run(job.id, 15)
        assert run.status == "ok" and run.output_excerpt == "re: report please"
        await tg.wait_sent(2, timeout=10)
        assert texts(tg, 41) == ["re: hello", "re: report please"]
        llm.script(error(400, message="no such model"))  # a failed turn is a failed run, there too
        run = await gateways[other].runtime.cron_runs.run(job.id, 15)
        assert run.status == "error" and "no such model" in run.output_excerpt


async def test_a_code_jobs_output_for_an_api_chat_is_kept_by_the_worker_holding_it(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A job's output for a page or API chat (nobody to message) goes into the chat's history
    on the worker holding the chat: its reader there and its next turn see it. Before, the cron
    clock's worker wrote it into the table behind the holder's back, and the holder's copy of
    the chat never had it."""
    import openai

    from nanobot.api.keys import ApiKeys

    llm.fallback = echo
    configs = {f"w{i}": worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)}
    for config in configs.values():
        config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with workers(list(configs.values()), with_services=True) as gateways:
        [clock] = holder(gateways, "cron clock")
        [other] = set(gateways) - {clock}
        key = await ApiKeys(gateways[other].runtime.db).add("ada", owner=True)
        client = openai.AsyncOpenAI(base_url=f"http://{configs[other].gateway.api.listen}/v1", api_key=key,
                                    max_retries=0, timeout=15, default_headers={"X-Nanobot-Session": "s1"})

        async def say(text: str) -> str:
            answer = await client.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": text}])
            return answer.choices[0].message.content

        assert await say("hello") == "re: hello"
        chat = "api:ada:s1"
        assert gateways[other].cluster.router.held == {chat}
        job = await add_cron_job(gateways[other].cron_jobs.service, owner_session=chat, schedule_kind="every",
                                 expression="3600", payload_kind="code", payload="print('TEA-READY')")
        run = await gateways[other].runtime.cron_runs.run(job.id, 15)  # the clock's worker runs it
        assert run.status == "ok" and run.output_excerpt == "TEA-READY"
        kept = gateways[other].runtime.sessions.get(chat)  # the holder's copy of the chat
        await until(lambda: any(m["content"] == "TEA-READY" for m in kept.messages))
        async with aiohttp.ClientSession() as http:  # its reader there sees it
            async with http.get(f"http://{configs[other].gateway.api.listen}/v1/nanobot/history",
                                headers={"Authorization": f"Bearer {key}", "X-Nanobot-Session": "s1"}) as response:
                assert [m["content"] for m in (await response.json())["messages"]][-1] == "TEA-READY"
        assert await say("and now?") == "re: and now?"
        assert any("TEA-READY" in m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] == "assistant")


async def test_what_waited_in_a_terminal_chat_held_elsewhere_is_shown_once(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """``nanobot agent`` shows what was kept for its reader while away, once: the mark is made by
    the worker holding the chat. Made by the terminal's own worker, it went behind the holder's
    back (and the fence refuses that since): the messages were shown again at every start."""
    llm.fallback = echo
    configs = {f"w{i}": worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)}
    async with workers(list(configs.values()), with_services=True) as gateways:
        [clock] = holder(gateways, "cron clock")
        job = await add_cron_job(gateways[clock].cron_jobs.service, owner_session="cli:default",
                                 schedule_kind="every", expression="3600", payload_kind="code",
                                 payload="print('BACKUP-DONE')")
        assert (await gateways[clock].runtime.cron_runs.run(job.id, 15)).status == "ok"

        async def waiting_there(count: int) -> bool:  # in the holder's copy of the chat
            held = [gw for gw in gateways.values() if gw.cluster.router.holds("cli:default")]
            return bool(held) and len((await held[0].runtime.sessions.open("cli:default")).meta.waiting) == count

        await until(lambda: waiting_there(1))
        [elsewhere] = [name for name, gw in gateways.items() if not gw.cluster.router.holds("cli:default")]
        connector = aiohttp.UnixConnector(path=str(configs[elsewhere].home / "api.sock"))
        async with aiohttp.ClientSession(connector=connector) as http:

            async def shown_at_start() -> list[str]:
                async with http.post("http://gateway/v1/nanobot/waiting",
                                     headers={"X-Nanobot-Session": "cli:default"}) as response:
                    return (await response.json())["messages"]

            shown: list[str] = []

            async def shown_there() -> bool:  # once the holder has written it down (in memory first)
                shown[:] = await shown_at_start()
                return bool(shown)

            await until(shown_there)
            assert shown == ["BACKUP-DONE"]
            await until(lambda: waiting_there(0))

            async def not_shown_again() -> bool:  # the mark, in the holder's memory first, is written behind
                return await shown_at_start() == []

            await until(not_shown_again)  # (shown again at every start, before: this waited for ever)


async def test_a_chat_that_moves_keeps_its_replies_in_order(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A worker whose reply Telegram told to wait (429) lets the quiet chat go, and another takes
    it: that one's turns wait until the first reply is out, so the chat reads in order (before,
    the next message's answer went out first)."""
    llm.fallback = echo
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs) as gateways:
        chat = "telegram:41"
        tg.fail_sends(1, retry_after=2)
        tg.push_text(41, 41, "one")
        await tg.wait_calls("sendMessage", 1, timeout=10)  # answered, recorded, refused once: waiting 2 s
        [first] = [name for name, gw in gateways.items() if chat in gw.cluster.router.held]
        [other] = set(gateways) - {first}
        await gateways[first].cluster.router.release(chat)  # quiet: its message is answered
        assert chat not in gateways[first].cluster.router.held
        await gateways[other].cluster.router.pull(chat, claim=True)
        assert chat in gateways[other].cluster.router.held
        tg.push_text(41, 41, "two")
        await tg.wait_sent(2, timeout=10)
    assert texts(tg, 41) == ["re: one", "re: two"]


async def test_the_webhook_serves_one_gateway_on_sqlite_too(llm, tg, workspace: Path, fast) -> None:
    llm.fallback = echo
    config = telegram_gateway_config(llm.base_url, workspace, tg, 41)
    config.channels.telegram.streaming = False
    port = free_port()
    config.channels.telegram.webhook = TelegramWebhook(url="https://bot.example.org/hook/x",
                                                       listen=f"127.0.0.1:{port}", secret_token="x" * 16)
    async with running_gateway(config), aiohttp.ClientSession() as http:
        update = tg.push_text(41, 41, "hi")
        assert await post_update(http, port, "/hook/x", update) == 401
        assert await post_update(http, port, "/hook/x", update, "x" * 16) == 200
        assert await tg.wait_sent(1) and texts(tg, 41) == ["re: hi"]
        assert await post_update(http, port, "/hook/x", b"{not json", "x" * 16) == 400
        poll = {"id": "1", "question": "?", "type": "regular", "total_voter_count": 0, "is_closed": False,
                "is_anonymous": True, "allows_multiple_answers": False, "options": []}  # as older Bot APIs sent it
        unreadable = tg.push_message(41, 41, poll=poll)  # a shape this python-telegram-bot does not read
        assert await post_update(http, port, "/hook/x", unreadable, "x" * 16) == 200  # else sent again for ever


async def test_an_approved_user_is_welcomed_once_whatever_the_number_of_workers(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """Periodic services (approval notices, the heartbeat, pruning) tick on one worker only."""
    from nanobot.access import WELCOME

    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2, 3)]
    async with workers(configs, with_services=True) as gateways:
        pairing = gateways["w3"].runtime.pairing
        code = await pairing.request("telegram", "77", "mallory", "77")
        await pairing.approve(code)
        await tg.wait_sent(1, timeout=10)
        await asyncio.sleep(0.5)  # ten more ticks on each worker
        assert texts(tg, 77) == [WELCOME]
        assert len(holder(gateways, "pairing welcome")) == 1


async def test_a_worker_cut_off_from_the_database_stops_its_turns_and_another_answers(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A worker whose line breaks is taken for dead at once: it must not finish a turn the
    new holder runs again (the user would get two answers)."""
    from tests.fakes.openai_server import delayed

    first_call = asyncio.Event()

    def model(body: dict) -> dict:
        if not first_call.is_set():  # the first attempt hangs on w1
            first_call.set()
            return delayed(echo(body), 1.5)
        return echo(body)

    llm.fallback = model
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs) as gateways:
        tg.push_text(41, 41, "question")
        await asyncio.wait_for(first_call.wait(), 10)
        [cut] = [name for name, gw in gateways.items() if "telegram:41" in gw.cluster.router.held]
        [other] = set(gateways) - {cut}
        db = await PostgresDatabase.open(pg_url)
        try:
            await db.execute("SELECT pg_terminate_backend($1)", gateways[cut].cluster.line.backend[0])
        finally:
            await db.close()
        await tg.wait_sent(1, timeout=10)
        await asyncio.sleep(2)  # past the moment the cut-off worker's hung model call returns
        assert texts(tg, 41) == ["re: question"]
        assert [name for name, gw in gateways.items() if "telegram:41" in gw.cluster.router.held] in ([other], [cut])


async def test_a_worker_with_another_workspace_refuses_to_start(llm, tg, pg_url: str, workspace: Path,
                                                                tmp_path: Path, fast) -> None:
    """Memory and files live in the workspace: a worker whose workspace differs from the one the
    assistant's first worker recorded would silently split them, so it refuses in one line."""
    from nanobot.cluster.registry import OtherWorkspace, worker_lines

    first = worker_config(llm, workspace, tg, pg_url, "w1", tmp_path)
    elsewhere = worker_config(llm, tmp_path / "its-own-workspace", tg, pg_url, "w2", tmp_path)
    async with workers([first]) as gateways:
        with pytest.raises(OtherWorkspace) as refused:
            async with running_gateway(elsewhere):
                pass
        assert str(refused.value).startswith("agents.defaults.workspace: this worker's is ")
        assert str(workspace) in str(refused.value) and "\n" not in str(refused.value)
        lines = await worker_lines(gateways["w1"].runtime.db)
        assert any(line.startswith("  w1 (host ") and line.endswith(f"workspace {workspace}") for line in lines), lines


async def test_one_worker_holds_slacks_socket_and_one_reads_the_mailbox(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """Two workers: one Socket Mode connection and one IMAP reader between them; when the
    holder stops, the other takes both over, and every message is answered once."""
    from nanobot.config import EmailConfig, SlackConfig
    from tests.fakes.mail_servers import DOVECOT, Dovecot, SmtpReceiver, email_section, plain_text
    from tests.fakes.slack_api import FakeSlack
    from tests.test_email import mail

    if DOVECOT is None:
        pytest.skip("the email tests need a real IMAP server: apt-get install dovecot-imapd")
    llm.fallback = echo
    async with asyncio.timeout(60), FakeSlack() as slack, Dovecot() as imap, SmtpReceiver() as smtp:
        configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
        for config in configs:
            config.channels.slack = SlackConfig.model_validate({**slack.section(), "streaming": False})
            config.channels.email = EmailConfig.model_validate(email_section(imap, smtp))
        async with workers(configs[:1]) as first, workers(configs[1:]) as second:
            assert holder(first, "slack socket mode") == ["w1"] and holder(second, "slack socket mode") == []
            assert holder(first, "email reader") == ["w1"] and holder(second, "email reader") == []
            await slack.push_message("D1", "U42", "one")
            await imap.deliver(bytes(mail("bob@example.org", "first", "mail one")))
            await slack.wait_posted(1)
            await smtp.wait_sent(1)
            await first["w1"].stop()
            await slack.wait_until(lambda: slack.connections == 2 and len(slack.open_sockets) == 1, timeout=10)
            await slack.push_message("D1", "U42", "two")
            await imap.deliver(bytes(mail("bob@example.org", "second", "mail two")))
            await slack.wait_posted(2)
            await smtp.wait_sent(2, timeout=30)  # the reader taken over, the mail read: slow under load
            assert [m["text"] for m in slack.posted] == ["re: one", "re: two"]
            assert [plain_text(m).replace("\r\n", "\n").strip() for m in smtp.sent] == [
                "re: first\n\nmail one", "re: second\n\nmail two"]
            assert holder(second, "slack socket mode") == ["w2"] and holder(second, "email reader") == ["w2"]


async def test_a_worker_whose_line_is_down_takes_nothing_over_and_nothing_is_answered_twice(
        llm, tg, pg_server: str, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """The red team's PostgreSQL restart, made exact: w1's line breaks and cannot come back for
    a while, though its pool still works (a restart reconnects the pool first). w1 must take
    nothing over meanwhile (it is dead to the others), and once rejoined hold exactly what its
    leases say: every message answered once, in order. w1 connects as a role of its own, which
    alone is kept out (w2 may need a new connection meanwhile, on a loaded machine more so)."""
    import asyncpg

    llm.fallback = echo
    role = f"w1_{urlsplit(pg_url).path.lstrip('/')}"
    admin = await asyncpg.connect(pg_server)  # another database than the workers'
    await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
    w1_url = pg_url.replace("postgres:@", f"{role}@", 1)
    configs = [worker_config(llm, workspace, tg, url, name, tmp_path) for name, url in (("w1", w1_url), ("w2", pg_url))]
    sent = 0

    async def round_of_messages(tag: str) -> None:
        nonlocal sent
        for chat in CHATS:
            tg.push_text(chat, chat, f"{chat}-{tag}")
        sent += len(CHATS)
        await tg.wait_sent(sent, timeout=30)

    try:
        async with workers(configs) as gateways:
            await round_of_messages("before")
            w1 = gateways["w1"].cluster
            await admin.execute(f"ALTER ROLE {role} NOLOGIN")  # w1's line cannot come back
            await admin.execute("SELECT pg_terminate_backend($1)", w1.line.backend[0])
            await asyncio.wait_for(w1.line.lost.wait(), 10)
            for n in range(2):  # w1's sweep runs about once a second meanwhile
                await round_of_messages(f"gap{n}")
                await asyncio.sleep(1.2)
            assert w1.router.held == set()  # cut off: took nothing over
            await admin.execute(f"ALTER ROLE {role} LOGIN")
            await asyncio.wait_for(w1.joined.wait(), 30)
            for n in range(2):
                await round_of_messages(f"after{n}")
            await asyncio.sleep(1.0)  # a second answer would come now
            held = [gw.cluster.router.held for gw in gateways.values()]
            assert not held[0] & held[1]
    finally:
        await admin.execute(f"ALTER ROLE {role} LOGIN")
        await admin.close()
    tags = ["before", "gap0", "gap1", "after0", "after1"]
    for chat in CHATS:
        assert texts(tg, chat) == [f"re: {chat}-{tag}" for tag in tags]


async def test_a_reply_is_recorded_only_while_its_worker_holds_the_chat(pg_url: str) -> None:
    """The fence on a reply: a worker whose chat went to another while its turn ran (cut off
    from the database for a while, as after a restart) records no reply for it; the new holder
    runs the message again and answers it, once."""
    from nanobot.bus import InboundMessage, OutboundMessage
    from nanobot.cluster.leases import ChatLeases
    from nanobot.cluster.registry import MIGRATIONS
    from nanobot.delivery.store import DeliveryStore
    from nanobot.postgres import PostgresDatabase

    db = await PostgresDatabase.open(pg_url)
    try:
        await db.migrate("workers", MIGRATIONS)
        store = await DeliveryStore.open(db, worker="w1")
        [intake] = await store.record_inbound([InboundMessage("telegram", "41", "41", "hi", delivery_key="u1")])
        assert await ChatLeases(db, "w2").claim("telegram:41")  # w2 holds it now
        assert await store.record_outbound(OutboundMessage("telegram", "41", "late"), finishes=intake) is None
        assert await store.unfinished_inbound()  # still to be answered, by w2
        await db.execute("DELETE FROM chat_leases")
        assert await ChatLeases(db, "w1").claim("telegram:41")
        assert await store.record_outbound(OutboundMessage("telegram", "41", "mine"), finishes=intake) is not None
        assert not await store.unfinished_inbound()
        await store.close()
    finally:
        await db.close()


async def test_a_fresh_workspace_is_not_taken_for_the_assistants_and_set_workspace_records_one(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, home: Path, fast) -> None:
    """The database holds the assistant's history (a home moved in), no workspace recorded yet,
    and a worker's path is wrong: the workspace it just made from the template is refused, not
    recorded for good; `nanobot db set-workspace PATH` records the right one."""
    import json

    from nanobot.runtime import open_runtime
    from tests.test_cli import nanobot

    llm.fallback = echo
    moved = worker_config(llm, workspace, tg, pg_url, "w0", tmp_path)
    async with open_runtime(moved) as rt:  # the history, as `db migrate` leaves it: no worker ran
        await rt.agent.handle("telegram:41", "remember me")
    wrong = worker_config(llm, tmp_path / "not-made-yet", tg, pg_url, "w1", tmp_path)
    with pytest.raises(OtherWorkspace) as refused:
        async with running_gateway(wrong):
            pass
    assert "did not exist and was just made from the template" in str(refused.value)
    assert f"nanobot db set-workspace {tmp_path / 'not-made-yet'}" in str(refused.value)
    (home / "config.json").write_text(json.dumps({"database": {"url": pg_url}}))
    code, out, err = await nanobot("db", "set-workspace", str(workspace), home=home)
    assert code == 0 and f"The assistant's workspace is {workspace} (it was not recorded)" in out, err
    right = worker_config(llm, workspace, tg, pg_url, "w2", tmp_path)
    async with running_gateway(right):
        tg.push_text(41, 41, "still there?")
        await tg.wait_sent(1, timeout=15)


@asynccontextmanager
async def history_locked(pg_url: str) -> AsyncIterator[Any]:
    """Reads of the chats' histories wait (a lock on the table) until the block ends; yields the
    locking connection."""
    import asyncpg

    locker = await asyncpg.connect(pg_url)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE history IN ACCESS EXCLUSIVE MODE")
            yield locker
    finally:
        await locker.close()


async def cut_while_loading(locker: Any, gateways: dict, chat: str) -> None:
    """Once a read of ``chat``'s history waits, break its holder's line and wait until it lets the chat go."""
    while not await locker.fetchval("SELECT count(*) FROM pg_locks WHERE relation = 'history'::regclass "
                                    "AND NOT granted"):
        await asyncio.sleep(0.05)
    [cut] = [name for name, gw in gateways.items() if chat in gw.cluster.router.held]
    await locker.execute("SELECT pg_terminate_backend($1)", gateways[cut].cluster.line.backend[0])
    while chat in gateways[cut].cluster.router.held:
        await asyncio.sleep(0.05)


async def test_a_worker_cut_off_while_it_reads_a_chats_history_hands_none_of_its_messages_on(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """The chat is let go while its messages wait for the chat's history (held back here by a
    lock on the table): the worker must hand nothing more of it to its turns, which the new
    holder runs too."""
    llm.fallback = echo
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs) as gateways:
        async with history_locked(pg_url) as locker:
            tg.push_text(41, 41, "one")
            tg.push_text(41, 41, "two")
            await cut_while_loading(locker, gateways, "telegram:41")
        await tg.wait_sent(2, timeout=20)
        await asyncio.sleep(1)  # a second answer, or a second model call, would come now
    assert texts(tg, 41) == ["re: one", "re: two"]
    asked = [m["content"] for r in llm.chat_requests for m in r["messages"][-1:]]
    assert sorted(asked) == ["one", "two"], asked


async def test_a_turn_cut_off_while_it_loads_the_chat_is_not_taken_for_a_crash(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """API messages are received where their chat is claimed, so the turn itself loads the chat:
    let go then, the turn must end as cancelled, not as a crashed turn after which the worker
    goes on with the next message of its queue (run again by whoever holds the chat next)."""
    import openai

    from nanobot.api.keys import ApiKeys

    llm.fallback = echo
    config = worker_config(llm, workspace, tg, pg_url, "w1", tmp_path)
    config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with workers([config], with_services=True) as gateways:
        key = await ApiKeys(gateways["w1"].runtime.db).add("ada", owner=True)
        client = openai.AsyncOpenAI(base_url=f"http://{config.gateway.api.listen}/v1", api_key=key, max_retries=0,
                                    timeout=30, default_headers={"X-Nanobot-Session": "s1"})
        async with history_locked(pg_url) as locker:
            asking = [asyncio.create_task(client.chat.completions.create(
                model="nanobot", messages=[{"role": "user", "content": text}])) for text in ("one", "two")]
            await cut_while_loading(locker, gateways, "api:ada:s1")
        answers = await asyncio.wait_for(asyncio.gather(*asking), 20)  # the worker is back, and holds it again
        assert [a.choices[0].message.content for a in answers] == ["re: one", "re: two"]
        await asyncio.sleep(1)  # a third model call would come now
    asked = [r["messages"][-1]["content"] for r in llm.chat_requests]
    assert sorted(asked) == ["one", "two"], asked


async def test_a_takeover_cut_off_half_way_holds_no_chat_without_its_lease(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A sweep takes over a dead worker's chats one after another, adopting each one's unsent
    replies. When the line breaks (and the worker rejoins) while the first chat's replies wait
    (held back here by a row lock), the chats after it are not the worker's any more: holding one
    without its lease, it ran that chat's turns beside the chat's real holder (found by the restart
    test under load: two workers served one chat, and one's turns went into the other's history)."""
    import asyncpg

    llm.fallback = echo
    async with workers([worker_config(llm, workspace, tg, pg_url, "w1", tmp_path)]) as gateways:
        w1 = gateways["w1"].cluster
        locker, admin = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
        try:
            # w0: a worker that is alive (its line is the locker's connection) and holds two chats
            await locker.execute(
                "INSERT INTO workers (id, host, pid, backend_pid, backend_start, started, heartbeat, expires) "
                "SELECT 'w0', 'gone', 0, pid, backend_start, 0, 0, nanobot_now() + 3600 FROM pg_stat_activity "
                "WHERE pid = pg_backend_pid()")
            for chat in CHATS[:2]:
                await locker.execute("INSERT INTO chat_leases VALUES ($1, 'w0', 0)", f"telegram:{chat}")
                await locker.execute("INSERT INTO outbox (channel, chat_id, kind, content, metadata, created, worker) "
                                     "VALUES ('telegram', $1, 'text', 'left by w0', '{}', 0, 'w0')", str(chat))
            async with locker.transaction():
                await locker.execute("SELECT 1 FROM outbox WHERE worker = 'w0' FOR UPDATE")
                await admin.execute("UPDATE workers SET backend_start = backend_start - interval '1 s' "
                                    "WHERE id = 'w0'")  # w0 dies (and is not fenced: that would end the lock)
                while not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                               "AND query LIKE 'UPDATE outbox SET worker%'"):
                    await asyncio.sleep(0.05)  # w1 took both over, and adopts the first one's reply
                cut = w1.line.backend
                await admin.execute("SELECT pg_terminate_backend($1)", cut[0])
                while w1.line.backend in (cut, None) or not w1.joined.is_set():
                    await asyncio.sleep(0.02)  # until it rejoined (on a new line): it holds no chat now
            await tg.wait_sent(2, timeout=20)  # both replies go out, once
            await asyncio.sleep(1.5)  # a sweep or two
            leased = {r["chat"] for r in await admin.fetch("SELECT chat FROM chat_leases WHERE worker = 'w1'")}
            assert w1.router.held == leased
        finally:
            await locker.close()
            await admin.close()
    assert sorted(m["chat_id"] for m in tg.sent) == list(CHATS[:2])


async def test_what_a_cut_off_turn_left_unwritten_never_reaches_the_chats_history(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A worker queues a turn's history records while the database is away, and writes them when
    it is back. Cut off meanwhile, the chat is another worker's, which runs the message again:
    the first worker's records, written late, went into the history the new holder reads (it
    then answered one message with the text of another). Held back here by a lock on the table."""
    first_try = asyncio.Event()

    def model(body: dict) -> dict:
        if body["messages"][-1]["content"] == "two" and not first_try.is_set():
            first_try.set()
            return reply("re: two (first try)")
        return echo(body)

    llm.fallback = model
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs) as gateways:
        tg.push_text(41, 41, "one")
        await tg.wait_sent(1, timeout=20)
        async with history_locked(pg_url) as locker:
            tg.push_text(41, 41, "two")
            [cut] = [gw for gw in gateways.values() if "telegram:41" in gw.cluster.router.held]
            while not cut.runtime.sessions.get("telegram:41").messages[-1]["content"].endswith("(first try)"):
                await asyncio.sleep(0.02)  # its records wait behind the lock
            await locker.execute("SELECT pg_terminate_backend($1)", cut.cluster.line.backend[0])
            while "telegram:41" in cut.cluster.router.held:
                await asyncio.sleep(0.02)
        await tg.wait_sent(2, timeout=20)
        await asyncio.sleep(1)  # the cut-off worker's records would land now
        records = await history_rows(pg_url, "telegram:41")
    assert texts(tg, 41) == ["re: one", "re: two"]
    assert not any("first try" in record for record in records)


async def history_rows(pg_url: str, chat: str) -> list[str]:
    """The chat's history as the table holds it (what its next holder reads)."""
    db = await PostgresDatabase.open(pg_url)
    try:
        return [r[0] for r in await db.fetch("SELECT record FROM history WHERE session_key = $1", chat)]
    finally:
        await db.close()


async def test_a_worker_taken_for_dead_mid_turn_writes_nothing_into_the_chats_history(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A frozen worker (a paused VM, a stalled process) whose chat another took over may wake in
    the middle of a turn, its connections still open: the turn's records must not go into the
    history the chat's new holder reads (its reply was refused already; its records were not).
    Made here by changing the worker's row as its death would, leaving its connections be."""
    import asyncpg

    first_try, go_on = asyncio.Event(), asyncio.Event()

    def model(body: dict) -> Any:
        if asked(body) == "two" and not first_try.is_set():
            first_try.set()

            async def after_the_takeover() -> dict:
                await go_on.wait()
                return reply("re: two (first try)")
            return after_the_takeover()
        return echo(body)

    llm.fallback = model
    chat = "telegram:41"
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    async with workers(configs) as gateways:
        tg.push_text(41, 41, "one")
        await tg.wait_sent(1, timeout=20)
        [frozen] = [name for name, gw in gateways.items() if chat in gw.cluster.router.held]
        tg.push_text(41, 41, "two")
        await asyncio.wait_for(first_try.wait(), 20)
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute("UPDATE workers SET backend_start = backend_start - interval '1 s' WHERE id = $1",
                                frozen)  # dead to the others: its line is not the one it registered
            await tg.wait_sent(2, timeout=20)  # the other worker took the chat and answered
            go_on.set()
            session = gateways[frozen].runtime.sessions.get(chat)
            await until(lambda: session.messages[-1]["content"] == "re: two (first try)")
            await session.sync_soon()  # its records were written, or refused
        finally:
            await admin.close()
        records = await history_rows(pg_url, chat)
    assert texts(tg, 41) == ["re: one", "re: two"]
    assert not any("first try" in record for record in records)


async def test_a_background_task_on_another_worker_reads_its_chat_afresh(
        llm, tg, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:
    """A task runs on any worker, with its chat's settings (and trust) read from the chat's
    history. A worker that had read the chat for an earlier task kept that copy, and ran the next
    task with what the chat said then: here the model before the chat's ``/model big``; a chat
    that changed hands (a Matrix room grown into a group) with its old party's trust. w1 holds
    the chat and is kept busy with a task of another chat, so w2 runs the chat's tasks."""
    from nanobot.config import ModelChoice
    from tests.test_pg_restart import queue_task

    hold = asyncio.Event()

    async def model(body: dict) -> dict:
        if asked(body).startswith("TASK hold"):
            await hold.wait()
        return reply(f"RESULT of {asked(body)}")

    llm.fallback = model
    configs = [worker_config(llm, workspace, tg, pg_url, f"w{i}", tmp_path) for i in (1, 2)]
    for config in configs:
        config.agents.models = {"big": ModelChoice(provider="openai", model="big-model")}
    configs[0].agents.defaults.tasks.max_total = 1  # busy with one task, it takes no other
    configs[0].gateway.idle_worker_seconds = 3600  # and it keeps the chat
    try:
        async with workers(configs[:1], with_services=True) as first:
            await queue_task(pg_url, "TASK hold", chat=f"telegram:{CHATS[1]}")
            await until(lambda: asks(llm, "TASK hold"))
            tg.push_text(41, 41, "/model big")
            await tg.wait_sent(1, timeout=20)
            assert first["w1"].cluster.router.held == {"telegram:41"}, texts(tg, 41)
            async with workers(configs[1:], with_services=True):
                await queue_task(pg_url, "TASK one")
                await tg.wait_until(lambda: any("RESULT of TASK one" in t for t in texts(tg, 41)), timeout=30)
                tg.push_text(41, 41, "/model default")
                await tg.wait_sent(3, timeout=20)
                await first["w1"].runtime.sessions.get("telegram:41").sync_soon()
                await queue_task(pg_url, "TASK two")
                await tg.wait_until(lambda: any("RESULT of TASK two" in t for t in texts(tg, 41)), timeout=30)
    finally:
        hold.set()
    models = {asked(body).split("\n")[0]: body["model"] for body in llm.chat_requests if asked(body).startswith("TASK")}
    assert models["TASK one"] == "big-model" and models["TASK two"] != "big-model", models
