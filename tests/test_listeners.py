"""What anyone who can reach a port may send: malformed bodies are a 400 (401 on the webhook)
and one log line, never a 500 or a traceback; stalled connections are closed in time while the
owner is served; an address in use is one line, exit 1."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from nanobot_channels.telegram_webhook import WebhookServer
from nanobot.api.keys import ApiKeys
from nanobot.config import TelegramWebhook
from tests.fakes.openai_server import reply
from tests.test_api import api, config, free_port, post  # noqa: F401  (fixtures)
from tests.test_cli import nanobot, write_config
from tests.helpers import fast_pace, running_gateway, until

SECRET = "s" * 24


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR or "Traceback" in r.getMessage()]
    assert not bad, [r.getMessage() for r in bad]


async def raw_post(url: str, body: bytes, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if resp.content_type == "application/json" else text


async def test_malformed_bodies_are_400_in_openais_shape(api: dict, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.INFO)
    owner = {"Authorization": f"Bearer {api['owner']}"}
    bodies = [b"[" * 500_000, b'{"model": "nanobot", "messages": [{"role": "user", "content": '
                                b'[{"type": "text", "text": 42}]}]}', b"\xff\xfe{}", b"[1]"]
    for body in bodies:
        status, answer = await raw_post(api["base"] + "/chat/completions", body, **owner)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error", (body[:40], answer)
    for body in (b"[1]", b"{not json", b'{"code": 7}', b"[" * 4000):
        status, answer = await raw_post(api["base"] + "/nanobot/pairing/approve", body, **owner)
        assert status == 400 and answer["error"]["message"], (body[:40], answer)
    no_tracebacks(caplog)
    assert sum("400" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records) == 8


async def test_the_webhook_refuses_bytes_that_are_not_utf8(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    received: list[dict] = []

    async def handle(update: dict) -> None:
        received.append(update)

    server = WebhookServer(TelegramWebhook(url="https://bot.example.org/tg", listen=f"127.0.0.1:{free_port()}",
                                          secret_token=SECRET), handle)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.listener.port)
        writer.write(b"POST /tg HTTP/1.1\r\nHost: x\r\nX-Telegram-Bot-Api-Secret-Token: \xff\xfe\xfd\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
        assert (await reader.read()).startswith(b"HTTP/1.1 401")
        writer.close()
        url = f"http://127.0.0.1:{server.listener.port}/tg"
        assert (await raw_post(url, b"[" * 500_000, **{"X-Telegram-Bot-Api-Secret-Token": SECRET}))[0] == 400
        assert (await raw_post(url, b'{"update_id": 1}', **{"X-Telegram-Bot-Api-Secret-Token": SECRET}))[0] == 200
    finally:
        await server.stop()
    assert received == [{"update_id": 1}]
    no_tracebacks(caplog)


SHORT_TIMEOUT_S = 1.0
LOADED_S = 30.0  # how much later than that a loaded machine may get to it (a bound, not a wait)


@pytest.fixture
async def impatient_api(config) -> AsyncIterator[dict[str, str]]:  # noqa: F811
    """The API, its requests given ``SHORT_TIMEOUT_S`` for their headers and their body."""
    async with running_gateway(config, with_services=True, pace=fast_pace(http_timeout_s=SHORT_TIMEOUT_S)) as gw:
        yield {"base": f"http://{config.gateway.api.listen}/v1", "owner": await ApiKeys(gw.runtime.db).add("ada", owner=True)}


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1024) == b""
    except ConnectionError:
        return True


async def test_stalled_connections_are_closed_while_the_owner_is_served(impatient_api: dict, llm) -> None:
    llm.fallback = lambda body: reply("served")
    host, port = impatient_api["base"].removeprefix("http://").removesuffix("/v1").split(":")
    stalled = []
    for _ in range(200):  # each stops in the middle of its headers, no key needed
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthor")
        stalled.append((reader, writer))
    reader, writer = await asyncio.open_connection(host, int(port))  # a body that never finishes
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + impatient_api["owner"].encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
    status, answer = await post(impatient_api, {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and answer["choices"][0]["message"]["content"] == "served"
    closed = await asyncio.wait_for(asyncio.gather(*(_closed(r) for r, _ in stalled)), SHORT_TIMEOUT_S + LOADED_S)
    assert all(closed)
    slow_body = await asyncio.wait_for(reader.read(4096), SHORT_TIMEOUT_S + LOADED_S)
    assert slow_body.startswith(b"HTTP/1.1 408") and b"request_timeout" in slow_body
    for _, w in [*stalled, (reader, writer)]:
        w.close()


async def test_a_key_has_only_so_many_uploads_under_way(api: dict) -> None:  # noqa: F811
    """An upload may take minutes from a phone, so its body has no short time limit: one key's
    uploads that never finish are held to UPLOADS_PER_KEY, not to as many as it opens."""
    from nanobot.api.chats import UPLOADS_PER_KEY

    host, port = api["base"].removeprefix("http://").removesuffix("/v1").split(":")
    slow = []
    for _ in range(UPLOADS_PER_KEY):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/nanobot/upload?name=a.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + api["member"].encode() + b"\r\nContent-Length: 100000\r\n\r\nthe start")
        slow.append(writer)

    async def refused() -> bool:
        status, answer = await raw_post(api["base"] + "/nanobot/upload?name=b.bin", b"small",
                                        Authorization=f"Bearer {api['member']}")
        return status == 429 and "uploads under way" in answer["error"]["message"]

    await until(refused, timeout=10)
    status, _ = await raw_post(api["base"] + "/nanobot/upload?name=c.bin", b"small",
                               Authorization=f"Bearer {api['owner']}")
    assert status == 200  # another key's are its own
    for writer in slow:
        writer.close()

    async def taken() -> bool:
        return (await raw_post(api["base"] + "/nanobot/upload?name=d.bin", b"small",
                               Authorization=f"Bearer {api['member']}"))[0] == 200

    await until(taken, timeout=10)  # a dropped upload frees its place


async def test_a_webhooks_stalled_body_is_ended_in_time(llm, workspace: Path) -> None:
    """Meta's and Slack's posts are read whole before their signature can be checked: anyone who
    can reach the port could hold connections open for ever with bodies that never finish."""
    from tests.fakes.slack_api import FakeSlack
    from tests.fakes.whatsapp_api import FakeWhatsApp
    from tests.test_slack import slack_config
    from tests.test_whatsapp import wa_config

    async with FakeWhatsApp() as wa, FakeSlack() as slack:
        config = slack_config(llm, workspace, slack, events=True)
        config.channels.whatsapp = wa_config(llm, workspace, wa).channels.whatsapp
        hooks = [config.channels.whatsapp.webhook, config.channels.slack.events]
        async with running_gateway(config, pace=fast_pace(http_timeout_s=SHORT_TIMEOUT_S)):
            for hook in hooks:
                reader, writer = await asyncio.open_connection(*hook.address())
                writer.write(f"POST {hook.path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: 1000\r\n\r\n{\"entry\":".encode())
                answer = await asyncio.wait_for(reader.read(4096), SHORT_TIMEOUT_S + LOADED_S)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


async def test_an_address_in_use_is_one_line(home: Path, workspace: Path, llm) -> None:
    port = free_port()
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
    write_config(home, workspace, llm.base_url)
    data = json.loads((home / "config.json").read_text())
    data["gateway"] = {"api": {"enabled": True, "listen": f"127.0.0.1:{port}"}, "heartbeat": {"enabled": False}}
    (home / "config.json").write_text(json.dumps(data))
    try:
        code, out, err = await nanobot("gateway", home=home)
    finally:
        blocker.close()
    assert code == 1
    assert f"gateway.api.listen: cannot listen on 127.0.0.1:{port}: " in err and "Traceback" not in err


async def test_a_keys_messages_and_its_other_requests_have_their_own_rates(api: dict, llm, config) -> None:  # noqa: F811
    """A page kept open (news every few seconds, each file a turn sends) never uses up the key's
    messages; a runaway reader still meets a limit: ten times requestsPerMinute."""
    llm.fallback = reply("ok")
    config.gateway.api.requests_per_minute = 3
    member = {"Authorization": f"Bearer {api['member']}"}
    ok = {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        async def read(n: int) -> int:
            async with http.get(api["base"] + "/nanobot/history", headers={**member, "X-Nanobot-Session": f"s{n}"}) as r:
                return r.status
        reads = [await read(n) for n in range(10)]
        messages = [(await post(api, ok, key="member"))[0] for _ in range(4)]
        reads += [await read(n) for n in range(10, 31)]
        async with http.get(api["base"] + "/models", headers=member) as r:
            reads.append(r.status)
    assert messages == [200, 200, 200, 429]
    assert reads == [200] * 30 + [429, 429]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


async def test_open_sessions_are_bounded_and_one_in_use_is_kept(database_url: str | None, home: Path) -> None:
    from nanobot.session_files import SessionStore
    from nanobot.session_rows import DatabaseSessionStore

    db = None
    if database_url is None:
        store = SessionStore(home / "sessions", max_open=5)
    else:
        from nanobot.postgres import PostgresDatabase

        db = await PostgresDatabase.open(database_url)
        store = await DatabaseSessionStore.create(db, max_open=5)
    try:
        held = await store.open("api:k:held")
        held.append({"role": "user", "content": "still here"})
        for n in range(50):
            (await store.open(f"api:k:s{n}")).append({"role": "user", "content": str(n)})
        await store.flush()
        await store.open("api:k:last")  # (in PostgreSQL one still writing stays until it has written)
        assert len(store._open) == 5  # noqa: SLF001  (the bound itself is what is tested)
        assert await store.open("api:k:held") is held and store.get("api:k:held") is held  # one object per chat
        held.append({"role": "user", "content": "and again"})
        await store.flush()
        assert [r["content"] for r in await store.records("api:k:held") if "role" in r] == ["still here", "and again"]
        assert [r["content"] for r in await store.records("api:k:s0") if "role" in r] == ["0"]
    finally:
        store.close()
        if db is not None:
            await db.close()


async def test_a_chat_let_go_while_its_records_wait_for_the_database_loses_none(pg_url: str) -> None:
    """Past ``max_open`` the least recently used chat is let go; one whose records still wait for
    the database (a locked or slow table) stays loaded until they are in: its next message must
    read them, and the shutdown's flush wait for them."""
    import asyncpg

    from nanobot.postgres import PostgresDatabase
    from nanobot.session_rows import DatabaseSessionStore

    db = await PostgresDatabase.open(pg_url)
    store, locker = await DatabaseSessionStore.create(db, max_open=2), await asyncpg.connect(pg_url)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE history IN EXCLUSIVE MODE")  # reads go on, inserts wait
            (await store.open("api:k:a")).append({"role": "user", "content": "kept"})
            for n in range(3):
                await store.open(f"api:k:other{n}")
            gc.collect()  # nothing but the store holds chat a now
            assert [m["content"] for m in (await store.open("api:k:a")).messages] == ["kept"]
        await store.flush()
        assert [r["content"] for r in await store.records("api:k:a") if "role" in r] == ["kept"]
    finally:
        await locker.close()
        store.close()
        await db.close()


async def test_a_webhook_address_in_use_is_one_line_too(home: Path, workspace: Path, llm, tg) -> None:
    port = free_port()
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
    write_config(home, workspace, llm.base_url)
    data = json.loads((home / "config.json").read_text())
    data["gateway"] = {"heartbeat": {"enabled": False}}
    data["channels"] = {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": ["1"],
                                     "webhook": {"url": "https://bot.example.org/tg", "listen": f"127.0.0.1:{port}",
                                                 "secretToken": SECRET}}}
    (home / "config.json").write_text(json.dumps(data))
    try:
        code, out, err = await nanobot("gateway", home=home)
    finally:
        blocker.close()
    assert code == 1, err
    assert f"channels.telegram.webhook.listen: cannot listen on 127.0.0.1:{port}: " in err and "Traceback" not in err
