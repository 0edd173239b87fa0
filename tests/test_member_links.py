"""Links a member made in its own folder are never followed (issue: "Files a member can touch").

A member chat's shell or an emailed archive can put a symlink anywhere in its folder, or swap a
folder for one. Through the public interface (the API with a member key, the page's upload and
download, a Telegram group's document, the prompt's member memory) none of it may reach the
daemon's home (``config.json``, with a canary key) or write outside the folder.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from nanobot import beneath
from nanobot.api.keys import ApiKeys
from nanobot.config import Config
from tests.fakes.openai_server import FakeOpenAI, reply, tool_calls
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import config_for, running_gateway
from tests.test_api import config  # noqa: F401  (the gateway with the API on a free port)
from tests.test_trust import confined, tool_results

CANARY = "sk-CANARY-CONFIG"


@pytest.fixture
def secret(home: Path) -> Path:
    path = home / "config.json"
    path.write_text(json.dumps({"providers": {"openai": {"apiKey": CANARY}}}))
    return path


@pytest.fixture
async def api(config: Config) -> AsyncIterator[dict]:
    async with running_gateway(config, with_services=True) as gateway:
        yield await member_api(config, gateway)


async def member_api(config: Config, gateway) -> dict:  # noqa: ANN001
    """Where the running gateway's API is, and a member key (bob's)."""
    return {"base": f"http://{config.gateway.api.listen}/v1", "key": await ApiKeys(gateway.runtime.db).add("bob"),
            "gateway": gateway}


def bob_folder(workspace: Path) -> Path:
    folder = workspace / "chats" / "api_bob"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def call(api: dict, method: str, path: str, **kwargs) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, api["base"] + path, headers={"Authorization": f"Bearer {api['key']}"},
                                **kwargs) as resp:
            return resp.status, await resp.read()


async def say(api: dict, text: str) -> int:
    """A chat message from bob through the API; the HTTP status."""
    status, _ = await call(api, "POST", "/chat/completions",
                           json={"model": "nanobot", "messages": [{"role": "user", "content": text}]})
    return status


def everything_sent(llm: FakeOpenAI) -> str:
    return json.dumps(llm.chat_requests)


async def test_a_linked_file_named_in_a_request_never_reaches_the_prompt(
        api: dict, llm: FakeOpenAI, workspace: Path, secret: Path) -> None:
    inbox = bob_folder(workspace) / "inbox"
    inbox.mkdir()
    (inbox / "leak.txt").symlink_to(secret)
    (inbox / "hard.txt").hardlink_to(secret) if os.stat(secret).st_dev == os.stat(inbox).st_dev else None
    llm.fallback = lambda body: reply("ok")
    for name in ("leak.txt", "hard.txt"):
        body = {"model": "nanobot", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is in this file?"}, {"type": "file", "file": {"file_id": f"inbox/{name}"}}]}]}
        status, _ = await call(api, "POST", "/chat/completions", json=body)
        assert status == 200
    assert len(llm.chat_requests) == 2 and CANARY not in everything_sent(llm)


async def test_the_files_endpoint_serves_no_link(api: dict, workspace: Path, secret: Path) -> None:
    sent = bob_folder(workspace) / "sent"
    sent.mkdir()
    (sent / "ok.txt").write_text("fine")
    (sent / "leak.txt").symlink_to(secret)
    elsewhere = workspace.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.json").write_bytes(secret.read_bytes())
    (bob_folder(workspace) / "inbox").symlink_to(elsewhere)  # a folder that is a link
    assert await call(api, "GET", "/nanobot/files?path=sent/ok.txt") == (200, b"fine")
    for path in ("sent/leak.txt", "inbox/x.json", "sent/../../../../config.json"):
        status, data = await call(api, "GET", f"/nanobot/files?path={path}")
        assert status == 404 and CANARY.encode() not in data


async def test_an_upload_never_goes_through_a_linked_inbox(api: dict, workspace: Path) -> None:
    elsewhere = workspace.parent / "cron.d"
    elsewhere.mkdir()
    (bob_folder(workspace) / "inbox").symlink_to(elsewhere)
    status, _ = await call(api, "POST", "/nanobot/upload?name=job", data=b"* * * * * root sh -c evil")
    assert status == 403 and list(elsewhere.iterdir()) == []


async def test_an_upload_is_stored_whole_or_refused(api: dict, workspace: Path, config: Config) -> None:
    big = os.urandom(3 * 1024 * 1024)

    async def chunked():
        for i in range(0, len(big), 100_000):
            yield big[i:i + 100_000]

    status, body = await call(api, "POST", "/nanobot/upload?name=big.bin", data=chunked())
    assert status == 200, body
    assert (bob_folder(workspace) / json.loads(body)["id"]).read_bytes() == big
    config.channels.max_media_mb = 1

    async def too_big():
        yield big

    status, _ = await call(api, "POST", "/nanobot/upload?name=big.bin", data=too_big())
    assert status == 413


async def test_a_linked_member_memory_stays_out_of_the_prompt(
        api: dict, llm: FakeOpenAI, workspace: Path, secret: Path) -> None:
    memory = bob_folder(workspace) / "memory"
    memory.mkdir()
    (memory / "MEMORY.md").symlink_to(secret)
    llm.fallback = lambda body: reply("ok")
    status = await say(api, "hi")
    assert status == 200 and CANARY not in everything_sent(llm)


async def test_a_linked_skill_file_in_a_members_folder_stays_out_of_the_prompt(
        api: dict, llm: FakeOpenAI, workspace: Path) -> None:
    """A member's skills are its own folder's; a SKILL.md there that links to one of the owner's
    files must not bring that file's front matter into the member's prompt."""
    owners = workspace / "skills" / "private"
    owners.mkdir(parents=True)
    (owners / "SKILL.md").write_text("---\nname: private\ndescription: sk-CANARY-SKILL\n---\nsecret steps\n")
    linked = bob_folder(workspace) / "skills" / "private"
    linked.mkdir(parents=True)
    (linked / "SKILL.md").symlink_to(owners / "SKILL.md")
    llm.fallback = lambda body: reply("ok")
    status = await say(api, "hi")
    assert status == 200 and "sk-CANARY-SKILL" not in everything_sent(llm)


async def test_a_document_sent_to_a_group_never_lands_through_a_linked_inbox(
        llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> None:
    cfg = config_for(llm.base_url, workspace, mode="tools")
    cfg.gateway.heartbeat.enabled = False
    t = cfg.channels.telegram
    t.enabled, t.token, t.api_base, t.allow_from, t.group_policy, t.streaming = \
        True, tg.token, tg.api_base, ["77"], "open", False
    elsewhere = workspace.parent / "etc-cron.d"
    elsewhere.mkdir()
    group = workspace / "chats" / "telegram_-100200"
    group.mkdir(parents=True)
    (group / "inbox").symlink_to(elsewhere)
    llm.fallback = lambda body: reply("got it")
    async with running_gateway(cfg):
        tg.push_document(-100200, 77, b"* * * * * root evil", "job", chat_type="group", username="bob")
        await tg.wait_sent(1, timeout=15)
    assert list(elsewhere.iterdir()) == []


async def test_a_fifo_for_a_members_memory_history_does_not_freeze_the_daemon(
        config: Config, llm: FakeOpenAI, workspace: Path) -> None:
    """A member's shell can make ``memory/HISTORY.md`` a named pipe: opened for appending, with
    nobody at the other end, it blocked the event loop, and every chat with it. Now that
    consolidation fails, and is not tried again on the next turn (each try is a model call)."""
    from tests.test_memory import Model, good_answer

    config.agents.defaults.memory_window = 6
    (bob_folder(workspace) / "memory").mkdir()
    os.mkfifo(bob_folder(workspace) / "memory" / "HISTORY.md")
    model = llm.fallback = Model(good_answer())
    async with running_gateway(config, with_services=True) as gateway:
        api = await member_api(config, gateway)
        for text in ("one", "two", "three", "four", "five"):  # past the window at the fourth
            status = await say(api, text)
            assert status == 200
            async with asyncio.timeout(10):
                await gateway.runtime.agent.memory.drain()
    assert model.turns == 5 and len(model.consolidations) == 1


def test_the_opener_refuses_links_anywhere_on_the_path(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_text("secret")
    (root / "a" / "link").symlink_to(outside / "f")
    (root / "dir").symlink_to(outside)
    for relative in ("a/link", "dir/f"):
        with pytest.raises(beneath.LinkRefused):
            beneath.read_bytes(root, relative)
    with pytest.raises(beneath.LinkRefused):
        beneath.write_bytes(root, "dir/new", b"x")
    beneath.write_bytes(root, "a/link", b"mine")  # a link at the name is replaced, not written through
    assert (outside / "f").read_text() == "secret" and beneath.read_bytes(root, "a/link") == b"mine"
    for bad in ("../outside/f", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            beneath.read_bytes(root, bad)


@confined
async def test_a_link_in_a_members_skills_is_never_read_to_be_put_back(
        api: dict, llm: FakeOpenAI, workspace: Path, secret: Path) -> None:
    """The shell's rollback of steering changes kept each file's bytes before a command, read by
    name: a link a member's other command (a background task's) made there was followed, and the
    rollback then wrote what it pointed at into the member's folder as a plain file."""
    skills = bob_folder(workspace) / "skills"
    skills.mkdir()
    (skills / "leak.md").symlink_to(secret)  # made by a command running beside this turn
    llm.script(tool_calls(("exec_command", {"command": "rm skills/leak.md"})),
               tool_calls(("exec_command", {"command": "cat skills/leak.md; ls -l skills"})), reply("done"))
    status = await say(api, "tidy up")
    assert status == 200
    removed, shown = tool_results(llm)
    assert "can only be changed from the owner's chat" in removed
    assert CANARY not in everything_sent(llm) and CANARY not in shown
    assert not any(CANARY in p.read_text(errors="replace") for p in skills.rglob("*") if not p.is_symlink())


@confined
async def test_a_named_pipe_a_members_shell_makes_in_its_skills_is_undone_and_freezes_nothing(
        api: dict, llm: FakeOpenAI, workspace: Path) -> None:
    """A refused steering change is undone: a named pipe too, which the rollback left in place,
    and the next command's snapshot then opened it and blocked the event loop for ever."""
    bob_folder(workspace)
    llm.script(tool_calls(("exec_command", {"command": "mkdir -p skills && mkfifo skills/pipe"})),
               tool_calls(("exec_command", {"command": "echo next"})), reply("done"))
    status = await say(api, "make a pipe")
    assert status == 200
    refused, following = tool_results(llm)
    assert "can only be changed from the owner's chat" in refused and following == "next\n[exit code 0]"
    assert not (bob_folder(workspace) / "skills" / "pipe").exists()
