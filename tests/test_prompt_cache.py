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
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.fakes.prompt_cache import PromptCache, rendered, shared_prefix
from tests.helpers import config_for


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


def cached_reply(text: str, prompt: int, cached: int, completion: int = 10) -> dict:
    """A reply whose usage says, as OpenAI does, how much of the prompt came from the cache."""
    return {"message": {"role": "assistant", "content": text},
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


@pytest.mark.parametrize("stream", [False, True])
async def test_cached_prompt_tokens_are_recorded_priced_and_shown(
        llm: FakeOpenAI, workspace: Path, stream: bool) -> None:
    from nanobot.config import Price

    config = config_for(llm.base_url, workspace, mode="tools")
    config.providers["openai"].prices = {"fake-model": Price(input=2.0, output=8.0, cached_input=0.5)}
    llm.script(cached_reply("one", prompt=2_000, cached=1_536), cached_reply("two", prompt=1_000_000, cached=0))
    async with open_runtime(config) as rt:
        if stream:  # the streamed path reads usage from the last chunk
            from nanobot.agent.streaming import ReplyStream

            async def shown(text: str) -> None:
                pass

            await rt.agent.handle("cli:c", "hi", stream=ReplyStream(shown))
        else:
            await rt.agent.handle("cli:c", "hi")
        await rt.agent.handle("cli:c", "again")
        status = await rt.agent.handle("cli:c", "/status")
        rows = await rt.db.fetch("SELECT prompt_tokens, cached_tokens, cost_usd FROM model_calls ORDER BY id")
    assert [(r[0], r[1]) for r in rows] == [(2_000, 1_536), (1_000_000, 0)]
    assert rows[0][2] == pytest.approx((464 * 2.0 + 1_536 * 0.5 + 10 * 8.0) / 1e6)  # the cached part at cachedInput
    assert rows[1][2] == pytest.approx((1_000_000 * 2.0 + 10 * 8.0) / 1e6)
    assert "1002000 prompt (1536 cached)" in status


@pytest.mark.parametrize("enabled", [True, False])
async def test_prompt_cache_key_is_per_chat_and_only_when_asked(llm: FakeOpenAI, workspace: Path, enabled: bool) -> None:
    config = config_for(llm.base_url, workspace, mode="tools")
    config.providers["openai"].prompt_cache_key = enabled
    llm.fallback = lambda body: reply("fine")
    async with open_runtime(config) as rt:
        for chat in ("cli:one", "cli:one", "cli:two"):
            await rt.agent.handle(chat, "hi")
    keys = [r.get("prompt_cache_key") for r in llm.raw_requests]
    if not enabled:
        assert keys == [None, None, None]
        return
    assert keys[0] == keys[1] != keys[2] and all(k and "one" not in k and "cli" not in k for k in keys)


async def test_a_terminal_without_a_gateway_is_told_run_cron_cannot_test_jobs_there(
        llm: FakeOpenAI, workspace: Path) -> None:
    """The cron skill says to test every job with run_cron; without a gateway it cannot run
    one. The model reads that in its prompt instead of paying a call to find out."""
    llm.fallback = lambda body: reply("fine")
    async with open_runtime(config_for(llm.base_url, workspace, mode="code"), terminal=True) as rt:  # nanobot agent
        await rt.agent.handle("cli:t", "every morning, count my notes")
    system = llm.raw_requests[0]["messages"][0]["content"]
    assert "test one by running its code, not run_cron" in system


async def test_a_long_result_does_not_break_the_prefix(llm: FakeOpenAI, workspace: Path) -> None:
    """Before, a result over 2 KB was shortened once it was no longer the newest: the request
    after a big result shared 23% of the one before."""
    (workspace / "big.txt").write_text("line\n" * 4_000)  # 20 KB
    llm.script(tool_call("read_file", {"path": "big.txt"}), tool_call("list_dir", {}), reply("read it"),
               reply("you're welcome"))
    async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
        await rt.agent.handle("cli:big", "read big.txt")
        await rt.agent.handle("cli:big", "thanks")
    requests = [r["messages"] for r in llm.raw_requests]
    for before, after in zip(requests, requests[1:]):
        assert after[:len(before)] == before


async def test_the_exceptions_are_each_one_debug_line(llm: FakeOpenAI, workspace: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """/new and a mode switch rewrite what the cache holds: each says so once, at debug."""
    llm.fallback = lambda body: reply("fine")
    caplog.set_level("DEBUG", logger="nanobot.prompt_cache")
    async with open_runtime(config_for(llm.base_url, workspace)) as rt:
        for text in ("hello", "/mode tools", "again", "/new", "hi"):
            await rt.agent.handle("cli:cache", text)
    said = [r.getMessage() for r in caplog.records if r.name == "nanobot.prompt_cache"]
    assert said == ["[cli:cache] the prompt cache starts over: /mode tools",
                    "[cli:cache] the prompt cache starts over: /new"]


async def test_a_tool_found_on_demand_leaves_the_tools_list_as_it_was(workspace: Path) -> None:
    """find_tools then use_tool, in tools mode: every request, tools list included, starts with
    the whole previous one, and the cached tokens the server reports reach /status."""
    copy_template(workspace)
    (workspace / "a.txt").write_text("a")
    cache = PromptCache()
    async with FakeOpenAI(cache=cache) as llm:
        llm.script(tool_call("find_tools", {"query": "move file"}),
                   tool_call("use_tool", {"name": "move_file", "arguments": {"src": "a.txt", "dst": "b.txt"}}),
                   reply("Renamed."), tool_call("list_dir", {"path": "."}), reply("b.txt"))
        async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
            await rt.agent.handle("cli:found", "rename a.txt to b.txt")
            await rt.agent.handle("cli:found", "what is there now?")
            status = await rt.agent.handle("cli:found", "/status")
    texts = [rendered(r) for r in llm.raw_requests]
    assert all(shared_prefix(before, after) == len(before) - 1 for before, after in zip(texts, texts[1:]))
    assert (workspace / "b.txt").exists() and cache.prefix_tokens[-1] > 1024
    assert f"({sum(n // 128 * 128 for n in cache.prefix_tokens)} cached)" in status


async def test_only_the_newest_long_results_are_kept(llm: FakeOpenAI, workspace: Path) -> None:
    """Each long result is kept whole in the chat's .results/; the oldest go past KEPT_RESULTS."""
    from nanobot.agent.prompt_size import KEPT_RESULTS

    results = workspace / ".results"
    results.mkdir()
    older = [f"20200101-0000{n:02d}-000000000.txt" for n in range(KEPT_RESULTS)]  # a full folder, from before
    for name in older:
        (results / name).write_text("an old result")
    for n in range(2):
        (workspace / f"big{n}.txt").write_text(f"line {n}\n" * 4_000)
    llm.script(*[tool_call("read_file", {"path": f"big{n}.txt"}) for n in range(2)], reply("read them"))
    async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
        await rt.agent.handle("cli:big", "read big.txt twice")
    shown = [r["messages"][-1]["content"] for r in llm.raw_requests[1:]]
    kept = [line.split("all of it is in ")[1].split(":")[0] for text in shown for line in text.splitlines()
            if "all of it is in" in line]
    assert len(kept) == 2 and sorted(p.name for p in results.iterdir()) == \
        sorted(older[2:] + [Path(k).name for k in kept])
