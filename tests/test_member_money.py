"""Members and money: a member chat keeps the default model unless agents.memberModels lists
one, member chats together stop at their share of the day's budget, a call that would pass the
budget is not made, and the owner's /status and /budget always answer (also through the API)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from nanobot.agent.loop import FailedReply
from nanobot.api.keys import ApiKeys
from nanobot.config import Config, ModelChoice, Price
from nanobot.runtime import open_runtime
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.helpers import config_for, running_gateway
from tests.test_api import free_port

OWNER, MEMBER = "telegram:1", "telegram:-100"  # a private chat of the owner; a group


def priced(llm: FakeOpenAI, workspace: Path, *, budget: float | None = None, **prices: Price) -> Config:
    config = config_for(llm.base_url, workspace)
    config.channels.telegram.allow_from = ["1"]
    config.agents.models = {"big": ModelChoice(provider="openai", model="big-model"),
                            "small": ModelChoice(provider="openai", model="small-model")}
    # The stand-in answers with 10 prompt + 5 completion tokens: a fake-model call costs $1.00.
    config.providers["openai"].prices = {"fake-model": Price(input=0.0, output=200_000.0), **prices}
    config.agents.defaults.daily_budget_usd = budget
    return config


async def test_a_member_keeps_the_default_model_unless_listed(llm: FakeOpenAI, workspace: Path) -> None:
    config = priced(llm, workspace)
    llm.fallback = lambda body: reply(body["model"])
    async with open_runtime(config) as rt:
        shown = await rt.agent.handle(MEMBER, "/model")
        assert shown.startswith("Model: openai/fake-model.") and "none for member chats (agents.memberModels)" in shown
        refused = await rt.agent.handle(MEMBER, "/model big")
        assert "Member chats may not pick 'big'" in refused
        assert await rt.agent.handle(MEMBER, "/model nope") == ("Unknown model 'nope': there are none for member "
                                                               "chats (agents.memberModels).")  # was "choose one of none"
        assert await rt.agent.handle(MEMBER, "hi") == "fake-model"
        rt.agent.session(MEMBER).set_meta(model="big")  # picked before the rule: no longer honoured
        assert await rt.agent.handle(MEMBER, "hi") == "fake-model"
        assert await rt.agent.handle(OWNER, "/model big") == "Model set to openai/big-model for this chat."
        assert await rt.agent.handle(OWNER, "hi") == "big-model"
    config.agents.member_models = ["small"]
    async with open_runtime(config) as rt:
        assert await rt.agent.handle(MEMBER, "/model small") == "Model set to openai/small-model for this chat."
        assert await rt.agent.handle(MEMBER, "hi") == "small-model"


def test_member_models_must_be_models(tmp_path: Path) -> None:
    from nanobot.config import ConfigError, load_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"agents": {"memberModels": ["huge"]}}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "memberModels" in str(caught.value) and "'huge' not in agents.models" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_members_stop_at_their_share_and_the_owner_goes_on(llm: FakeOpenAI, workspace: Path) -> None:
    config = priced(llm, workspace, budget=4.0)  # members' share: $2.00, two calls
    llm.fallback = lambda body: reply("ok")
    async with open_runtime(config) as rt:
        assert [await rt.agent.handle(MEMBER, "hi") for _ in range(2)] == ["ok", "ok"]
        stopped = await rt.agent.handle(MEMBER, "hi")
        assert isinstance(stopped, FailedReply) and "budget for member chats is spent" in stopped
        assert "$" not in stopped  # members are shown no figures
        assert "$" not in await rt.agent.handle(MEMBER, "/status")
        assert await rt.agent.handle(MEMBER, "/budget") == \
            "Today's model budget for member chats is spent; it starts again at midnight."
        assert await rt.agent.handle(OWNER, "hi") == "ok"  # the owner's share is untouched
        budget = await rt.agent.handle(OWNER, "/budget")
        assert "$3.00 spent of $4.00" in budget and "Member chats: $2.00 of their $2.00" in budget
    assert len(llm.chat_requests) == 3


async def test_models_without_a_price_are_named_beside_the_budget(llm: FakeOpenAI, workspace: Path) -> None:
    """A budget cannot see a model with no price (its calls cost 0): status and /budget name
    every such model the daemon may call; a budget that silently never stopped anything was all
    the operator saw."""
    from nanobot.cli.status import budget_line

    config = priced(llm, workspace, budget=4.0, **{"big-model": Price(input=1.0)})
    config.agents.defaults.fallbacks = [ModelChoice(provider="openai", model="backup-model")]
    config.tools.transcription.provider = "openai"  # whisper-1, unpriced
    config.tools.speech.provider = "openai"
    config.providers["openai"].prices["gpt-4o-mini-tts"] = Price(input_chars=15.0)
    unpriced = "openai/backup-model, openai/small-model, openai/whisper-1"
    assert budget_line(config) == f"$4.00 a day; member chats $2.00; NOT COUNTED, no price " \
                                  f"(providers.<name>.prices): {unpriced}"
    async with open_runtime(config) as rt:
        assert f"Not counted, no price in providers.<name>.prices: {unpriced}." in await rt.agent.handle(OWNER, "/budget")
    config.agents.defaults.daily_budget_usd = None
    assert budget_line(config) == "none (agents.defaults.dailyBudgetUsd)"


async def test_a_call_that_would_pass_the_budget_is_not_made(llm: FakeOpenAI, workspace: Path) -> None:
    """The prompt's cost is known before the call: a long message that would pass the budget is
    refused before it is sent; so a turn overshoots by one reply at most."""
    config = priced(llm, workspace, budget=3.5, **{"fake-model": Price(input=1000.0, output=200_000.0)})
    llm.fallback = lambda body: reply("ok")
    async with open_runtime(config) as rt:
        assert await rt.agent.handle(OWNER, "short") == "ok"  # the prompt: ~$0.55 estimated; $1.01 spent
        refused = await rt.agent.handle(OWNER, "x" * 7000)  # ~2.3k tokens more: ~$2.9, past $3.50 with what was spent
        assert isinstance(refused, FailedReply) and "$1.01 of $3.50, and this call would cost about $" in refused
    assert len(llm.chat_requests) == 1


async def test_a_call_dearer_than_a_whole_day_is_not_put_off_to_midnight(llm: FakeOpenAI, workspace: Path) -> None:
    """A long conversation on a priced model can cost more per call than the day's budget: it was
    "Today's model budget is spent ($0.00 of $0.30 ...). I can answer again after midnight", untrue
    (nothing was spent, and tomorrow the same), and the owner was told the budget was spent."""
    config = priced(llm, workspace, budget=0.3, **{"fake-model": Price(input=1000.0, output=200_000.0)})
    config.channels.telegram.enabled = True  # notices have an owner chat (telegram:1)
    async with open_runtime(config) as rt:  # a prompt: ~$0.4 estimated
        owner, member = await rt.agent.handle(OWNER, "hi"), await rt.agent.handle(MEMBER, "hi")
        assert rt.bus.outbound.empty(), rt.bus.outbound.get_nowait().content  # no "budget is spent" notice
    assert isinstance(owner, FailedReply) and owner.startswith("This call alone would cost about $")
    assert "more than a whole day's model budget ($0.30, agents.defaults.dailyBudgetUsd): /new" in owner
    assert member == "This conversation has grown too long for my daily model budget: /new starts a fresh one."
    assert llm.chat_requests == []


@pytest.fixture
def api_config(llm: FakeOpenAI, workspace: Path) -> Config:
    config = priced(llm, workspace, budget=2.0)  # members' share: $1.00, one call
    config.gateway.heartbeat.enabled = False
    config.gateway.api.enabled = True
    config.gateway.api.listen = f"127.0.0.1:{free_port()}"
    return config


async def test_a_member_key_never_locks_the_owner_out(api_config: Config, llm: FakeOpenAI) -> None:
    llm.fallback = lambda body: reply("ok")
    base = f"http://{api_config.gateway.api.listen}/v1/chat/completions"

    async def ask(key: str, text: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            async with http.post(base, headers={"Authorization": f"Bearer {key}"}, json={
                    "model": "nanobot", "messages": [{"role": "user", "content": text}]}) as resp:
                body = await resp.json()
                return resp.status, body["choices"][0]["message"]["content"] if resp.status == 200 else body["error"]["code"]

    async with running_gateway(api_config, with_services=True) as gateway:
        keys = ApiKeys(gateway.runtime.db)
        owner, member = await keys.add("ada", owner=True), await keys.add("bob")
        assert await ask(member, "/model big") == (200, "Member chats may not pick 'big': the owner lists theirs "
                                                        "in agents.memberModels (none for member chats "
                                                        "(agents.memberModels)).")
        assert await ask(member, "spend") == (200, "ok")
        assert await ask(member, "spend more") == (429, "insufficient_quota")  # the members' share is spent
        assert await ask(owner, "mine") == (200, "ok")
        assert await ask(owner, "more") == (429, "insufficient_quota")  # now the whole budget is
        status, text = await ask(owner, "/status")
        assert status == 200 and "an owner chat" in text
        status, text = await ask(owner, "/budget")
        assert status == 200 and "$2.00 spent of $2.00" in text
        status, text = await ask(member, "/status")
        assert status == 200 and "$" not in text
    assert len(llm.chat_requests) == 2
