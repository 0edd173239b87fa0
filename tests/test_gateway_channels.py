"""The whole gateway in-process: channels found by entry point, the real python-telegram-bot and
discord.py against the loopback stand-ins, the real openai SDK against the scripted model."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import AsyncIterator

import pytest
from typer.testing import CliRunner

from nanobot_channels.text import split_message, utf16_len
from nanobot.cli import app
from nanobot.config import Config
from nanobot.access import WELCOME
from nanobot.gateway import Gateway
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, delayed, reply, tool_call
from tests.fakes.telegram_api import FakeTelegram
from nanobot.trust import chat_trust
from tests.helpers import config_for, fast_pace, keep_discord_urls, running_gateway

ALICE, BOB, MALLORY = 42, 77, 666  # Telegram private chats: chat id == user id
DM, FRIEND, STRANGER, GUILD_CHANNEL = 5, 4242, 99, 7


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_discord_urls(monkeypatch)


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, dc: FakeDiscord, workspace: Path) -> Config:
    cfg = config_for(llm.base_url, workspace)
    t = cfg.channels.telegram
    t.enabled, t.token, t.api_base, t.allow_from = True, tg.token, tg.api_base, [str(ALICE), str(BOB)]
    d = dc.connect(cfg, FRIEND)
    t.streaming = d.streaming = False  # whole replies: tests/test_streaming.py covers streaming
    return cfg




@pytest.fixture
async def gateway(config: Config) -> AsyncIterator[Gateway]:
    async with running_gateway(config) as gw:
        yield gw


def last_user(body: dict) -> str:
    return body["messages"][-1]["content"]


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in tg.sent if m["chat_id"] == chat]


async def test_telegram_end_to_end(gateway: Gateway, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    assert set(gateway.channels.channels) == {"telegram", "discord"}
    llm.script(delayed(reply("Hello **Alice**"), 0.7))  # slow enough for the typing indicator
    tg.push_text(ALICE, ALICE, "hi there")
    [sent] = await tg.wait_sent(1)
    assert sent["chat_id"] == ALICE and sent["text"] == "Hello <b>Alice</b>"
    assert llm.chat_requests[0]["messages"][-1] == {"role": "user", "content": "hi there"}
    assert tg.actions and tg.actions[0]["action"] == "typing"


async def test_discord_end_to_end(gateway: Gateway, dc: FakeDiscord, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("hello from the model"), 0.7))  # slow enough for the typing indicator
    await dc.push_message(DM, FRIEND, "hi", username="friend")
    [sent] = await dc.wait_sent(1)
    assert sent["channel_id"] == str(DM) and sent["content"] == "hello from the model"
    assert str(DM) in dc.typing


async def test_unknown_sender_is_paired_before_reaching_the_model(
        config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    config.gateway.heartbeat.enabled = False
    async with running_gateway(config, with_services=True):
        tg.push_text(MALLORY, MALLORY, "let me in", username="mallory")
        await tg.wait_sent(2)
        [offer] = texts(tg, MALLORY)
        code = re.search(r"nanobot pairing approve (\w+)", offer).group(1)
        assert texts(tg, ALICE) == [f"🔔 telegram user {MALLORY} (@mallory) asked to talk to me. "
                                    f"Approve: nanobot pairing approve {code} (or: nanobot pairing deny {code})"]
        tg.push_text(MALLORY, MALLORY, "hello??", username="mallory")  # rate-limited: no second code
        tg.push_text(-100, MALLORY, f"@{tg.bot_username} hi", chat_type="group")  # groups: silence
        llm.script(reply("pong"))
        tg.push_text(ALICE, ALICE, "ping")  # PTB handles updates in order: once Alice has her answer,
        await tg.wait_sent(3)  # Mallory's messages above were dealt with
        assert [last_user(r) for r in llm.chat_requests] == ["ping"] and texts(tg, MALLORY) == [offer]
        result = await asyncio.to_thread(CliRunner().invoke, app, ["pairing", "approve", code])
        assert result.exit_code == 0, result.output
        await tg.wait_sent(4)  # the gateway sees the approval made by the CLI and tells them
        assert texts(tg, MALLORY)[-1] == WELCOME
        llm.script(reply("welcome"))
        tg.push_text(MALLORY, MALLORY, "and now?", username="mallory")
        await tg.wait_sent(5)
        assert texts(tg, MALLORY)[-1] == "welcome" and last_user(llm.chat_requests[-1]) == "and now?"
        result = await asyncio.to_thread(CliRunner().invoke, app, ["pairing", "revoke", "telegram", str(MALLORY)])
        assert result.exit_code == 0 and "Revoked telegram user 666" in result.output
        tg.push_text(MALLORY, MALLORY, "still there?", username="mallory")  # quiet: a code went out lately
        llm.script(reply("pong 2"))
        tg.push_text(ALICE, ALICE, "ping 2")
        await tg.wait_sent(6)
        assert len(llm.chat_requests) == 3  # Mallory's message reached no model


async def test_a_flood_of_strangers_costs_no_writes_past_the_pairing_rate(
        config: Config, tg: FakeTelegram, llm: FakeOpenAI, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nanobot.access import PairingPolicy

    llm.script(reply("pong"))
    async with running_gateway(config) as gateway:
        for uid in range(10_000, 10_300):
            tg.push_text(uid, uid, "let me in", username=None)
        tg.push_text(ALICE, ALICE, "ping")  # behind 300 strangers in Telegram's queue
        await tg.wait_until(lambda: "pong" in texts(tg, ALICE), timeout=15)
        store = gateway.runtime.pairing
        pending = len(await store.pending())
    codes = [m for m in tg.sent if m["chat_id"] >= 10_000]
    assert len(codes) == PairingPolicy().codes_per_minute == 10  # the rest: no code, no database row
    assert pending == 10 and not [r for r in caplog.records if "10299" in r.getMessage()]


async def test_a_denied_stranger_gets_no_new_code(config: Config, tg: FakeTelegram, llm: FakeOpenAI,
                                                  home: Path) -> None:
    from nanobot.access import PairingPolicy

    async with running_gateway(config) as gateway:
        tg.push_text(BOB + 1, BOB + 1, "hi", username="eve")
        await tg.wait_sent(2)  # her code, and the owner's notice
        code = re.search(r"nanobot pairing approve (\w+)", texts(tg, BOB + 1)[0]).group(1)
        result = await asyncio.to_thread(CliRunner().invoke, app, ["pairing", "deny", code])
        assert result.exit_code == 0 and "Denied telegram user 78" in result.output
        store = gateway.runtime.pairing
        assert await store.request("telegram", str(BOB + 1), "eve") is None  # even after the quiet period
        assert await store.pending() == [] and isinstance(store.policy, PairingPolicy)


async def test_discord_strangers_get_a_code_in_dms_and_silence_in_guilds(
        gateway: Gateway, dc: FakeDiscord, llm: FakeOpenAI) -> None:
    await dc.push_message(GUILD_CHANNEL, STRANGER, f"<@{dc.bot_id}> hi", guild_id=9, mentions_bot=True)
    await dc.push_message(DM, STRANGER, "hi")
    [offer] = await dc.wait_sent(1)
    assert offer["channel_id"] == str(DM) and "nanobot pairing approve" in offer["content"]
    assert llm.requests == []


async def test_long_replies_are_split_per_platform(gateway: Gateway, tg: FakeTelegram, dc: FakeDiscord,
                                                   llm: FakeOpenAI) -> None:
    # Emoji count twice in UTF-16: 3000 of them are 6000 units, more than one Telegram message.
    long_tg = "\n\n".join("😀" * 100 + f" paragraph {i}" for i in range(30))
    long_dc = " ".join(f"word{i}" for i in range(900))  # about 6000 characters
    llm.script(reply(long_tg), reply(long_dc))
    tg.push_text(ALICE, ALICE, "a long one please")
    await tg.wait_until(lambda: any("paragraph 29" in m["text"] for m in tg.sent))
    parts = texts(tg, ALICE)
    assert len(parts) >= 2 and all(utf16_len(p) <= 4096 for p in parts)
    assert re.sub(r"\s", "", "".join(parts)) == re.sub(r"\s", "", long_tg)
    await dc.push_message(DM, FRIEND, "and here")
    chunks = [m["content"] for m in await dc.wait_sent(len(split_message(long_dc, 2000)))]
    assert len(chunks) >= 3 and all(len(c) <= 2000 for c in chunks)
    assert " ".join(chunks).split() == long_dc.split()


async def test_polling_recovers_from_a_bot_api_outage(gateway: Gateway, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    tg.fail_all(calls=3)
    # The long poll already in flight ends (1 s here), then three polls fail and back off.
    await tg.wait_until(lambda: tg.failed == 3)
    tg.push_text(ALICE, ALICE, "are you there?")
    llm.script(reply("still here"))
    await tg.wait_sent(1, timeout=5)
    assert texts(tg, ALICE) == ["still here"]


async def test_send_message_to_allowed_chats_only(gateway: Gateway, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.script(tool_call("send_message", {"content": "a note for this chat"}),
               tool_call("send_message", {"content": "hi Bob", "to": f"telegram:{BOB}"}),
               tool_call("send_message", {"content": "spam", "to": "telegram:555"}),
               reply("all done"))
    tg.push_text(ALICE, ALICE, "tell bob")
    await tg.wait_sent(3)
    assert texts(tg, ALICE) == ["a note for this chat", "all done"]
    assert texts(tg, BOB) == ["hi Bob"] and texts(tg, 555) == []
    refused = llm.chat_requests[3]["messages"][-1]["content"]
    assert refused.startswith("Error: PermissionError") and "telegram:555" in refused


async def test_a_channel_that_fails_to_start_does_not_stop_the_others(
        config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    config.channels.discord.token = "wrong-token"
    async with running_gateway(config) as gateway:
        assert list(gateway.channels.channels) == ["telegram"] and "discord" in gateway.channels.failed
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_sent(1)


async def test_a_channel_that_fails_to_start_is_retried_until_it_runs(
        config: Config, dc: FakeDiscord, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good_token, config.channels.discord.token = config.channels.discord.token, "wrong-token"
    config.channels.telegram.enabled = False
    async with running_gateway(config, pace=fast_pace(channel_retry_s=0.05)) as gateway:  # up, for cron and the other channels
        assert gateway.channels.channels == {} and gateway.channels.state["discord"].startswith("retrying in")
        assert "retrying in" in (home / "gateway-state.json").read_text()
        config.channels.discord.token = good_token  # the outage ends
        async with asyncio.timeout(10):
            while "discord" not in gateway.channels.channels:
                await asyncio.sleep(0.02)
        assert gateway.channels.state["discord"] == "running" and not gateway.channels.failed
        await dc.push_message(DM, FRIEND, "/help", username="friend")
        assert "/new" in (await dc.wait_sent(1))[0]["content"]


async def test_a_discord_dm_with_an_owner_is_an_owner_chat_and_a_guild_channel_is_not(
        gateway: Gateway, dc: FakeDiscord, config: Config) -> None:
    # A Discord DM's channel id is not the user's id: the chat's private peer decides.
    await dc.push_message(DM, FRIEND, "/status", username="friend")
    await dc.push_message(GUILD_CHANNEL, FRIEND, f"<@{dc.bot_id}> /status", guild_id=9, mentions_bot=True)
    sent = await dc.wait_sent(2, timeout=10)  # the two chats answer concurrently: either may come first
    dm, guild = sorted(sent, key=lambda m: m["channel_id"] != str(DM))
    assert "This is an owner chat" in dm["content"]
    assert f"a member chat: it works in its own folder chats/discord_{GUILD_CHANNEL}/" in guild["content"]
    assert chat_trust(config, f"discord:{DM}", None) == "member"  # unknown without the peer: fail closed


async def test_a_username_given_up_and_taken_by_someone_else_makes_no_owner(
        config: Config, tg: FakeTelegram) -> None:
    """Telegram lets anyone take a username its holder gave up: "@ada" in owners stays the user
    it was first seen with, the newcomer is a member, and the owner is told."""
    from nanobot.cli.status import trust_lines

    t = config.channels.telegram
    t.allow_from, t.owners = ["*"], ["@ada"]
    async with running_gateway(config) as gateway:
        tg.push_text(ALICE, ALICE, "/status", username="ada")
        await tg.wait_until(lambda: any("This is an" in text for text in texts(tg, ALICE)))
        tg.push_text(MALLORY, MALLORY, "/status", username="Ada")  # Ada took another name; Mallory took hers
        await tg.wait_until(lambda: texts(tg, MALLORY) and any("@Ada is now account 666's" in text
                                                                for text in texts(tg, ALICE)))
        held = await gateway.runtime.pairing.holders.all()
        tg.push_document(MALLORY, MALLORY, b"CANARY-taken-username", "planted.txt", username="Ada", caption="/status")
        await tg.wait_until(lambda: len(texts(tg, MALLORY)) == 2)
    # What the newcomer sends lands in their own folder, never the owner's inbox.
    [planted] = list(config.workspace_path.rglob("*planted.txt"))
    assert planted.read_bytes() == b"CANARY-taken-username" and "chats" in planted.relative_to(config.workspace_path).parts
    assert "Owners:    telegram @ada (account 42) in private chats" in trust_lines(config, [], None, held)
    assert "This is an owner chat" in texts(tg, ALICE)[0]
    assert "This is a member chat" in texts(tg, MALLORY)[0]
