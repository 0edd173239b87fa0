"""What each mode sends the model: the system prompt and tool schemas of a one-call answer,
and the prompt characters of a scripted six-call task.

    python bench/bench_prompts.py

The workspace is the onboarded template (AGENTS.md, SOUL.md, ... and the built-in skills);
the model is the scripted server. "Schemas" is the JSON of the ``tools`` field as sent (compact). With
``--mcp 3`` three MCP servers of 30 tools each are configured (``tests/fakes/mcp_notes.py --many 20``).
``--reading``: a turn whose first call reads a skill and prints 20 KB, then three more calls, with
long results sent whole or cut when first shown (``agent.prompt_size.cut_when_shown``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.config import McpServer
from nanobot.runtime import open_runtime
from nanobot.workspace_template import copy_template
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

SIX_CALLS = {  # the same task: read three files, write a summary, list the folder, answer
    "tools": [tool_call("read_file", {"path": "a.txt"}), tool_call("read_file", {"path": "b.txt"}),
              tool_call("read_file", {"path": "c.txt"}), tool_call("write_file", {"path": "sum.txt", "content": "3"}),
              tool_call("list_dir", {"path": "."}), reply("done")],
    "code": [reply("```python\nparts = [read_file(n) for n in ('a.txt', 'b.txt', 'c.txt')]\nprint(len(parts))\n```"),
             reply("```python\nwrite_file('sum.txt', '3')\nprint(list_dir('.'))\n```"), reply("done")],
}
SIX_CALLS["hybrid"] = SIX_CALLS["tools"]


def compact(value: object) -> str:
    """JSON as the provider sends it (no spaces after separators)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def mcp_servers(count: int) -> dict:
    return {name: McpServer(command=sys.executable, args=["-m", "tests.fakes.mcp_notes", "--many", "20"],
                            cwd=str(common.ROOT)) for name in ("tracker", "mail", "calendar")[:count]}


async def measure(mode: str, mcp: int) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp  # fresh histories and database for every measure
        workspace = Path(tmp) / "workspace"
        copy_template(workspace)
        for name in ("a.txt", "b.txt", "c.txt"):
            (workspace / name).write_text("some text\n" * 20)
        async with FakeOpenAI() as llm:
            config = config_for(llm.base_url, workspace, mode=mode, memory_window=1000)  # no consolidation call
            config.tools.mcp_servers = mcp_servers(mcp)
            llm.script(reply("hello"), *SIX_CALLS[mode])
            async with open_runtime(config) as rt:
                await rt.agent.handle("cli:a", "hi")
                await rt.agent.handle("cli:b", "summarize a, b and c into sum.txt")
        first = llm.chat_requests[0]
        system = len(first["messages"][0]["content"])
        schemas = len(compact(first.get("tools", []))) if first.get("tools") else 0
        task = sum(len(compact(r["messages"])) + len(compact(r.get("tools", []))) for r in llm.chat_requests[1:])
        return system, schemas, task


READING = {  # a turn whose first call reads a skill and prints 20 KB, then three more calls
    "code": [reply("```python\nprint(read_skill('cron'))\nprint('z' * 20000)\n```"),
             reply("```python\nprint(1)\n```"), reply("```python\nprint(2)\n```"), reply("done")],
    "tools": [tool_call("read_skill", {"name": "cron"}), tool_call("exec_command", {"command": "seq 1 4000"}),
              tool_call("list_dir", {"path": "."}), tool_call("list_dir", {"path": "."}), reply("done")],
}


async def measure_reading(mode: str, shorten: bool) -> int:
    """Prompt characters over the reading turn's requests (old results shortened or not)."""
    from nanobot.agent import prompt_size as budget

    budget.RESULT_CHARS = 16_000 if shorten else 10**9
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp
        workspace = Path(tmp) / "workspace"
        copy_template(workspace)
        async with FakeOpenAI() as llm:
            config = config_for(llm.base_url, workspace, mode=mode, memory_window=1000)
            config.tools.exec.sandbox = "off"  # the bench measures prompts, not the confinement
            llm.script(*READING[mode])
            async with open_runtime(config) as rt:
                await rt.agent.handle("cli:r", "read the cron skill and look at a lot of output")
        return sum(len(compact(r["messages"])) + len(compact(r.get("tools", []))) for r in llm.chat_requests)


async def reading() -> None:
    print("reading turn (a skill and 20 KB in the first call, then more calls): prompt chars, all requests")
    for mode in ("code", "tools"):
        whole, shortened = await measure_reading(mode, False), await measure_reading(mode, True)
        print(f"{mode:7s} old results whole {whole:,d}  shortened {shortened:,d}  ({shortened / whole:.0%})")


async def main(mcp: int) -> None:
    print(f"MCP servers: {mcp} (30 tools each)" if mcp else "MCP servers: none")
    print("mode    system  schemas  one-call total  six-call task (prompt chars, all requests)")
    for mode in ("code", "tools", "hybrid"):
        system, schemas, task = await measure(mode, mcp)
        print(f"{mode:7s} {system:6,d}  {schemas:7,d}  {system + schemas:14,d}  {task:,d}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mcp", type=int, default=0)
    parser.add_argument("--reading", action="store_true", help="the reading turn instead")
    args = parser.parse_args()
    asyncio.run(reading() if args.reading else main(args.mcp))
