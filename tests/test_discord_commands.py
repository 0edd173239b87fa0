"""Discord's slash commands through a running gateway (the real discord.py against the stand-in
Discord): the chat commands in the menu Discord shows when "/" is typed, each answered in place
of the "thinking…" Discord shows meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nanobot.config import Config
from nanobot_channels.discord_commands import ONLY_HERE
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.helpers import config_for, keep_discord_urls, running_gateway, until

DM, FRIEND, STRANGER, GUILD, GUILD_CHANNEL = 5, 4242, 99, 9, 7


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_discord_urls(monkeypatch)


@pytest.fixture
def config(llm: FakeOpenAI, dc: FakeDiscord, workspace: Path) -> Config:
    cfg = config_for(llm.base_url, workspace)
    cfg.gateway.heartbeat.enabled = False
    dc.connect(cfg, FRIEND)
    return cfg


async def test_the_chat_commands_are_the_apps_slash_commands(config: Config, dc: FakeDiscord) -> None:
    async with running_gateway(config):
        await dc.wait_until(lambda: dc.command_puts == 1)
    by_name = {c["name"]: c for c in dc.commands}
    assert list(by_name) == ["new", "stop", "tasks", "mode", "model", "voice", "status", "budget", "help"]
    assert [c["value"] for c in by_name["mode"]["options"][0]["choices"]] == ["tools", "code", "hybrid", "default"]
    assert "choices" not in by_name["model"]["options"][0] and not by_name["new"]["options"]  # a model is any name
    assert all(c["contexts"] == [0, 1] for c in dc.commands)  # a server's channels, the DM with the bot
    async with running_gateway(config):  # unchanged: not put again (Discord limits command creation)
        await dc.wait_until(lambda: dc.command_gets == 2)
    assert dc.command_puts == 1


async def test_a_command_is_answered_in_place_of_thinking(config: Config, dc: FakeDiscord, llm: FakeOpenAI) -> None:
    async with running_gateway(config):
        await dc.push_command(DM, FRIEND, "mode", "code")
        [answer] = await dc.wait_followups(1)
        await dc.push_command(GUILD_CHANNEL, FRIEND, "mode", guild_id=GUILD)  # in a server, no mention needed
        second = (await dc.wait_followups(2))[1]
    assert [c["type"] for c in dc.callbacks] == [5, 5]  # "thinking…", then the answer in its place
    assert answer["content"] == "Mode set to code for this chat."
    assert second["content"].startswith("Mode: ")
    assert not dc.sent and not llm.chat_requests  # no message posted, no model call


async def test_model_offers_buttons_and_a_press_is_that_command(config: Config, dc: FakeDiscord,
                                                                 llm: FakeOpenAI) -> None:
    """/model's answer has the models this chat may pick as buttons (five to a row, as Discord
    takes them); a press is that command from whoever pressed it, answered in place of
    "thinking…"; a press of anything never offered, or a stranger's, is taken for nothing."""
    from nanobot.config import ModelChoice

    config.agents.models = {f"m{i}": ModelChoice(provider="openai", model=f"model-{i}") for i in range(6)}
    async with running_gateway(config):
        await dc.push_command(DM, FRIEND, "model")
        shown = (await dc.wait_followups(1))[0]["message"]
        assert [[b["custom_id"] for b in row["components"]] for row in shown["components"]] == [
            [f"/model m{i}" for i in range(5)], ["/model m5", "/model default"]]
        await dc.push_button(shown, FRIEND, "/model m5")
        assert (await dc.wait_followups(2))[1]["content"] == "Model set to openai/model-5 for this chat."
        await dc.push_button(shown, FRIEND, "/new")  # never offered: taken for nothing, nothing left thinking
        await dc.wait_until(lambda: len(dc.callbacks) == 3)
        await dc.push_message(DM, FRIEND, "/model")  # typed: posted, with its buttons
        [typed] = await dc.wait_sent(1)
        assert typed["content"].startswith("Model: openai/model-5") and len(typed["components"]) == 2
        await dc.push_button(typed, STRANGER, "/model m0", guild_id=GUILD)  # no say here
        await dc.wait_until(lambda: len(dc.deleted) == 1)  # its "thinking…" removed
        await dc.push_command(DM, FRIEND, "model")
        assert (await dc.wait_followups(3))[2]["content"].startswith("Model: openai/model-5")
    assert dc.callbacks[2]["type"] == 6 and not llm.chat_requests  # a deferred update: nothing shown


async def test_an_answer_after_the_token_expired_is_posted(config: Config, dc: FakeDiscord) -> None:
    dc.expire("late")
    async with running_gateway(config):
        await dc.push_command(DM, FRIEND, "help", token="late")
        [posted] = await dc.wait_sent(1)
    assert posted["channel_id"] == str(DM) and posted["content"].startswith("Commands:")


async def test_someone_elses_dm_and_a_stranger_reach_no_chat(config: Config, dc: FakeDiscord,
                                                            llm: FakeOpenAI) -> None:
    llm.fallback = lambda body: reply("should not happen")
    async with running_gateway(config) as gateway:
        await dc.push_command(DM, FRIEND, "new", context=2, token="their-dm")  # the app installed by a user
        await dc.push_command(GUILD_CHANNEL, STRANGER, "status", guild_id=GUILD, token="stranger")
        await dc.wait_until(lambda: "stranger" in dc.deleted)  # the "thinking…" taken away
        kept: list[Any] = await gateway.runtime.sessions.chats("discord:")
    refused = next(c for c in dc.callbacks if c["token"] == "their-dm")
    assert refused["type"] == 4 and refused["data"]["content"] == ONLY_HERE and refused["data"]["flags"] == 64
    assert not llm.chat_requests and not dc.followups and kept == []


async def test_stop_typed_as_a_slash_command_answers_in_place(config: Config, dc: FakeDiscord,
                                                              llm: FakeOpenAI) -> None:
    """/stop while a turn runs: "Stopped." takes the place of its own "thinking…" (the cancelled
    turn's message has no answer to give it)."""
    llm.script(delayed(reply("too slow"), 30))
    async with running_gateway(config):
        await dc.push_message(DM, FRIEND, "a long question", username="friend")
        await until(lambda: llm.chat_requests)
        await dc.push_command(DM, FRIEND, "stop", token="stop-now")
        [answer] = await dc.wait_followups(1, timeout=10)
    assert (answer["token"], answer["content"], answer["mentions"]) == ("stop-now", "Stopped.", [])
    assert not [m for m in dc.sent if m["content"] == "too slow"]
