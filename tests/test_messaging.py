"""send_message: which chats it may reach, and where the message goes (bus or terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest

from nanobot.bus import Identity
from nanobot.access import AccessGate, PairingStore
from nanobot.config import Config
from nanobot.tools.builtin import default_registry
from nanobot.runtime import open_runtime
from nanobot.tools.registry import ToolContext

CURRENT = "telegram:42"


@pytest.fixture
def config(workspace: Path) -> Config:
    cfg = Config()
    cfg.agents.defaults.workspace = str(workspace)
    cfg.channels.telegram.enabled = True
    cfg.channels.telegram.allow_from = ["42", "77"]
    return cfg


@pytest.fixture
async def ctx(config: Config, workspace: Path) -> AsyncIterator[ToolContext]:
    config.providers["openai"].api_key = "unused"  # no model is called here
    async with open_runtime(config) as rt:
        await rt.sessions.open(CURRENT)  # every path into a chat opens it first
        yield rt.chat_context(CURRENT)


async def send(ctx: ToolContext, **args: str) -> str:
    return await default_registry(ctx.config).call("send_message", args, ctx)


def sent(ctx: ToolContext) -> list[tuple[str, str]]:
    out = []
    bus = ctx.needs_services("a test").bus
    while not bus.outbound.empty():
        msg = bus.outbound.get_nowait()
        out.append((msg.target, msg.content))
    return out


async def test_to_the_current_chat(ctx: ToolContext) -> None:
    assert await send(ctx, content="hello") == f"Message sent to {CURRENT}."
    assert sent(ctx) == [(CURRENT, "hello")]


async def test_to_chats_the_owner_vouched_for(ctx: ToolContext, home: Path) -> None:
    await send(ctx, content="listed", to="telegram:77")  # in allowFrom
    store: PairingStore = ctx.services.pairing
    _, offer = await AccessGate(store).check("telegram", Identity("555", "carol"), [], True)
    await store.approve(offer.rsplit(" ", 1)[-1])
    await send(ctx, content="paired", to="telegram:555")  # a paired user's private chat
    (home / "sessions").mkdir(exist_ok=True)
    (home / "sessions" / "telegram_-1001.jsonl").write_text("")
    await send(ctx, content="group", to="telegram:-1001")  # a chat that has talked to the bot
    assert sent(ctx) == [("telegram:77", "listed"), ("telegram:555", "paired"), ("telegram:-1001", "group")]


async def test_any_other_chat_is_refused(ctx: ToolContext, home: Path) -> None:
    (home / "sessions").mkdir(exist_ok=True)
    (home / "sessions" / "telegram_1_2.jsonl").write_text("")
    for target in ("telegram:999", "telegram:1/2", "discord:42"):
        with pytest.raises(PermissionError, match="not a chat I may write to"):
            await send(ctx, content="spam", to=target)
    assert sent(ctx) == []


async def test_bad_arguments(ctx: ToolContext, config: Config) -> None:
    with pytest.raises(ValueError, match="channel:chat_id"):
        await send(ctx, content="x", to="telegram")
    with pytest.raises(ValueError, match="empty"):
        await send(ctx, content="  ")
    config.channels.discord.allow_from = ["*"]
    with pytest.raises(RuntimeError, match="not enabled"):
        await send(ctx, content="x", to="discord:5")


async def test_the_terminal_chat_reaches_only_itself(config: Config) -> None:
    """`nanobot agent` runs its own gateway with the terminal alone: this chat, no other."""
    config.providers["openai"].api_key = "unused"
    async with open_runtime(config, terminal=True) as rt:
        await rt.sessions.open("cli:default")
        ctx = rt.chat_context("cli:default")
        assert await send(ctx, content="look here") == "Message sent to cli:default."
        assert sent(ctx) == [("cli:default", "look here")]
        with pytest.raises(RuntimeError, match="nanobot gateway"):
            await send(ctx, content="x", to="telegram:77")


async def test_a_message_is_cut_at_the_limit_saying_so(ctx: ToolContext) -> None:
    from nanobot.tools.messaging import MAX_MESSAGE_CHARS

    await send(ctx, content="y" * (MAX_MESSAGE_CHARS + 10))
    [(target, text)] = sent(ctx)
    assert text.startswith("y" * MAX_MESSAGE_CHARS + "\n\n[… cut here: 10 more characters")
    assert text.count("y") == MAX_MESSAGE_CHARS
