"""Memory consolidation: the policy in isolation, then end to end through the real openai SDK."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from nanobot.agent.memory import parse_answer, plan_cut, prompt_history, transcript
from nanobot.runtime import open_runtime
from nanobot.chat_names import history_file
from nanobot.session import KEEP_IN_MEMORY, Session
from nanobot.session_files import load_session
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

OLD_MEMORY = "# Long-term memory\n- The user likes tea.\n"
NEW_MEMORY = "# Long-term memory\n- The user likes tea.\n- Name: Ada; project: orbit-sim in ~/code/orbit.\n"
HISTORY = "Ada introduced herself and described her orbit-sim project; we fixed its integrator."


def held(messages: list[dict[str, Any]]) -> Session:
    """A chat holding ``messages`` (nothing written anywhere)."""
    return Session("cli:x", None, messages=messages)  # type: ignore[arg-type]


def msgs(*roles: str) -> list[dict[str, Any]]:
    """Messages from role letters: u(ser), a(ssistant)."""
    return [{"role": {"u": "user", "a": "assistant"}[r], "content": f"{r} {i}"} for i, r in enumerate(roles)]


# ---------------------------------------------------------------------------------- policy


def test_plan_cut_keeps_half_a_window_and_starts_it_at_a_user_message() -> None:
    assert plan_cut(held(msgs(*"ua" * 2)), 0, 4) is None  # 4 messages fit a window of 4
    assert plan_cut(held(msgs(*"ua" * 3)), 0, 4) == 4  # keep the last 2: [u a u a | u a]
    assert plan_cut(held(msgs(*"ua" * 3)), 4, 4) is None  # already done up to 4
    # the kept part starts at a user message even when tool messages sit at the cut
    roles = ["user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert plan_cut(held([{"role": r} for r in roles]), 0, 6) == 4  # target 7 -> back to the user message at 4
    # no user message at or before the target: the next one after it
    roles = ["user", "assistant", "tool", "tool", "tool", "tool", "user", "assistant"]
    assert plan_cut(held([{"role": r} for r in roles]), 0, 4) == 6
    # a backlog is worked off at most a window at a time
    assert plan_cut(held(msgs(*"ua" * 20)), 0, 4) == 4
    # nothing to cut at: a single long tool exchange
    assert plan_cut(held([{"role": "user"}] + [{"role": "tool"}] * 9), 0, 4) is None


def session_with(tmp_path: Path, n: int) -> Session:
    s = load_session("cli:x", tmp_path / "s.jsonl")
    for i in range(n):
        s.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"})
    return s


def test_prompt_history_skips_what_is_consolidated(tmp_path: Path) -> None:
    s = session_with(tmp_path, 6)
    assert [m["content"] for m in prompt_history(s, 4)] == ["m2", "m3", "m4", "m5"]
    s.set_meta(consolidated_upto=4, consolidated_ts=s.messages[3]["ts"])
    assert s.folded_upto() == 4
    assert [m["content"] for m in prompt_history(s, 4)] == ["m4", "m5"]
    s.set_meta(consolidated_upto=6, consolidated_ts=s.messages[5]["ts"])
    assert prompt_history(s, 4) == []
    reloaded = load_session("cli:x", s.journal.path)
    assert reloaded.folded_upto() == 6


def test_a_long_chat_holds_a_bounded_tail_of_what_memory_folded(tmp_path: Path) -> None:
    s = session_with(tmp_path, 1000)
    s.set_meta(consolidated_upto=900, consolidated_ts=s.messages[899]["ts"])
    s.forget_folded()
    assert (s.count, s.offset, len(s.messages)) == (1000, 800, KEEP_IN_MEMORY)
    assert s.folded_upto() == 900 and [m["content"] for m in prompt_history(s, 4)] == [f"m{i}" for i in range(996, 1000)]
    assert s.opening == "m0"  # a conversation keeps its title
    reloaded = load_session("cli:x", s.journal.path)  # read back in bounded memory too
    assert (reloaded.count, reloaded.offset, reloaded.folded_upto(), reloaded.opening) == (1000, 800, 900, "m0")
    s.set_meta(consolidated_upto=None)  # nothing folded (or a marker out of step): nothing is let go
    fresh = load_session("cli:x", s.journal.path)
    assert fresh.offset == 0 and fresh.count == 1000


def test_marker_from_before_new_is_ignored(tmp_path: Path) -> None:
    s = session_with(tmp_path, 6)
    s.set_meta(consolidated_upto=4, consolidated_ts="2000-01-01T00:00:00+0000")  # not this history's
    assert s.folded_upto() == 0
    s.set_meta(consolidated_upto=4, consolidated_ts=s.messages[3]["ts"])
    s.reset()  # /new
    for i in range(6):
        s.messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"n{i}", "ts": f"later {i}"})
    assert s.folded_upto() == 0 and len(prompt_history(s, 10)) == 6
    with s.journal.path.open("a") as f:  # a hand-edited marker of the wrong type is not taken
        f.write('{"_meta": {"consolidated_upto": "4"}}\n')
    assert load_session("cli:x", s.journal.path).folded_upto() == 0


@pytest.mark.parametrize("text", [
    None, "", "Sure! Here is the memory.", "{not json}", '["memory", "history"]',
    '{"memory": "x"}', '{"memory": "", "history": "h"}', '{"memory": 3, "history": "h"}',
    '{"memory": "m", "history": "   "}',
])
def test_parse_answer_rejects_malformed(text: str | None) -> None:
    with pytest.raises(ValueError):
        parse_answer(text)


def test_parse_answer_accepts_fences_think_and_chatter() -> None:
    body = json.dumps({"memory": "# M\n- a\n", "history": "Did\n  things."})
    for text in (body, f"```json\n{body}\n```", f"<think>hmm {{}}</think>Here you go:\n{body}\nBye."):
        result = parse_answer(text)
        assert result.memory == "# M\n- a\n" and result.history == "Did things."


def test_transcript_shortens_and_shows_tool_calls() -> None:
    text = transcript([
        {"role": "user", "content": "hi", "ts": "2026-11-22T10:15:00+0000"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "name": "read_file", "tool_call_id": "1", "content": "x" * 5000},
    ])
    lines = text.splitlines()
    assert lines[0] == "[2026-11-22 10:15] user: hi"
    assert lines[1] == 'assistant called read_file({"path": "a"})'
    assert lines[2].startswith("tool read_file returned: xxx") and "[... 4500 more characters]" in lines[2]


# ---------------------------------------------------------------------------------- end to end


def is_consolidation(body: dict[str, Any]) -> bool:
    return "long-term memory of nanobot" in body["messages"][0]["content"]


class Model:
    """Answers turns with 'answer N' and consolidation calls with ``memory_answer``."""

    def __init__(self, memory_answer: Any) -> None:
        self.memory_answer = memory_answer
        self.turns = 0
        self.consolidations: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Any:
        if is_consolidation(body):
            self.consolidations.append(body)
            return self.memory_answer(body) if callable(self.memory_answer) else self.memory_answer
        self.turns += 1
        return reply(f"answer {self.turns}")


def good_answer(memory: str = NEW_MEMORY, history: str = HISTORY) -> dict[str, Any]:
    return reply(json.dumps({"memory": memory, "history": history}), prompt_tokens=300, completion_tokens=60)


@pytest.fixture
def memory_file(workspace: Path) -> Path:
    path = workspace / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.write_text(OLD_MEMORY)
    return path


async def test_consolidation_end_to_end(llm: FakeOpenAI, workspace: Path, memory_file: Path, home: Path) -> None:
    model = Model(good_answer())
    llm.fallback = model
    config = config_for(llm.base_url, workspace, memory_window=4, timezone="Europe/Berlin")
    async with open_runtime(config) as rt:
        for text in ("one", "two"):
            await rt.agent.handle("cli:m", text)
        await rt.agent.memory.drain()
        assert model.consolidations == []  # 4 messages fit the window
        await rt.agent.handle("cli:m", "three")
        await rt.agent.memory.drain()

        assert memory_file.read_text() == NEW_MEMORY
        history = (workspace / "memory" / "HISTORY.md").read_text()
        assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d\] cli:m: " + re.escape(HISTORY) + "$", history, re.M)
        [call] = model.consolidations
        conversation = call["messages"][1]["content"]
        assert "- The user likes tea." in conversation  # the current memory goes along
        assert re.search(r"user: one\n.*assistant: answer 1\n.*user: two\n.*assistant: answer 2\n</conversation>",
                         conversation)
        assert "three" not in conversation
        assert call["temperature"] == 0

        await rt.agent.handle("cli:m", "four")
        prompt = llm.chat_requests[-1]["messages"]
        assert "Name: Ada; project: orbit-sim" in prompt[0]["content"]  # new memory in the system prompt
        assert [m["content"] for m in prompt[1:]] == ["three", "answer 3", "four"]  # only the recent window

        rows = await rt.db.fetch("SELECT purpose, count(*), sum(prompt_tokens) FROM model_calls GROUP BY purpose")
        usage = {row[0]: (row[1], row[2]) for row in rows}
        assert usage["memory"] == (1, 300) and usage["turn"][0] == 4

    session = load_session("cli:m", home / "sessions" / history_file("cli:m"))
    assert len(session.messages) == 8  # the JSONL keeps everything
    assert session.folded_upto() == 4

    # After a restart the window still starts after the consolidated part.
    async with open_runtime(config) as rt:
        await rt.agent.handle("cli:m", "five")
    prompt = [r for r in llm.chat_requests if not is_consolidation(r)][-1]["messages"]
    assert [m["content"] for m in prompt[1:]] == ["three", "answer 3", "four", "answer 4", "five"]
    assert len(model.consolidations) == 2  # then 6 unconsolidated > 4: the next part went before shutdown


@pytest.mark.parametrize("answer", [
    reply("I updated the memory for you."),
    reply('{"memory": "", "history": "wiped"}'),
    reply('{"memory": "# Long-term memory\\n- new", "history": '),
])
async def test_malformed_answer_leaves_memory_untouched(llm: FakeOpenAI, workspace: Path, memory_file: Path,
                                                       answer: dict, caplog: pytest.LogCaptureFixture) -> None:
    model = Model(answer)
    llm.fallback = model
    async with open_runtime(config_for(llm.base_url, workspace, memory_window=6)) as rt:
        with caplog.at_level(logging.WARNING, logger="nanobot.agent.memory"):
            for text in ("one", "two", "three", "four"):
                await rt.agent.handle("cli:m", text)
            await rt.agent.memory.drain()
        assert len(model.consolidations) == 1
        assert memory_file.read_text() == OLD_MEMORY
        assert not (workspace / "memory" / "HISTORY.md").exists()
        assert "MEMORY.md left as it was" in caplog.text
        session = rt.agent.session("cli:m")
        assert session.folded_upto() == 0

        # Not retried at once (only after half a window more); the prompt keeps the last 6 messages.
        await rt.agent.handle("cli:m", "five")
        await rt.agent.memory.drain()
        assert len(model.consolidations) == 1
        prompt = llm.chat_requests[-1]["messages"]
        assert [m["content"] for m in prompt[1:]] == ["two", "answer 2", "three", "answer 3", "four", "answer 4",
                                                      "five"]

        # A later good answer catches up.
        model.memory_answer = good_answer()
        await rt.agent.handle("cli:m", "six")
        await rt.agent.memory.drain()
        assert len(model.consolidations) == 2
        assert memory_file.read_text() == NEW_MEMORY
        assert session.folded_upto() == 6


async def test_a_failed_consolidation_waits_across_a_restart_and_new_ends_the_wait(
        llm: FakeOpenAI, workspace: Path, memory_file: Path) -> None:
    """The wait after a failed try is in the chat's meta: each restart, or each one-shot
    `nanobot agent -m`, paid for the same failing call again. /new ends it: the old count kept
    the new history from being folded for as long as the old one had been, and what fell out of
    the window was forgotten."""
    model = Model(reply("I updated the memory for you."))
    llm.fallback = model
    config = config_for(llm.base_url, workspace, memory_window=6)
    async with open_runtime(config) as rt:
        for text in ("one", "two", "three", "four"):
            await rt.agent.handle("cli:m", text)
        await rt.agent.memory.drain()
    assert len(model.consolidations) == 1
    async with open_runtime(config) as rt:
        await rt.agent.handle("cli:m", "five")
        await rt.agent.memory.drain()
        assert len(model.consolidations) == 1  # 10 messages: the retry waits for 11
        model.memory_answer = good_answer()
        await rt.agent.handle("cli:m", "/new")
        for text in ("a", "b", "c", "d"):
            await rt.agent.handle("cli:m", text)
        await rt.agent.memory.drain()
    assert len(model.consolidations) == 2 and memory_file.read_text() == NEW_MEMORY


async def test_reply_does_not_wait_for_consolidation_and_shutdown_does(llm: FakeOpenAI, workspace: Path,
                                                                      memory_file: Path) -> None:
    released = asyncio.Event()

    async def when_released() -> dict[str, Any]:
        await released.wait()
        return good_answer()

    model = Model(lambda body: when_released())  # the consolidation call is answered when the test says
    llm.fallback = model
    async with open_runtime(config_for(llm.base_url, workspace, memory_window=4)) as rt:
        for text in ("one", "two"):
            await rt.agent.handle("cli:m", text)
        async with asyncio.timeout(10):  # a reply that waited for the held consolidation would never come
            assert await rt.agent.handle("cli:m", "three") == "answer 3"
            while not model.consolidations:  # the window was full: the consolidation call is on its way
                await asyncio.sleep(0.01)
        assert memory_file.read_text() == OLD_MEMORY  # still being consolidated
        asyncio.get_running_loop().call_later(0.2, released.set)  # answered once the runtime is closing
    assert memory_file.read_text() == NEW_MEMORY  # leaving the runtime awaited it


async def test_edit_to_memory_during_consolidation_is_not_lost(llm: FakeOpenAI, workspace: Path,
                                                               memory_file: Path) -> None:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if len(model.consolidations) == 1:  # the agent edits MEMORY.md while the call runs
            memory_file.write_text(OLD_MEMORY + "- Edited meanwhile.\n")
            return good_answer()
        assert "Edited meanwhile." in body["messages"][1]["content"]
        return good_answer(NEW_MEMORY + "- Edited meanwhile.\n")

    model = Model(answer)
    llm.fallback = model
    async with open_runtime(config_for(llm.base_url, workspace, memory_window=4)) as rt:
        for text in ("one", "two", "three"):
            await rt.agent.handle("cli:m", text)
        await rt.agent.memory.drain()
    assert len(model.consolidations) == 2
    assert memory_file.read_text() == NEW_MEMORY + "- Edited meanwhile.\n"


async def test_tool_exchanges_are_consolidated_and_the_window_starts_at_a_user_turn(
        llm: FakeOpenAI, workspace: Path, memory_file: Path) -> None:
    (workspace / "a.txt").write_text("alpha")
    llm.script(tool_call("read_file", {"path": "a.txt"}), reply("It says alpha."))
    model = Model(good_answer())
    llm.fallback = model
    async with open_runtime(config_for(llm.base_url, workspace, memory_window=3)) as rt:
        session = await rt.sessions.open("cli:m")
        await rt.agent.handle("cli:m", "read a.txt")  # user, assistant (call), tool, assistant
        await rt.agent.memory.drain()
        assert model.consolidations == []  # no user message to cut at yet: not mid-exchange
        await rt.agent.handle("cli:m", "two")
        await rt.agent.memory.drain()
        conversation = model.consolidations[0]["messages"][1]["content"]
        assert 'called read_file({"path": "a.txt"})' in conversation and "tool read_file returned: alpha" in conversation
        assert "two" not in conversation and session.folded_upto() == 4
        await rt.agent.handle("cli:m", "three")
        await rt.agent.memory.drain()
        assert len(model.consolidations) == 2 and session.folded_upto() == 6
        await rt.agent.handle("cli:m", "four")
    prompt = [r for r in llm.chat_requests if not is_consolidation(r)][-1]["messages"]
    assert [m["content"] for m in prompt[1:]] == ["three", "answer 2", "four"]
