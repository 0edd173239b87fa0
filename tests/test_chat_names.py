"""One chat, one history and one member folder: the key -> name mapping is injective, on both
engines, and homes made with the old mapping (which shared names) are renamed once at start."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from nanobot.api.keys import ApiKeys
from nanobot.chat_names import chat_name, key_of
from nanobot.chat_names_legacy import UNCLAIMED, legacy_name
from nanobot.config import Config
from nanobot.database import SqliteDatabase
from nanobot.runtime import open_runtime
from nanobot.trust import chat_folder
from nanobot.usage import UsageStore
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for, running_gateway
from tests.test_api import free_port
from tests.test_cli import nanobot, write_config

PAIRS = [("api:team:admin", "api:team_admin"), ("api:alice:x", "api:alice_x"),
         ("telegram:-1001234567890", "telegram_-1001234567890"), ("discord:a/b", "discord:a_b"),
         ("slack:C1:1700.1", "slack:C1_1700.1"), ("api:a%5Fb", "api:a_b"), ("cli:.", "cli:%2E")]


@pytest.mark.parametrize(("one", "two"), PAIRS)
def test_two_keys_never_share_a_name(one: str, two: str) -> None:
    assert chat_name(one) != chat_name(two)
    assert key_of(chat_name(one)) == one and key_of(chat_name(two)) == two


def test_names_stay_readable() -> None:
    assert chat_name("telegram:123456") == "telegram_123456" == legacy_name("telegram:123456")
    assert chat_name("telegram:-1001234567890") == "telegram_-1001234567890"
    assert chat_name("api:team_admin") == "api_team%5Fadmin"
    assert chat_name("email:ann@example.org") == "email_ann%40example.org"
    assert chat_name("discord:../x") == "discord_..%2Fx"  # no separator survives
    assert not chat_name(".:x").startswith(".")
    long_one, long_two = "api:" + "a" * 300, "api:" + "a" * 299 + "b"
    assert len(chat_name(long_one)) <= 200 and chat_name(long_one) != chat_name(long_two)
    assert key_of(chat_name(long_one)) is None  # a cut name: the key is in the file's first line


@pytest.fixture(params=["sqlite", "postgresql"])
def engine_config(request: pytest.FixtureRequest, llm: FakeOpenAI, workspace: Path) -> Config:
    cfg = config_for(llm.base_url, workspace, mode="tools")
    cfg.gateway.heartbeat.enabled = False
    cfg.gateway.api.enabled = True
    cfg.gateway.api.listen = f"127.0.0.1:{free_port()}"
    if request.param == "postgresql":
        cfg.database.url = request.getfixturevalue("pg_url")
    return cfg


async def _chat(base: str, key: str, text: str, session: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {key}", **({"X-Nanobot-Session": session} if session else {})}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", headers=headers,
                             json={"model": "nanobot", "messages": [{"role": "user", "content": text}]}) as resp:
            assert resp.status == 200, await resp.text()


async def _history(base: str, key: str, session: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}", **({"X-Nanobot-Session": session} if session else {})}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/nanobot/history", headers=headers) as resp:
            return json.dumps(await resp.json())


async def test_a_member_session_never_reads_an_owner_key_chat(engine_config: Config, llm: FakeOpenAI, workspace: Path,
                                                             home: Path) -> None:
    """Member key ``team`` with session ``admin`` against owner key ``team_admin``; member ``alice``
    with session ``x`` against member key ``alice_x``: four chats, four histories, two folders."""
    llm.fallback = lambda body: reply("ok")
    base = f"http://{engine_config.gateway.api.listen}"
    async with running_gateway(engine_config, with_services=True) as gateway:
        keys = ApiKeys(gateway.runtime.db)
        owner, member = await keys.add("team_admin", owner=True), await keys.add("team")
        alice, alice_x = await keys.add("alice"), await keys.add("alice_x")
        await _chat(base, owner, "CANARY-owner-history")
        llm.script(tool_call("write_file", {"path": "note.txt", "content": "CANARY-alice-x-file"}), reply("saved"))
        await _chat(base, alice, "keep this", session="x")
        llm.script(tool_call("read_file", {"path": "note.txt"}), lambda body: reply(body["messages"][-1]["content"]))
        await _chat(base, alice_x, "read note.txt")
        assert "CANARY" not in await _history(base, member, session="admin")
        assert "CANARY-owner-history" in await _history(base, owner)
        assert "CANARY-alice-x-file" not in await _history(base, alice_x)
        await _chat(base, member, "member words", session="admin")
        assert "member words" not in await _history(base, owner)
    assert (chat_folder(workspace, "api:alice:x") / "note.txt").read_text() == "CANARY-alice-x-file"
    assert not (chat_folder(workspace, "api:alice_x") / "note.txt").exists()
    if engine_config.database.engine == "sqlite":
        names = sorted(p.name for p in (home / "sessions").glob("*.jsonl"))
        assert names == ["api_alice%5Fx.jsonl", "api_alice_x.jsonl", "api_team%5Fadmin.jsonl", "api_team_admin.jsonl"]


async def test_a_telegram_group_keeps_its_readable_folder(engine_config: Config, workspace: Path) -> None:
    async with open_runtime(engine_config):
        pass
    assert chat_folder(workspace, "telegram:-1001234567890").name == "telegram_-1001234567890"


def _legacy_history(sessions: Path, key: str, text: str) -> Path:
    sessions.mkdir(parents=True, exist_ok=True)
    path = sessions / (legacy_name(key) + ".jsonl")
    with path.open("a") as f:
        if path.stat().st_size == 0:
            f.write(json.dumps({"_meta": {"key": key}}) + "\n")
        f.write(json.dumps({"role": "user", "content": text}) + "\n")
    return path


async def test_an_old_home_is_renamed_once_and_a_shared_name_set_aside(llm: FakeOpenAI, home: Path, workspace: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(llm.base_url, workspace)
    sessions = home / "sessions"
    _legacy_history(sessions, "api:team_admin", "owner words")  # only the owner key ever used it
    shared = _legacy_history(sessions, "api:alice_x", "alice_x words")
    _legacy_history(sessions, "api:alice:x", "alice's session x words")  # the old mapping: one file for both
    _legacy_history(sessions, "telegram:42", "plain")
    for name in ("api_team_admin", "api_alice_x", "telegram_42"):
        (workspace / "chats" / name).mkdir(parents=True)
    db = await SqliteDatabase.open(home / "nanobot.db")  # the database knows both users of the shared name
    await UsageStore.create(db)
    await db.executemany("INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, "
                         "completion_tokens) VALUES (0, $1, 'tools', 'turn', 'm', 1, 1)",
                         [("api:alice_x",), ("api:alice:x",)])
    await db.close()

    async with open_runtime(config) as rt:
        assert [m["content"] for m in (await rt.sessions.open("api:team_admin")).messages] == ["owner words"]
        assert (await rt.sessions.open("api:alice:x")).messages == []  # neither claimant reads the shared file
        assert (await rt.sessions.open("api:alice_x")).messages == []
        assert [m["content"] for m in (await rt.sessions.open("telegram:42")).messages] == ["plain"]
    assert (sessions / "api_team%5Fadmin.jsonl").exists() and not shared.exists()
    assert "alice_x words" in (sessions / UNCLAIMED / shared.name).read_text()
    assert sorted(p.name for p in (workspace / "chats").iterdir()) == [
        UNCLAIMED, "api_team%5Fadmin", "telegram_42"]
    reports = [r.getMessage() for r in caplog.records if "could belong to" in r.getMessage()]
    assert len(reports) == 2 and all("api:alice:x, api:alice_x" in r for r in reports)

    caplog.clear()
    async with open_runtime(config) as rt:  # once: a second start renames and reports nothing
        await rt.sessions.open("api:team:admin")
    assert not [r for r in caplog.records if "could belong to" in r.getMessage() or "renamed" in r.getMessage()]
    assert (workspace / "chats" / "api_team%5Fadmin").is_dir()


async def test_an_old_member_folder_is_renamed_on_postgresql(pg_url: str, llm: FakeOpenAI, workspace: Path) -> None:
    """On PostgreSQL the histories are rows keyed by the chat; its member folders are renamed."""
    config = config_for(llm.base_url, workspace)
    config.database.url = pg_url
    async with open_runtime(config) as rt:  # a database from before: its chats' names were not renamed yet
        await rt.db.execute("INSERT INTO history (session_key, record) VALUES ($1, $2)", "api:team_admin", "{}")
        await rt.db.execute("DELETE FROM schema_versions WHERE component = 'chat_names'")
    (workspace / "chats" / "api_team_admin").mkdir(parents=True)
    async with open_runtime(config):
        pass
    assert sorted(p.name for p in (workspace / "chats").iterdir()) == ["api_team%5Fadmin"]


async def test_history_export_reads_an_old_home_under_the_new_names(home: Path, workspace: Path) -> None:
    write_config(home, workspace, "http://127.0.0.1:9")
    _legacy_history(home / "sessions", "api:team_admin", "CANARY-exported")
    code, out, err = await nanobot("history", "export", "api:team_admin", home=home)
    assert code == 0, err
    assert "CANARY-exported" in out and (home / "sessions" / "api_team%5Fadmin.jsonl").exists()
    code, _, err = await nanobot("history", "export", "api:team:admin", home=home)
    assert code == 1 and "no history for 'api:team:admin'" in err
