"""The dispatcher between the channels and the agent, in the real gateway with the real agent and
openai SDK against the scripted model server: order per chat, parallel chats, /stop, crashes,
idle workers, shutdown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from nanobot.bus import InboundMessage, OutboundMessage
from nanobot.config import Config
from nanobot.agent.loop import TURN_CRASHED as APOLOGY
from nanobot.gateway.app import Gateway, Pace
from nanobot.gateway.dispatcher import RESUME_NOTICE, SHUTDOWN_NOTE, STOPPED_NOTE
from nanobot.providers.base import ChatRequest, LLMResponse, Provider
from nanobot.runtime import Runtime, open_runtime
from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.recorder import Recorder
from tests.helpers import config_for


def last_user(body: dict[str, Any]) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


@pytest.fixture
def config(llm: FakeOpenAI, workspace: Path) -> Config:
    return config_for(llm.base_url, workspace)


class Harness:
    """A gateway on a runtime with one channel, fed through its intake and read at the channel."""

    def __init__(self, runtime: Runtime, gateway: Gateway, platform: Recorder) -> None:
        self.rt, self.gateway, self.dispatcher, self.platform = runtime, gateway, gateway.dispatcher, platform
        self.typing: list[OutboundMessage] = []

    async def say(self, text: str, chat: str = "1") -> None:
        await self.gateway.intake.accept([InboundMessage("telegram", chat, chat, text)])

    async def replies(self, count: int, timeout: float = 5.0) -> list[OutboundMessage]:
        """The next ``count`` text messages (typing indicators are set aside)."""
        out: list[OutboundMessage] = []
        async with asyncio.timeout(timeout):
            while len(out) < count:
                msg = await self.platform.sent.get()
                (out if msg.kind == "text" else self.typing).append(msg)
        return out


async def harness(config: Config, provider: Any = None, typing_interval: float = 4.0) -> AsyncIterator[Harness]:
    async with open_runtime(config, provider=provider) as rt:
        gateway, platform = Gateway(rt, pace=Pace(typing_s=typing_interval)), Recorder("telegram")
        gateway.add_internal_channel(platform)
        await gateway.start()
        try:
            yield Harness(rt, gateway, platform)
        finally:
            await gateway.stop()


@pytest.fixture
async def h(config: Config) -> AsyncIterator[Harness]:
    async for item in harness(config):
        yield item


async def test_a_message_becomes_a_turn_and_the_reply_goes_out(h: Harness, llm: FakeOpenAI) -> None:
    llm.script(reply("hello, human"))
    await h.say("hi")
    [out] = await h.replies(1)
    assert (out.channel, out.chat_id, out.content) == ("telegram", "1", "hello, human")
    assert last_user(llm.chat_requests[0]) == "hi"
    assert h.gateway.channels.failed == {}  # the gateway's own channel is not started as an installed one


async def test_order_within_a_chat_and_overlap_across_chats(h: Harness, llm: FakeOpenAI) -> None:
    llm.fallback = lambda body: delayed(reply(f"re: {last_user(body)}"), 0.2)
    for text in ("a1", "a2", "a3"):
        await h.say(text, chat="A")
    await h.say("b1", chat="B")
    first = (await h.replies(1))[0]
    # Both chats were at the model before either answer came back: they ran side by side.
    assert {last_user(r) for r in llm.chat_requests} == {"a1", "b1"} and first.content in ("re: a1", "re: b1")
    rest = await h.replies(3)
    by_chat: dict[str, list[str]] = {}
    for msg in [first, *rest]:
        by_chat.setdefault(msg.chat_id, []).append(msg.content)
    assert by_chat == {"A": ["re: a1", "re: a2", "re: a3"], "B": ["re: b1"]}
    assert [last_user(r) for r in llm.chat_requests if last_user(r).startswith("a")] == ["a1", "a2", "a3"]


async def test_concurrency_is_capped(llm: FakeOpenAI, config: Config) -> None:
    config.gateway.max_concurrent_sessions = 1
    async for h in harness(config):
        chats = [await h.rt.sessions.open(key) for key in ("telegram:X", "telegram:Y")]
        turns_ended_at_each_call: list[int] = []

        def answer(body: dict[str, Any]) -> Any:
            turns_ended_at_each_call.append(sum(m["role"] == "assistant" for c in chats for m in c.messages))
            return delayed(reply(f"re: {last_user(body)}"), 0.1)

        llm.fallback = answer
        await h.say("x", chat="X")
        await h.say("y", chat="Y")
        await h.replies(2)
        assert turns_ended_at_each_call == [0, 1]  # the second chat waited for the first one's slot


async def test_typing_is_shown_while_a_turn_runs(config: Config, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("done"), 0.3))
    async for h in harness(config, typing_interval=0.05):
        await h.say("work")
        await h.replies(1)
        assert len(h.typing) >= 3 and all(t.chat_id == "1" for t in h.typing)
        await h.say("/help")  # commands answer at once: no typing indicator
        await h.replies(1)
        assert h.platform.sent.empty()


async def test_stop_cancels_the_running_turn_and_keeps_the_queue(h: Harness, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("too late"), 60), reply("fresh answer"))
    await h.say("think hard")
    await h.say("queued behind")
    await llm.request_event.wait()
    started = time.monotonic()
    await h.say("/stop")
    [stopped] = await h.replies(1)
    assert stopped.content == "Stopped." and time.monotonic() - started < 20  # not the model's 60 s
    [fresh] = await h.replies(1)  # the queued message ran next
    assert fresh.content == "fresh answer"
    history = [(m["role"], m["content"]) for m in h.rt.agent.session("telegram:1").messages]
    assert history[:3] == [("user", "think hard"), ("assistant", STOPPED_NOTE), ("user", "queued behind")]
    assert ("assistant", STOPPED_NOTE) in [(m["role"], m["content"]) for m in llm.chat_requests[1]["messages"]]
    await h.say("/stop")
    assert (await h.replies(1))[0].content == "Nothing is running."


class FailsOnce(Provider):
    """A provider whose first call hits a bug (not a ProviderError): the turn crashes."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, request: ChatRequest) -> LLMResponse:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("a bug")
        return LLMResponse("recovered")

    async def close(self) -> None:
        pass


async def test_a_crashing_turn_gets_an_apology_and_the_worker_lives_on(config: Config) -> None:
    async for h in harness(config, provider=FailsOnce()):
        await h.say("first")
        assert (await h.replies(1))[0].content == APOLOGY
        await h.say("second")
        assert (await h.replies(1))[0].content == "recovered"


async def test_idle_workers_are_reclaimed(config: Config, llm: FakeOpenAI) -> None:
    config.gateway.idle_worker_seconds = 0.05
    async for h in harness(config):
        await h.say("hi")
        await h.replies(1)
        worker = h.dispatcher.workers["telegram:1"]
        await asyncio.wait_for(worker.task, 2)
        assert "telegram:1" not in h.dispatcher.workers
        await h.say("again")  # a new worker picks the chat up
        assert (await h.replies(1))[0].content == "(script exhausted)"


async def test_shutdown_lets_turns_finish_within_the_grace(h: Harness, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("made it"), 0.2))
    await h.say("quick")
    await llm.request_event.wait()
    await h.dispatcher.shutdown(grace=5)
    assert (await h.replies(1))[0].content == "made it"


async def test_shutdown_cancels_turns_after_the_grace(h: Harness, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("never"), 60))
    await h.say("slow")
    await llm.request_event.wait()
    started = time.monotonic()
    await h.dispatcher.shutdown(grace=0.1)
    assert time.monotonic() - started < 20  # not the model's 60 s
    assert h.rt.agent.session("telegram:1").messages[-1]["content"] == SHUTDOWN_NOTE
    assert [m.content for m in await h.replies(1)] == [RESUME_NOTICE]  # answered after the restart


async def test_shutdown_tells_chats_whose_messages_were_still_queued(h: Harness, llm: FakeOpenAI) -> None:
    llm.script(delayed(reply("first"), 0.3))
    await h.say("first")
    await llm.request_event.wait()
    await h.say("second, queued behind the first")
    await h.dispatcher.shutdown(grace=5)
    assert sorted(m.content for m in await h.replies(2)) == sorted(["first", RESUME_NOTICE])
