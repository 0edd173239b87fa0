"""The prompts as the model gets them: an exact snapshot per mode (``tests/prompts/*.txt``,
written for a reviewer to read: run with ``UPDATE_PROMPTS=1`` to rewrite them after a
deliberate change), no leftovers where parts were left out, and the tools-mode offer of
tools (the core schemas, ``find_tools`` for the rest, the text form only when asked for)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from nanobot.runtime import open_runtime
from nanobot.workspace_template import copy_template
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

SNAPSHOTS = Path(__file__).parent / "prompts"


async def first_request(llm: FakeOpenAI, workspace: Path, mode: str, **provider) -> dict:
    copy_template(workspace)
    config = config_for(llm.base_url, workspace, mode=mode)
    for key, value in provider.items():
        setattr(config.providers["openai"], key, value)
    llm.script(reply("hello"))
    async with open_runtime(config, terminal=True) as rt:  # nanobot agent
        await rt.agent.handle("cli:p", "hi")
    return llm.chat_requests[-1]


def readable(request: dict, workspace: Path) -> str:
    """The system prompt and the tool schemas, with the temporary path fixed (the clock is not in it)."""
    system = request["messages"][0]["content"].replace(str(workspace), "/home/me/.nanobot/workspace")
    tools = "".join(f"\n--- tool {t['function']['name']}\n{json.dumps(t, indent=1)}" for t in request.get("tools", []))
    return system + tools + "\n"


@pytest.mark.parametrize("mode", ["code", "tools", "hybrid"])
async def test_each_modes_prompt_is_exactly_the_snapshot(llm: FakeOpenAI, workspace: Path, mode: str) -> None:
    text = readable(await first_request(llm, workspace, mode), workspace)
    snapshot = SNAPSHOTS / f"{mode}.txt"
    if os.environ.get("UPDATE_PROMPTS"):
        snapshot.write_text(text)
    assert text == snapshot.read_text(), f"the {mode}-mode prompt changed: read it, then UPDATE_PROMPTS=1"
    prose = re.sub(r"^```.*?^```", "[code]", text.split("\n--- tool ")[0], flags=re.DOTALL | re.MULTILINE).strip()
    assert "  " not in prose and "\n\n\n" not in prose and "$" not in prose
    assert not re.search(r" [.,;:]", prose)  # a part left out leaves a space before punctuation


async def test_tools_mode_offers_core_tools_and_finds_the_rest(llm: FakeOpenAI, workspace: Path) -> None:
    """A tool found on demand comes in find_tools' result, and use_tool runs it: the tools list
    stays the same, so the next request starts with the bytes of the one before."""
    copy_template(workspace)
    (workspace / "old.txt").write_text("x")
    llm.script(tool_call("find_tools", {"query": "move a file"}),
               tool_call("use_tool", {"name": "move_file", "arguments": {"src": "old.txt", "dst": "new.txt"}}),
               reply("Moved."))
    async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
        assert await rt.agent.handle("cli:f", "rename old.txt to new.txt") == "Moved."
    offered = [[t["function"]["name"] for t in r["tools"]] for r in llm.chat_requests]
    assert "move_file" not in offered[0] and "find_tools" in offered[0] and "read_file" in offered[0]
    assert "move_file" in [t["function"]["description"] for t in llm.chat_requests[0]["tools"]
                           if t["function"]["name"] == "find_tools"][0]
    assert all(r["tools"] == llm.chat_requests[0]["tools"] for r in llm.chat_requests)
    found = llm.chat_requests[1]["messages"][-1]["content"]
    assert "- move_file: Move or rename a file or folder" in found and '"src": {"type": "string"' in found
    assert (workspace / "new.txt").exists()


async def test_the_tool_call_text_form_is_taught_only_when_the_provider_asks(llm: FakeOpenAI, workspace: Path) -> None:
    plain = (await first_request(llm, workspace, "tools"))["messages"][0]["content"]
    taught = (await first_request(llm, workspace, "tools", text_tool_calls=True))["messages"][0]["content"]
    assert "<tool_call>" not in plain and '<tool_call>{"name": "read_file"' in taught
