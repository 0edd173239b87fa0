"""The tools-mode loop through the real openai SDK against the scripted server on loopback."""

from __future__ import annotations

import json
from pathlib import Path


from nanobot.runtime import open_runtime
from tests.fakes.openai_server import FakeOpenAI, error, reply, tool_call, tool_calls
from tests.helpers import config_for


async def run(llm: FakeOpenAI, workspace: Path, text: str, session: str = "cli:t", **kw) -> str:
    async with open_runtime(config_for(llm.base_url, workspace, **kw)) as rt:
        return await rt.agent.handle(session, text)


async def test_native_tool_calls_then_answer(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "a.txt").write_text("alpha")
    llm.script(tool_call("read_file", {"path": "a.txt"}),
               tool_calls(("write_file", {"path": "b.txt", "content": "beta"}), ("list_dir", {})),
               reply("<think>private</think>Done: copied."))
    answer = await run(llm, workspace, "copy please")
    assert answer == "Done: copied."
    assert (workspace / "b.txt").read_text() == "beta"
    second = llm.chat_requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": second[-2]["tool_calls"][0]["id"], "name": "read_file",
                          "content": "alpha"}
    assert json.loads(llm.chat_requests[2]["messages"][-1]["content"]) == ["a.txt", "b.txt"]
    assert {t["function"]["name"] for t in llm.chat_requests[0]["tools"]} >= {"read_file", "write_file", "exec_command"}
    system = llm.chat_requests[0]["messages"][0]["content"]
    assert "UTC" not in system and str(workspace) in system  # the time ends the user's message instead
    assert llm.raw_requests[0]["messages"][-1]["content"].startswith("copy please\n\n(sent ")
    assert llm.raw_requests[0]["messages"][-1]["content"].endswith(" (UTC))")


async def test_malformed_arguments_go_back_to_the_model(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(tool_call("write_file", '{"path": "x.txt", "content": '), reply("sorry"))
    assert await run(llm, workspace, "write") == "sorry"
    tool_message = llm.chat_requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "not valid JSON" in tool_message["content"]
    assert not (workspace / "x.txt").exists()


async def test_tool_errors_reach_the_model(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(tool_call("read_file", {"path": "../outside.txt"}), tool_call("read_file", {"path": "missing.txt"}),
               tool_call("nope", {}), reply("ok"))
    await run(llm, workspace, "read")
    results = [r["messages"][-1]["content"] for r in llm.chat_requests[1:]]
    assert results[0].startswith("Error: PermissionError")
    assert results[1].startswith("Error: FileNotFoundError")
    assert "unknown tool 'nope'" in results[2]


async def test_text_tool_call_fallback(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "n.txt").write_text("note")
    llm.script(reply('Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "n.txt"}}</tool_call>'),
               reply('<tool_call>{"name": "read_file", "arguments": </tool_call>'),
               reply("It says note."))
    assert await run(llm, workspace, "what is in n.txt?") == "It says note."
    first_result = llm.chat_requests[1]["messages"][-1]
    assert first_result["role"] == "user" and '<tool_result name="read_file">\nnote\n</tool_result>' in first_result["content"]
    assert "not valid JSON" in llm.chat_requests[2]["messages"][-1]["content"]


async def test_max_iterations_ends_the_turn(llm: FakeOpenAI, workspace: Path) -> None:
    llm.fallback = lambda body: tool_call("read_file", {"path": f"{len(body['messages'])}.txt"})  # never the same
    answer = await run(llm, workspace, "loop forever", max_iterations=3)
    assert "stopped after 3 steps" in answer and len(llm.chat_requests) == 3


async def test_429_is_retried_then_succeeds(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(error(429, retry_after=0.01), reply("after retry"))
    assert await run(llm, workspace, "hi") == "after retry"
    assert len(llm.chat_requests) == 2


async def test_provider_failure_is_a_short_reply(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(error(401, message="bad key"))
    answer = await run(llm, workspace, "hi")
    assert answer.startswith("Sorry, I could not get an answer from the model") and "401" in answer


async def test_history_and_usage_are_kept(llm: FakeOpenAI, workspace: Path, home: Path) -> None:
    llm.script(reply("first"), reply("second"))
    await run(llm, workspace, "one", session="telegram:9")
    await run(llm, workspace, "two", session="telegram:9")
    contents = [m["content"] for m in llm.chat_requests[1]["messages"][1:]]
    assert contents == ["one", "first", "two"]
    async with open_runtime(config_for(llm.base_url, workspace)) as rt:
        totals = await rt.usage.totals()
    assert totals["tools"].model_calls == 2 and totals["tools"].prompt_tokens == 20


async def test_a_long_message_is_a_file_the_tools_can_use(llm: FakeOpenAI, workspace: Path) -> None:
    pasted = "x" * 9000 + " what is the last word? banana"
    llm.script(lambda body: tool_call("exec_command", {"command": f"tail -c 6 {_saved_path(body)}"}),
               reply("banana"))
    assert await run(llm, workspace, pasted) == "banana"
    first = llm.chat_requests[0]["messages"][-1]["content"]
    assert "the whole text is in the file messages/" in first and len(first) < 1300
    assert llm.chat_requests[1]["messages"][-1]["content"] == "banana\n[exit code 0]"


async def test_long_messages_are_kept_within_the_workspace_quota(llm: FakeOpenAI, workspace: Path) -> None:
    """Each long message was written to messages/ past tools.maxWorkspaceMb: a member's pastes
    (an API key's 1 MB bodies, 60 a minute) filled the disk. When the workspace is full, the
    message is answered from its beginning and end, and nothing is written."""
    (workspace / "filler.bin").write_bytes(b"x" * 1_000_000)
    llm.script(reply("I see the start and the end."), reply("Same in code."))
    pasted = "y" * 50_000 + " the end"
    for mode, answer in (("tools", "I see the start and the end."), ("code", "Same in code.")):
        config = config_for(llm.base_url, workspace, mode=mode)
        config.tools.max_workspace_mb = 1
        async with open_runtime(config) as rt:
            assert await rt.agent.handle(f"cli:{mode}", pasted) == answer
    first = llm.chat_requests[0]["messages"][-1]["content"]
    assert "50,008 characters long; it could not be kept whole as a file" in first and first.endswith("the end")
    assert "it is in the variable `context`. Its beginning" in llm.chat_requests[1]["messages"][-1]["content"]
    assert not (workspace / "messages").exists()


def _saved_path(body: dict) -> str:
    text = body["messages"][-1]["content"]
    return text.split("the whole text is in the file ", 1)[1].split(".txt", 1)[0] + ".txt"
