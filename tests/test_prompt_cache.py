"""Requests a provider's prompt cache can reuse (issue "Every byte sent once"): each request of a
chat starts with the whole previous request of that chat, byte for byte, even when the minute
changes between turns; and two chats share most of their system prompt."""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

import pytest

from nanobot.agent import context
from nanobot.runtime import open_runtime
from nanobot.workspace_template import copy_template
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.helpers import config_for


def shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("mode", ["code", "tools"])
async def test_each_turn_extends_the_previous_request_when_the_minute_changes(
        llm: FakeOpenAI, workspace: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    minutes = count()
    monkeypatch.setattr(context, "now_line", lambda tz: f"Friday 2026-11-27 20:{next(minutes):02d} ({tz})")
    copy_template(workspace)
    llm.fallback = lambda body: reply("fine")
    async with open_runtime(config_for(llm.base_url, workspace, mode=mode)) as rt:
        for text in ("hello", "what is in my workspace?", "thanks"):
            await rt.agent.handle("cli:cache", text)
    first, second, third = (r["messages"] for r in llm.raw_requests)
    assert second[:len(first)] == first and third[:len(second)] == second  # byte for byte: the same JSON
    assert json.dumps(third).startswith(json.dumps(second)[:-1])
    assert [m["content"].rsplit("(sent ", 1)[1] for m in third if m["role"] == "user"] == \
        ["Friday 2026-11-27 20:00 (UTC))", "Friday 2026-11-27 20:01 (UTC))", "Friday 2026-11-27 20:02 (UTC))"]


async def test_two_chats_share_their_system_prompt_up_to_what_is_their_own(
        llm: FakeOpenAI, workspace: Path) -> None:
    copy_template(workspace)
    llm.fallback = lambda body: reply("fine")
    async with open_runtime(config_for(llm.base_url, workspace, mode="code")) as rt:
        await rt.agent.handle("cli:one", "hello")
        await rt.agent.handle("cli:two", "hello")
    one, two = (r["messages"][0]["content"] for r in llm.raw_requests)
    assert shared_prefix(one, two) >= 0.8 * len(one)
