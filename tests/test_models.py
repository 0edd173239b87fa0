"""Models that do not go silent: fallbacks and cooldowns across two scripted model servers,
/model per chat, cost from prices, and the daily budget."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from nanobot.agent.loop import FailedReply
from nanobot.config import Config, ModelChoice, Price, ProviderConfig
from nanobot.runtime import open_runtime
from tests.fakes.openai_server import FakeOpenAI, delayed, error, reply
from tests.helpers import config_for


@pytest.fixture
async def backup() -> FakeOpenAI:
    async with FakeOpenAI() as server:
        yield server


def two_providers(llm: FakeOpenAI, backup: FakeOpenAI, workspace: Path, **kw) -> Config:
    config = config_for(llm.base_url, workspace, **kw)
    config.providers["openai"].max_retries = 0
    config.providers["local"] = ProviderConfig(api_base=backup.base_url, max_retries=0, timeout=5)
    config.agents.defaults.fallbacks = [ModelChoice(provider="local", model="llama")]
    return config


@pytest.mark.parametrize("failure", [error(500), error(429), error(503), delayed(reply("late"), 2)])
async def test_a_failing_model_falls_back_and_cools_down(llm: FakeOpenAI, backup: FakeOpenAI, workspace: Path,
                                                        failure) -> None:
    config = two_providers(llm, backup, workspace)
    config.providers["openai"].timeout = 0.5
    llm.script(failure)
    backup.script(reply("from the backup"), reply("backup again"))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:f", "hi") == "from the backup"
        assert await rt.agent.handle("cli:f", "and again") == "backup again"  # primary cooling down: not asked
        assert "openai" in rt.provider.cooling_down()
        status = await rt.agent.handle("cli:f", "/status")
        assert "Cooling down: openai" in status
        assert "  local/llama: today 2 calls, 20 prompt + 10 completion tokens;" in status  # the fallback's use is visible
        assert "  openai/fake-model: today 1 call (1 failed), 0 prompt + 0 completion tokens;" in status
        failed = status.split("  openai/fake-model: ")[1].splitlines()[1]  # why, under it (an operator's first question)
        assert re.fullmatch(r"    last failed at \d\d:\d\d: the model server (answered HTTP|did not answer in time).*", failed)
        assert status.count("last failed at") == 1  # the fallback's calls did not fail
        rows = [tuple(r) for r in await rt.db.fetch("SELECT provider, model, outcome FROM model_calls ORDER BY id")]
    assert len(llm.chat_requests) == 1 and backup.chat_requests[0]["model"] == "llama"
    assert rows[0][:2] == ("openai", "fake-model") and rows[0][2] != "ok"
    assert rows[1:] == [("local", "llama", "ok"), ("local", "llama", "ok")]  # which model answered


async def test_a_bad_request_does_not_fall_back(llm: FakeOpenAI, backup: FakeOpenAI, workspace: Path) -> None:
    llm.script(error(400, message="messages: invalid"))
    async with open_runtime(two_providers(llm, backup, workspace)) as rt:
        answer = await rt.agent.handle("cli:f", "hi")
    assert isinstance(answer, FailedReply) and "HTTP 400" in answer and backup.chat_requests == []


async def test_a_spent_quota_is_not_asked_again_but_falls_back(llm: FakeOpenAI, backup: FakeOpenAI,
                                                               workspace: Path) -> None:
    """OpenAI says a spent quota with a 429, as it says a rate limit: asking again in a few
    seconds brings the same answer (three retries, seven seconds, before)."""
    quota = error(429, message="You exceeded your current quota, please check your plan and billing details.",
                  code="insufficient_quota")
    llm.script(quota)  # asked again, the server would answer "(script exhausted)"
    config = config_for(llm.base_url, workspace)
    config.providers["openai"].max_retries = 3
    async with open_runtime(config) as rt:
        answer = await rt.agent.handle("cli:q", "hi")
    assert isinstance(answer, FailedReply) and "exceeded your current quota" in answer and len(llm.chat_requests) == 1
    llm.script(quota)
    backup.script(reply("from the backup"))
    async with open_runtime(two_providers(llm, backup, workspace)) as rt:
        assert await rt.agent.handle("cli:q", "hi") == "from the backup"


async def test_when_nothing_answers_the_reply_names_what_was_tried(llm: FakeOpenAI, backup: FakeOpenAI,
                                                                    workspace: Path) -> None:
    llm.script(error(502))
    backup.script(error(500, message="out of memory"))
    async with open_runtime(two_providers(llm, backup, workspace)) as rt:
        answer = await rt.agent.handle("cli:f", "hi")
    assert isinstance(answer, FailedReply)
    assert "no model answered (tried openai/fake-model: the model server answered HTTP 502" in answer
    assert "local/llama: the model server answered HTTP 500: out of memory" in answer


async def test_a_single_provider_is_asked_even_while_cooling(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(error(503), reply("back"))
    config = config_for(llm.base_url, workspace)
    config.providers["openai"].max_retries = 0
    async with open_runtime(config) as rt:
        assert isinstance(await rt.agent.handle("cli:s", "hi"), FailedReply)
        assert await rt.agent.handle("cli:s", "hi again") == "back"


async def test_model_command_persists_across_a_restart(llm: FakeOpenAI, backup: FakeOpenAI, workspace: Path) -> None:
    config = two_providers(llm, backup, workspace)
    config.channels.telegram.allow_from = ["1"]  # an owner chat: it may pick any model
    config.agents.models = {"small": ModelChoice(provider="local", model="llama-3b"),
                            "big": ModelChoice(provider="openai", model="gpt-big")}
    backup.script(reply("small answer"))
    async with open_runtime(config) as rt:
        assert (await rt.agent.handle("telegram:1", "/model")).startswith("Model: openai/fake-model. Choices: small, big")
        assert await rt.agent.handle("telegram:1", "/model small") == "Model set to local/llama-3b for this chat."
        assert "Unknown model 'huge'" in await rt.agent.handle("telegram:1", "/model huge")
    async with open_runtime(config) as rt:  # a new process: the choice is in the session
        assert (await rt.agent.handle("telegram:1", "/model")).startswith("Model: local/llama-3b (small).")
        assert await rt.agent.handle("telegram:1", "hi") == "small answer"
        assert await rt.agent.handle("telegram:2", "hi") == "(script exhausted)"  # other chats keep the default
        assert await rt.agent.handle("telegram:1", "/model default") == "Model set to openai/fake-model for this chat."
    assert backup.chat_requests[0]["model"] == "llama-3b" and llm.chat_requests[0]["model"] == "fake-model"


def priced(config: Config, budget: float | None = None) -> Config:
    # The stand-in's usage (10 + 5 tokens) makes a call $0.00001 + $0.02; a prompt of this size
    # is estimated at about $0.002 before the call.
    config.providers["openai"].prices = {"fake-model": Price(input=1.0, output=4000.0)}
    config.agents.defaults.daily_budget_usd = budget
    return config


async def test_cost_is_shown_per_model_today_and_in_total(llm: FakeOpenAI, workspace: Path, home: Path) -> None:
    from tests.test_cli import nanobot

    llm.script(reply("a"), reply("b"))
    async with open_runtime(priced(config_for(llm.base_url, workspace))) as rt:
        await rt.agent.handle("cli:c", "one")
        await rt.agent.handle("cli:c", "two")
        status = await rt.agent.handle("cli:c", "/status")
    assert "Cost: $0.0400 today, $0.0400 in total" in status
    assert ("  openai/fake-model: today 2 calls, 20 prompt + 10 completion tokens, $0.0400; in total 2 calls, 20 prompt + 10 completion tokens, $0.0400"
            in status)
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"workspace": str(workspace)}}}))
    code, out, _ = await nanobot("status", home=home)
    assert "Usage [tools]: 2 model calls, 20 prompt + 10 completion tokens, $0.0400" in out
    assert "Cost: $0.0400 today, $0.0400 in total" in out and "  openai/fake-model: today 2 calls, 20 prompt + 10 completion tokens" in out


async def test_the_daily_budget_stops_model_calls_and_resets_at_midnight(
        llm: FakeOpenAI, workspace: Path) -> None:

    config = priced(config_for(llm.base_url, workspace, timezone="Pacific/Auckland"), budget=0.03)
    config.channels.telegram.enabled, config.channels.telegram.allow_from = True, ["1"]  # the owner chat for notices
    llm.script(reply("a"), reply("b"), reply("after midnight"))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("telegram:1", "one") == "a"
        assert await rt.agent.handle("telegram:1", "two") == "b"  # $0.02 spent: still under $0.03
        spent = await rt.agent.handle("telegram:1", "three")
        again = await rt.agent.handle("telegram:1", "four")
        notices = [rt.bus.outbound.get_nowait().content for _ in range(rt.bus.outbound.qsize())]
        assert isinstance(spent, FailedReply) and spent.startswith("Today's model budget is spent ($0.04 of $0.03)")
        assert "after midnight (Pacific/Auckland)" in spent and again == spent
        assert notices == ["🔔 Today's model budget is spent ($0.04 of $0.03, agents.defaults.dailyBudgetUsd): "
                           "no model calls until midnight."]  # once, not per refused message
        from nanobot.usage import start_of_today

        # the calls were yesterday, local time
        await rt.db.execute("UPDATE model_calls SET ts = $1", start_of_today("Pacific/Auckland") - 60)
        assert await rt.agent.handle("telegram:1", "five") == "after midnight"
    assert len(llm.chat_requests) == 3


async def test_the_terminal_is_told_in_its_reply_without_a_notice_per_run(llm: FakeOpenAI, workspace: Path) -> None:

    config = priced(config_for(llm.base_url, workspace), budget=0.01)
    config.channels.telegram.enabled, config.channels.telegram.allow_from = True, ["1"]
    llm.script(reply("a"))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:default", "one") == "a"
        spent = await rt.agent.handle("cli:default", "two")
        assert spent.startswith("Today's model budget is spent") and rt.bus.outbound.qsize() == 0


async def test_a_member_chat_sees_only_its_own_figures(llm: FakeOpenAI, workspace: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    config = priced(config_for(llm.base_url, workspace))
    config.providers["openai"].max_retries = 0
    llm.script(reply("a"), reply("b"), error(503, message="upstream 10.0.0.5:8080 refused key sk-CANARY"))
    caplog.set_level(logging.INFO, logger="nanobot.agent.loop")
    async with open_runtime(config) as rt:
        await rt.agent.handle("cli:c", "one")
        await rt.agent.handle("cli:c", "two")
        failed = await rt.agent.handle("telegram:-100", "three")  # a group: a member chat; the server fails
        member = await rt.agent.handle("telegram:-100", "/status")
        owner = await rt.agent.handle("cli:c", "/status")
    # Why is the owner's: the server's words may name the owner's network or the ends of a key.
    assert failed == "Sorry, I could not get an answer from the model just now. Please try again in a while."
    assert "CANARY" not in failed + member and "last failed at" in owner and "sk-CANARY" in owner
    assert any("telegram:-100: no answer from the model" in r.getMessage() and "sk-CANARY" in r.getMessage()
               for r in caplog.records)  # the daemon's log has why
    assert "a member chat" in member and "tools: 1 model call (1 failed)" in member
    assert "Cost" not in member and "fake-model:" not in member and "Cooling" not in member
    assert "tools: 3 model calls (1 failed)" in owner and "Cost: $0.0400 today" in owner
