"""The OpenAI-compatible API on a running gateway: the real ``openai`` client for the happy
paths, raw HTTP for the errors, canary files for what a member key must not reach."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import socket
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import openai
import pytest

from nanobot.api.channel import CLOSE_GRACE_S
from nanobot.api.keys import ApiKeys
from nanobot.config import Config
from tests.fakes.loopback import free_port
from tests.fakes.openai_server import FakeOpenAI, delayed, error, reply, tool_call
from tests.helpers import config_for, fast_pace, running_gateway
from tests.media_files import ogg_opus, png
from tests.test_cli import nanobot


def port_to_listen_again() -> int:
    """A free port below the kernel's ephemeral range (32768-60999 on Linux), for a listener a
    test kills and starts again: in between, a port from ``free_port`` may become the local
    port of anyone's outgoing connection, and the restart found it taken."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@pytest.fixture
def config(llm: FakeOpenAI, workspace: Path) -> Config:
    cfg = config_for(llm.base_url, workspace, mode="tools")
    cfg.gateway.heartbeat.enabled = False
    cfg.gateway.api.enabled = True
    cfg.gateway.api.listen = f"127.0.0.1:{free_port()}"
    return cfg


@pytest.fixture
async def api(config: Config) -> AsyncIterator[dict[str, str]]:
    """A running gateway with the API, an owner key and a member key."""
    async with running_gateway(config, with_services=True) as gateway:
        keys = ApiKeys(gateway.runtime.db)
        yield {"base": f"http://{config.gateway.api.listen}/v1", "owner": await keys.add("ada", owner=True),
               "member": await keys.add("bob"), "gateway": gateway}  # type: ignore[dict-item]


def client(api: dict, key: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=api["base"], api_key=key, default_headers=headers or None, max_retries=0)


async def post(api: dict, body: bytes | dict, key: str | None = "owner", **headers: str) -> tuple[int, dict]:
    auth = {"Authorization": f"Bearer {api[key] if key in api else key}"} if key else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(api["base"] + "/chat/completions", data=data,
                             headers={**auth, **headers, "Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json()


async def test_the_openai_client_chats_plain_and_streamed(api: dict, llm: FakeOpenAI) -> None:
    llm.script(reply("Hello Ada."), reply("You said hello, and I answered."))
    ai = client(api, api["owner"])
    assert [m.id for m in (await ai.models.list()).data] == ["nanobot", "nanobot-errands"]
    assert (await ai.models.retrieve("nanobot")).id == "nanobot"
    with pytest.raises(openai.NotFoundError):
        await ai.models.retrieve("gpt-4o")
    first = await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "hello"}])
    assert first.choices[0].message.content == "Hello Ada." and first.usage.total_tokens > 0
    stream = await ai.chat.completions.create(model="nanobot", stream=True, messages=[
        {"role": "user", "content": "ignored: the server keeps the history"},
        {"role": "user", "content": "what did I say?"}])
    pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices[0].delta.content]
    assert "".join(pieces) == "You said hello, and I answered."
    sent = [m["content"] for m in llm.chat_requests[1]["messages"] if m["role"] == "user"]
    assert sent == ["hello", "what did I say?"]  # the history is the server's
    llm.script(reply("Counted.", prompt_tokens=120, completion_tokens=7))
    stream = await ai.chat.completions.create(model="nanobot", stream=True, stream_options={"include_usage": True},
                                              messages=[{"role": "user", "content": "and the usage?"}])
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (120, 7)
    assert all(chunk.usage is None for chunk in chunks[:-1])  # only when asked, and only the last one
    llm.script(reply("Like this:\n```python show\nprint('hi')\n```"))  # tools mode, as the fixture's
    shown = await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "how?"}])
    assert shown.choices[0].message.content == "Like this:\n```python\nprint('hi')\n```"


async def test_each_session_header_is_its_own_chat(api: dict, llm: FakeOpenAI) -> None:
    llm.fallback = lambda body: reply(f"{len(body['messages'])} messages")
    one = client(api, api["member"], **{"X-Nanobot-Session": "one"})
    two = client(api, api["member"], **{"X-Nanobot-Session": "two"})
    for ai in (one, one, two):
        await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "hi"}])
    history = api["gateway"].runtime.sessions
    assert len((await history.open("api:bob:one")).messages) == 4 and len((await history.open("api:bob:two")).messages) == 2
    # Open WebUI names its chat when it forwards its headers (ENABLE_FORWARD_USER_INFO_HEADERS);
    # a temporary chat's id is no session name: the key's own chat
    chat = "3f9e2c1a-7b4d-4e8f-9a0b-1c2d3e4f5a6b"
    for header in (chat, chat, "local:Kx2pQ"):
        await client(api, api["member"], **{"X-OpenWebUI-Chat-Id": header}).chat.completions.create(
            model="nanobot", messages=[{"role": "user", "content": "hi"}])
    assert len((await history.open(f"api:bob:{chat}")).messages) == 4 and len((await history.open("api:bob")).messages) == 2


async def test_a_member_key_is_a_member_chat(api: dict, llm: FakeOpenAI, workspace: Path) -> None:
    """A member key's chat works in its own folder: the owner's files are out of its reach."""
    (workspace / "secret.txt").write_text("CANARY-owner-file")
    llm.script(tool_call("read_file", {"path": "secret.txt"}), lambda body: reply(body["messages"][-1]["content"]),
               tool_call("read_file", {"path": "secret.txt"}), lambda body: reply(body["messages"][-1]["content"]))
    member = await client(api, api["member"]).chat.completions.create(
        model="nanobot", messages=[{"role": "user", "content": "read secret.txt"}])
    assert "CANARY" not in member.choices[0].message.content
    owner = await client(api, api["owner"]).chat.completions.create(
        model="nanobot", messages=[{"role": "user", "content": "read secret.txt"}])
    assert "CANARY-owner-file" in owner.choices[0].message.content


async def test_errors_have_openais_shape(api: dict, config: Config) -> None:
    ok = {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]}
    assert (await post(api, ok, key=None))[0] == 401
    status, body = await post(api, ok, key="nb-not-a-key")
    assert status == 401 and body["error"]["code"] == "invalid_api_key" and body["error"]["type"]
    assert (await post(api, b"{not json"))[0] == 400
    assert (await post(api, {"model": "nanobot", "messages": []}))[0] == 400
    assert (await post(api, {**ok, "model": "gpt-9"}))[0] == 404
    status, body = await post(api, {**ok, "messages": [{"role": "user", "content": "x" * 2_000_000}]})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert "gateway.api.maxBodyKb" in body["error"]["message"] and "/v1/nanobot/upload" in body["error"]["message"]
    assert (await post(api, ok, **{"X-Nanobot-Session": "../etc"}))[0] == 400
    with pytest.raises(openai.AuthenticationError):
        await client(api, "nb-wrong").models.list()


async def test_a_revoked_key_stops_at_once(api: dict, llm: FakeOpenAI, home: Path) -> None:
    llm.fallback = lambda body: reply("ok")
    ok = {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]}
    assert (await post(api, ok, key="member"))[0] == 200
    assert await ApiKeys(api["gateway"].runtime.db).revoke("bob")
    assert (await post(api, ok, key="member"))[0] == 401


async def test_rate_and_budget_limits_answer_429(api: dict, llm: FakeOpenAI, config: Config) -> None:
    llm.fallback = lambda body: reply("ok")
    config.gateway.api.requests_per_minute = 2
    ok = {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]}
    assert [(await post(api, ok, key="member"))[0] for _ in range(3)] == [200, 200, 429]
    config.agents.defaults.daily_budget_usd = 0.0
    status, body = await post(api, ok)
    assert status == 429 and body["error"]["code"] == "insufficient_quota"


async def test_a_client_that_leaves_mid_stream_does_not_lose_the_reply(api: dict, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("a long answer, finished anyway"), 0.5), reply("next"))
    ai = client(api, api["owner"])
    task = asyncio.create_task(ai.chat.completions.create(model="nanobot", stream=True,
                                                         messages=[{"role": "user", "content": "go"}]))
    await asyncio.wait_for(llm.request_event.wait(), 5)
    task.cancel()  # the client hangs up while the model works
    await asyncio.gather(task, return_exceptions=True)
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "and?"}])
    session = await api["gateway"].runtime.sessions.open("api:ada")
    assert [m["content"] for m in session.messages if m["role"] == "assistant"] == [
        "a long answer, finished anyway", "next"]


async def test_the_keys_cli(home: Path) -> None:
    code, out, err = await nanobot("api", "keys", "add", "phone", "--owner", home=home)
    assert code == 0 and out.startswith("nb-") and "not shown again" in err
    key = out.strip()
    code, out, _ = await nanobot("api", "keys", "list", home=home)
    assert "phone  owner" in out and "active" in out and key not in out
    assert out.splitlines()[0].split() == ["NAME", "KIND", "MADE", "STATE"]  # columns, as cron list has
    assert (await nanobot("api", "keys", "add", "phone", home=home))[0] == 2  # taken
    assert (await nanobot("api", "keys", "revoke", "phone", home=home))[0] == 0
    assert "revoked" in (await nanobot("api", "keys", "list", home=home))[1]
    assert (await nanobot("api", "keys", "revoke", "phone", home=home))[0] == 1


async def test_listening_beyond_loopback_needs_a_key(config: Config) -> None:
    config.gateway.api.listen = f"0.0.0.0:{free_port()}"
    from nanobot.gateway import Gateway
    from nanobot.runtime import open_runtime

    async with open_runtime(config) as rt:
        gateway = Gateway(rt, with_services=True)
        try:
            with pytest.raises(RuntimeError, match="no API key exists: make one first"):
                await gateway.start()
        finally:
            await gateway.stop()


async def test_the_terminal_reaches_a_running_gateway_without_the_model_sdk(
        config: Config, llm: FakeOpenAI, home: Path) -> None:
    """``nanobot agent -m`` goes to the running gateway over $NANOBOT_HOME/api.sock (0600):
    the turn is the gateway's (its history, its loaded model client); the client imports no
    model SDK. ``--local`` runs in-process as before."""
    config.gateway.api.enabled = False  # the socket is there without the HTTP API
    llm.script(reply("from the gateway"), error(400, message="the model is gone"), reply("in-process"))
    async with running_gateway(config, with_services=True) as gateway:
        sock = home / "api.sock"
        assert sock.exists() and sock.stat().st_mode & 0o777 == 0o600
        code, out, err = await nanobot("agent", "-m", "hi", home=home, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert code == 0 and out == "from the gateway\n", err
        code, out, _ = await nanobot("agent", "-m", "and now?", home=home)  # a failed turn: exit 1, as in-process
        assert code == 1 and out.startswith("Sorry, I could not get an answer") and out.count("\n") == 1
        assert "openai" not in err and "pydantic" not in err  # the import log of the client process
        assert [m["content"] for m in (await gateway.runtime.sessions.open("cli:default")).messages][:2] == [
            "hi", "from the gateway"]
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(config.workspace_path), "model": "m", "executionMode": "tools"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}}}))
        code, out, err = await nanobot("agent", "--local", "-m", "again", home=home)
        assert code == 0 and out.strip() == "in-process", err
    assert not (home / "api.sock").exists()


async def test_stop_over_the_api_ends_the_running_turn(api: dict, llm: FakeOpenAI) -> None:
    """/stop is a chat command here too: the running request ends with the stop note, the
    /stop request with "Stopped.", at once (it waited out the grace a reply's trailing files get)."""
    llm.script(reply("Hello."), delayed(reply("too late"), 30))
    ai = client(api, api["owner"])
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "hello"}])
    llm.request_event.clear()  # (a reply was delivered to the chat before: the page's case)
    running = asyncio.create_task(ai.chat.completions.create(model="nanobot",
                                                             messages=[{"role": "user", "content": "slow"}]))
    await asyncio.wait_for(llm.request_event.wait(), 5)
    stop = await asyncio.wait_for(ai.chat.completions.create(
        model="nanobot", messages=[{"role": "user", "content": "/stop"}]), CLOSE_GRACE_S - 1)
    assert stop.choices[0].message.content == "Stopped."
    stopped = await asyncio.wait_for(running, CLOSE_GRACE_S - 1)
    assert "stopped" in stopped.choices[0].message.content.lower()


async def test_status_shows_the_api(home: Path) -> None:
    await nanobot("api", "keys", "add", "ada", "--owner", home=home)
    (home / "config.json").write_text(json.dumps({"gateway": {"api": {"enabled": True}}}))
    code, out, _ = await nanobot("status", home=home)
    assert "API:       http://127.0.0.1:8765/v1 when the gateway runs; 1 active key, 1 of them owner keys" in out


async def test_a_member_key_reaches_no_owner_page_and_no_other_chat(api: dict, llm: FakeOpenAI) -> None:
    llm.script(reply("the owner's plan"))
    await client(api, api["owner"]).chat.completions.create(model="nanobot",
                                                            messages=[{"role": "user", "content": "plan"}])
    root = api["base"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {api['member']}"}) as http:
        for method, path in (("GET", "/nanobot/status"), ("GET", "/nanobot/cron"), ("GET", "/nanobot/pairing"),
                             ("GET", "/nanobot/usage"), ("POST", "/nanobot/pairing/approve"),
                             ("POST", "/nanobot/pairing/revoke"), ("POST", "/nanobot/cron/x/run"),
                             ("POST", "/nanobot/cron/x/remove")):
            async with http.request(method, root + path, json={}) as resp:
                assert resp.status == 403, path
        async with http.get(root + "/nanobot/history", headers={"X-Nanobot-Session": "../ada"}) as resp:
            assert resp.status == 400
        async with http.get(root + "/nanobot/history") as resp:
            history = await resp.json()
        await api["gateway"].runtime.announce("New scheduled job made by api:bob")
        async with http.get(root + "/nanobot/news") as resp:
            assert "notices" not in await resp.json()  # how many the owner has: an owner key's alone
    assert history["chat"] == "api:bob" and "plan" not in json.dumps(history)


async def test_an_api_only_home_says_what_is_true(home: Path, workspace: Path, llm: FakeOpenAI,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """With only the API on: status names the owner key and where notices are (it waited for a
    private message none can send), and the gateway does not claim to run for cron and the
    heartbeat alone."""
    from tests.test_cli import write_config

    write_config(home, workspace, llm.base_url)
    data = json.loads((home / "config.json").read_text())
    data["gateway"] = {"api": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}, "heartbeat": {"enabled": False}}
    (home / "config.json").write_text(json.dumps(data))
    assert (await nanobot("api", "keys", "add", "ada", "--owner", home=home))[0] == 0
    code, out, _ = await nanobot("status", home=home)
    assert code == 0 and "Owners:    the API key ada\n           the terminal\n" in out
    assert "Notices:   not sent (no chat channel is enabled): in the log, on the page's Status view" in out
    config = Config.model_validate(data)
    config.agents.defaults.workspace = str(workspace)
    async with running_gateway(config, with_services=True):
        pass
    said = [r.getMessage() for r in caplog.records if "no chat channel" in r.getMessage()]
    assert said and "running for the API (gateway.api), cron, the terminal" in said[0]


async def test_history_shows_what_was_seen_live_not_the_programs(api: dict, llm: FakeOpenAI) -> None:
    """A code-mode turn writes its program and its result into the history; the page showed the
    question and the answer, and a reload must show the same."""
    llm.script(reply("```python\nprint(6 * 7)\n```"), reply("It is 42."))
    ai = client(api, api["owner"], **{"X-Nanobot-Session": "maths"})
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "/mode code"}])
    answer = await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "6 times 7?"}])
    assert answer.choices[0].message.content == "It is 42."
    async with aiohttp.ClientSession() as http:
        async with http.get(api["base"] + "/nanobot/history", headers={
                "Authorization": f"Bearer {api['owner']}", "X-Nanobot-Session": "maths"}) as resp:
            shown = [(m["role"], m["content"]) for m in (await resp.json())["messages"]]
    assert shown[-2:] == [("user", "6 times 7?"), ("assistant", "It is 42.")]
    assert not any("python" in text for _, text in shown)


async def test_a_failed_turn_stays_in_the_history_for_its_reader_not_for_the_model(api: dict, llm: FakeOpenAI) -> None:
    """The page showed the question and the red failure live; a reload must show both (it showed
    neither: the message was taken back so the next turn would not answer it again). The next
    turn's prompt still leaves them out."""
    llm.script(error(401, message="bad key"), reply("Here it is."))
    ai = client(api, api["owner"], **{"X-Nanobot-Session": "outage"})
    failed = await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "first try"}])
    assert failed.model_extra["nanobot"] == {"failed": True}
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "second try"}])
    assert [m["content"] for m in llm.chat_requests[-1]["messages"][1:]] == ["second try"]
    async with aiohttp.ClientSession() as http:
        async with http.get(api["base"] + "/nanobot/history", headers={
                "Authorization": f"Bearer {api['owner']}", "X-Nanobot-Session": "outage"}) as resp:
            shown = (await resp.json())["messages"]
    assert [(m["role"], m["content"][:22], m.get("failed", False)) for m in shown] == [
        ("user", "first try", False), ("assistant", "Sorry, I could not get", True),
        ("user", "second try", False), ("assistant", "Here it is.", False)]


async def test_a_reloaded_message_names_its_files_not_the_models_notes(api: dict, llm: FakeOpenAI) -> None:
    """The page shows "📎 notes.txt" under a message live; after a reload the history must too,
    not the line made for the model ("[document inbox/...: 21 characters of text; ...]")."""
    llm.script(reply("Read it."))
    auth = {"Authorization": f"Bearer {api['owner']}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(api["base"] + "/nanobot/upload?name=notes.txt", data=b"twenty-one characters", headers=auth) as resp:
            upload = (await resp.json())["id"]
        async with http.post(api["base"] + "/chat/completions", headers=auth, json={"model": "nanobot", "messages": [
                {"role": "user", "content": [{"type": "text", "text": "what is in it?"},
                                             {"type": "file", "file": {"file_id": upload}}]}]}) as resp:
            assert resp.status == 200
        assert "[document inbox/" in str(llm.chat_requests[0]["messages"])  # the model got its note
        async with http.get(api["base"] + "/nanobot/history", headers=auth) as resp:
            shown = [(m["role"], m["content"]) for m in (await resp.json())["messages"]]
    assert shown[-2:] == [("user", "what is in it?\n📎 notes.txt"), ("assistant", "Read it.")]


async def test_files_inside_a_message_go_through_the_media_pipeline(api: dict, llm: FakeOpenAI,
                                                                   workspace: Path) -> None:
    """OpenAI's clients send a picture as a data: URL, a document as file_data and a recording as
    input_audio inside the message (Open WebUI does): the model sees the picture and the
    document's text, a member's files land in its own folder, and a link or broken base64 is a
    clear 400, never fetched."""
    llm.script(reply("A small picture and a note."))
    picture = "data:image/png;base64," + base64.b64encode(png(40, 30)).decode()
    note = "data:text/plain;base64," + base64.b64encode(b"INLINE-NOTE-CANARY").decode()
    answer = await client(api, api["member"]).chat.completions.create(model="nanobot", messages=[
        {"role": "user", "content": [{"type": "text", "text": "what are these?"},
                                     {"type": "image_url", "image_url": {"url": picture}},
                                     {"type": "file", "file": {"file_data": note, "filename": "note.txt"}},
                                     {"type": "input_audio", "input_audio": {"data": base64.b64encode(ogg_opus()).decode(),
                                                                             "format": "ogg"}}]}])
    assert answer.choices[0].message.content == "A small picture and a note."
    sent = str(llm.chat_requests[0]["messages"])
    assert "data:image/jpeg;base64," in sent and "INLINE-NOTE-CANARY" in sent
    kept = [p.name.split("_", 2)[2] for p in (workspace / "chats").rglob("inbox/*")]  # page_<hex>_NAME
    assert sorted(kept) == ["note.txt", "picture.png", "recording.ogg"]
    for part, why in [({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}, "a link is not fetched"),
                      ({"type": "image_url", "image_url": {"url": "data:image/png;base64,***"}}, "not valid base64")]:
        status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": [part]}]})
        assert status == 400 and why in body["error"]["message"]
    assert len(llm.chat_requests) == 1


async def test_uploads_stop_at_the_workspace_limit(api: dict, workspace: Path) -> None:
    """A member key's uploads land in its folder inside the workspace: tools.maxWorkspaceMb holds
    them, or 60 uploads a minute could fill the disk the database is on."""
    api["gateway"].config.tools.max_workspace_mb = 1
    auth = {"Authorization": f"Bearer {api['member']}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(api["base"] + "/nanobot/upload?name=a.bin", data=b"a" * 600_000, headers=auth) as resp:
            assert resp.status == 200
        async with http.post(api["base"] + "/nanobot/upload?name=b.bin", data=b"b" * 600_000, headers=auth) as resp:
            assert resp.status == 507 and "tools.maxWorkspaceMb" in await resp.text()
    assert [p.name for p in workspace.rglob("*.bin")] == [next(workspace.rglob("*a.bin")).name]


async def test_the_page_has_an_icon(api: dict) -> None:
    root = api["base"].removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        async with http.get(root + "/") as page:
            assert '<link rel="icon" href="static/icon.svg"' in await page.text()
        async with http.get(root + "/static/icon.svg") as icon:
            assert icon.status == 200 and icon.content_type == "image/svg+xml"


async def test_notes_and_files_a_turn_sends_come_with_its_answer(api: dict, llm: FakeOpenAI, workspace: Path) -> None:
    """send_message to this chat and send_file arrive as the request's asides (nanobot's own
    field: whole answers list them, streams send them as they come); a file is kept in the
    chat's sent/ folder and downloads with the key of that chat only."""
    import base64

    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    (workspace / "chart.png").write_bytes(png)
    for _ in range(2):
        llm.script(tool_call("send_message", {"content": "Working on it."}),
                   tool_call("send_file", {"path": "chart.png", "caption": "Sales"}), reply("Here it is."))
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "chart?"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Here it is."
    note, file = body["nanobot"]["asides"]
    assert note == {"note": "Working on it."}
    assert file["file"]["photo"] and file["file"]["caption"] == "Sales" and file["file"]["path"].startswith("sent/")
    files = api["base"] + "/nanobot/files?path=" + file["file"]["path"]
    async with aiohttp.ClientSession() as http:
        async with http.get(files, headers={"Authorization": f"Bearer {api['owner']}"}) as resp:
            assert resp.status == 200 and await resp.read() == png
        async with http.get(files, headers={"Authorization": f"Bearer {api['member']}"}) as resp:
            assert resp.status == 404  # another chat's folder
        async with http.post(api["base"] + "/chat/completions", headers={"Authorization": f"Bearer {api['owner']}"},
                             json={"model": "nanobot", "stream": True,
                                   "messages": [{"role": "user", "content": "again"}]}) as resp:
            events = [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]
    asides = [e["nanobot"] for e in events if "nanobot" in e]
    assert asides[0] == {"note": "Working on it."} and asides[1]["file"]["name"] == "chart.png"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == "Here it is."
    assert events.index(next(e for e in events if "nanobot" in e)) < \
        events.index(next(e for e in events if e["choices"][0]["delta"].get("content")))


async def test_a_failed_turn_is_marked_for_a_program_to_tell(api: dict, llm: FakeOpenAI) -> None:
    """Its words say it failed, for a person; nanobot's own field says so for a program, which
    could not tell the apology from an answer. A member's words say only that none came."""
    llm.script(error(400, message="the model is gone"), error(400, message="the model is gone"), reply("fine"))
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["nanobot"] == {"failed": True}
    assert "the model is gone" in body["choices"][0]["message"]["content"]
    async with aiohttp.ClientSession() as http:
        async with http.post(api["base"] + "/chat/completions", headers={"Authorization": f"Bearer {api['member']}"},
                             json={"model": "nanobot", "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]}) as resp:
            events = [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]
    [last] = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"] == "stop"]
    assert last["nanobot"] == {"failed": True}
    assert "gone" not in "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "again"}]})
    assert body["choices"][0]["message"]["content"] == "fine" and "nanobot" not in body


async def test_the_api_answer_carries_the_voice_note(api: dict, llm: FakeOpenAI) -> None:
    gateway = api["gateway"]
    gateway.runtime.config.tools.speech.provider = "openai"
    llm.script(reply("Spoken too."), reply("Spoken at once."))
    await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "/voice always"}]})
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "say it"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Spoken too."
    [voice] = body["nanobot"]["asides"]
    assert voice["file"]["name"] == "reply.ogg" and voice["file"]["path"].startswith("sent/")
    # A new conversation's first reply, in code mode (nothing sent to that chat before its answer,
    # not even a stream of it: it went without its voice)
    gateway.runtime.config.tools.speech.reply = "always"
    gateway.runtime.config.agents.defaults.execution_mode = "code"
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "hi"}]},
                              **{"X-Nanobot-Session": "new"})
    assert body["choices"][0]["message"]["content"] == "Spoken at once." and body["nanobot"]["asides"]
    llm.script(reply("Read first."))  # streamed: the text as soon as it is there, not after the speech call
    async with aiohttp.ClientSession() as http:
        async with http.post(api["base"] + "/chat/completions", headers={"Authorization": f"Bearer {api['owner']}"},
                             json={"model": "nanobot", "stream": True,
                                   "messages": [{"role": "user", "content": "again"}]}) as resp:
            events = [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]
    shown = [e["nanobot"]["file"]["name"] if "nanobot" in e else e["choices"][0]["delta"].get("content")
             for e in events]
    assert [piece for piece in shown if piece] == ["Read first.", "reply.ogg"]


OPEN_WEBUI_TITLE = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: what is on my calendar?
ASSISTANT: Dentist at 3.
</chat_history>"""


async def test_a_front_ends_errands_stay_out_of_the_chat(api: dict, llm: FakeOpenAI) -> None:
    """Open WebUI asks the model it talks to for a title, tags and follow-up questions after a
    reply ("### Task:" over a copy of the chat). They were turns: a full prompt with tools each,
    and their words in the chat's history and every later prompt. They go to the model alone,
    counted in the chat's usage, and the chat goes on as if they never came."""
    llm.script(reply("Tags."))  # a chat not opened since the gateway started: one after a restart
    fresh = client(api, api["member"], **{"X-Nanobot-Session": "fresh"})
    assert (await fresh.chat.completions.create(model="nanobot", messages=[
        {"role": "user", "content": OPEN_WEBUI_TITLE}])).choices[0].message.content == "Tags."
    llm.script(reply("Dentist at 3."), reply('{"title": "🦷 Dentist Today"}', prompt_tokens=40, completion_tokens=9),
               reply('{"follow_ups": ["When?"]}'), reply("You asked about your calendar."))
    ai = client(api, api["member"])
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "what is on my calendar?"}])
    title = await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": OPEN_WEBUI_TITLE}])
    assert title.choices[0].message.content == '{"title": "🦷 Dentist Today"}'
    assert (title.usage.prompt_tokens, title.usage.completion_tokens) == (40, 9)
    errand = llm.chat_requests[2]
    assert errand["messages"] == [{"role": "user", "content": OPEN_WEBUI_TITLE}] and "tools" not in errand
    streamed = await ai.chat.completions.create(model="nanobot", stream=True, messages=[
        {"role": "user", "content": OPEN_WEBUI_TITLE.replace("a concise", "follow-up questions, not a")}])
    assert "".join([chunk.choices[0].delta.content or "" async for chunk in streamed if chunk.choices]) == \
        '{"follow_ups": ["When?"]}'
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "what did I ask?"}])
    sent = [m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["what is on my calendar?", "Dentist at 3.", "what did I ask?"]
    runtime = api["gateway"].runtime
    assert len((await runtime.sessions.open("api:bob")).messages) == 4
    assert not await runtime.sessions.exists("api:bob:fresh")  # nothing of it was kept
    assert (await runtime.usage.tokens_since("api:bob", 0))[0] >= 40  # its budget counts them


async def test_a_front_ends_task_model_set_to_the_errands_model(api: dict, llm: FakeOpenAI) -> None:
    """LibreChat's titleModel, Open WebUI's task model: a front end that sends its own requests
    (a title, tags) to a model of their own can name ``nanobot-errands``. Such a request goes as
    the front end wrote it (its system message too) to the chat's model alone, never into the
    chat, whatever its words."""
    llm.script(reply("Dentist at 3."), reply("Dentist Today"), reply("You asked about your calendar."))
    ai = client(api, api["member"])
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "what is on my calendar?"}])
    asked = [{"role": "system", "content": "Write a concise title for this conversation."},
             {"role": "user", "content": "User: what is on my calendar?\nAI: Dentist at 3."}]
    title = await ai.chat.completions.create(model="nanobot-errands", messages=asked)  # type: ignore[arg-type]
    assert title.choices[0].message.content == "Dentist Today"
    assert llm.chat_requests[1]["messages"] == asked and "tools" not in llm.chat_requests[1]
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "what did I ask?"}])
    sent = [m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["what is on my calendar?", "Dentist at 3.", "what did I ask?"]
    assert (await ai.models.retrieve("nanobot-errands")).id == "nanobot-errands"


async def test_a_quiet_stream_says_it_is_alive(config: Config, llm: FakeOpenAI) -> None:
    """A stream said nothing while a tool ran, and a proxy or load balancer in front ends a
    connection quiet for 60 s (nginx, AWS): the client lost the answer. A comment line goes out
    while nothing else does; clients (the openai SDK among them) skip it."""
    llm.script(delayed(reply("Took a while."), 0.4), delayed(reply("Again."), 0.4))
    async with running_gateway(config, with_services=True, pace=fast_pace(keepalive_s=0.05)) as gateway:
        key = await ApiKeys(gateway.runtime.db).add("ada", owner=True)
        base = f"http://{config.gateway.api.listen}/v1"
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
                    "model": "nanobot", "stream": True, "messages": [{"role": "user", "content": "slow"}]}) as resp:
                raw = (await resp.read()).decode()
        assert raw.index(": still working") < raw.index('"Took')
        stream = await openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0).chat.completions.create(
            model="nanobot", stream=True, messages=[{"role": "user", "content": "slow again"}])
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "Again."


async def test_every_file_a_turn_sends_comes_with_its_answer(api: dict, llm: FakeOpenAI, workspace: Path) -> None:
    """However long the turn's files take to go out after its answer (each is recorded, then
    kept in the chat's folder, in order: the 20 a turn may send, 5 MB each, take seconds), the
    request ends with the turn's own reply message, after all of them: none is left out."""
    from tests.fakes.openai_server import tool_calls

    for i in range(20):
        (workspace / f"part{i}.bin").write_bytes(random.randbytes(5 << 20))
    llm.script(tool_calls(*(("send_file", {"path": f"part{i}.bin"}) for i in range(20))), reply("All 20."))
    status, body = await post(api, {"model": "nanobot", "messages": [{"role": "user", "content": "the parts?"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "All 20."
    assert [aside["file"]["name"] for aside in body["nanobot"]["asides"]] == [f"part{i}.bin" for i in range(20)]
