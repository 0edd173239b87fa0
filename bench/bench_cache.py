"""How much of what nanobot sends a provider's prompt cache can reuse (issue 47).

    python bench/bench_cache.py

A 20-turn chat in each mode against the scripted model, which reports ``cached_tokens`` as
OpenAI does (``tests/fakes/prompt_cache.py``: the longest prefix seen before, from 1,024 tokens,
in 128-token blocks). The chat has tool calls, a 20 KB result, a tool found on demand
(``find_tools`` + ``use_tool``; ``tool_help`` in code mode), a skill read, and the minute
changes before every turn. Then a second chat's first request. Printed per mode:
- not extending the previous: requests of the chat that do not start with the whole request
  before them (goal: none);
- cacheable: of the prompt tokens after the chat's first request, the share that repeats an
  earlier request exactly (goal: at least 95%);
- reported cached: what the server reported, as nanobot recorded it (usage ``cached_tokens``);
- second chat: of its system prompt, the share its first request has in common with the first
  chat's (goal: at least 80%).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from itertools import count
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.agent import context
from nanobot.runtime import open_runtime
from nanobot.workspace_template import copy_template
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.fakes.prompt_cache import PromptCache, rendered, shared_prefix
from tests.helpers import config_for


def code(program: str) -> dict:
    return reply(f"```python\n{program}\n```")


TOOLS_TURNS = [
    ("hello", [reply("Hello! What can I do?")]),
    ("what is in big.txt?", [tool_call("read_file", {"path": "big.txt"}), reply("A long list of lines.")]),
    ("how would I check the weather?", [tool_call("read_skill", {"name": "weather"}), reply("With wttr.in.")]),
    ("rename a.txt to b.txt", [tool_call("find_tools", {"query": "move file"}),
                               tool_call("use_tool", {"name": "move_file", "arguments": {"src": "a.txt", "dst": "b.txt"}}),
                               reply("Renamed.")]),
    ("what is in the folder?", [tool_call("list_dir", {"path": "."}), reply("big.txt, b.txt and more.")]),
    *[(f"note {n}", [tool_call("write_file", {"path": f"notes/{n}.txt", "content": f"note {n}\n"}),
                     reply(f"Saved note {n}.")]) for n in range(6)],
    ("read note 3", [tool_call("read_file", {"path": "notes/3.txt"}), reply("It says note 3.")]),
    ("rename note 4", [tool_call("use_tool", {"name": "move_file",
                                              "arguments": {"src": "notes/4.txt", "dst": "notes/four.txt"}}),
                       reply("Done.")]),
    *[(f"question {n}", [reply(f"Answer {n}.")]) for n in range(6)],
    ("thanks", [reply("You're welcome.")]),
]

CODE_TURNS = [
    ("hello", [reply("Hello! What can I do?")]),
    ("what is in big.txt?", [code("print(read_file('big.txt'))"), reply("A long list of lines.")]),
    ("how would I check the weather?", [code("print(read_skill('weather'))"), reply("With wttr.in.")]),
    ("rename a.txt to b.txt", [code("print(tool_help('move_file'))"), code("move_file('a.txt', 'b.txt')\nprint('ok')"),
                               reply("Renamed.")]),
    ("what is in the folder?", [code("print(list_dir('.'))"), reply("big.txt, b.txt and more.")]),
    *[(f"note {n}", [code(f"write_file('notes/{n}.txt', 'note {n}')\nfinal_answer('Saved note {n}.')")])
      for n in range(6)],
    ("read note 3", [code("print(read_file('notes/3.txt'))"), reply("It says note 3.")]),
    ("rename note 4", [code("move_file('notes/4.txt', 'notes/four.txt')\nfinal_answer('Done.')")]),
    *[(f"question {n}", [reply(f"Answer {n}.")]) for n in range(6)],
    ("thanks", [reply("You're welcome.")]),
]


async def measure(mode: str) -> dict[str, float]:
    turns = TOOLS_TURNS if mode == "tools" else CODE_TURNS
    assert len(turns) == 20
    minutes = count()
    context.now_line = lambda tz: f"Friday 2026-11-27 20:{next(minutes) % 60:02d} ({tz})"  # a new minute each turn
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp
        workspace = Path(tmp) / "workspace"
        copy_template(workspace)
        (workspace / "big.txt").write_text("".join(f"line {n:05d}: some words of a long file\n" for n in range(500)))
        (workspace / "a.txt").write_text("a\n")
        cache = PromptCache()
        async with FakeOpenAI(cache=cache) as llm:
            config = config_for(llm.base_url, workspace, mode=mode, memory_window=1000)  # no memory fold
            async with open_runtime(config) as rt:
                for text, items in turns:
                    llm.script(*items)
                    await rt.agent.handle("cli:bench", text)
                first_chat = len(llm.raw_requests)
                llm.script(reply("Hi."))
                await rt.agent.handle("cli:second", "hello")
                totals = await rt.usage.totals("cli:bench")
        later = range(1, first_chat)
        texts = [rendered(r) for r in llm.raw_requests[:first_chat]]
        breaks = sum(shared_prefix(texts[i - 1], texts[i]) < len(texts[i - 1]) - 1 for i in later)  # "]" closes
        system_1 = llm.raw_requests[0]["messages"][0]["content"]
        system_2 = llm.raw_requests[first_chat]["messages"][0]["content"]
        return {
            "requests": first_chat,
            "breaks": breaks,
            "prompt": sum(cache.prompt_tokens[:first_chat]),
            "cacheable": sum(cache.prefix_tokens[i] for i in later) / sum(cache.prompt_tokens[i] for i in later),
            "reported": totals[mode].cached_tokens / totals[mode].prompt_tokens,
            "second": shared_prefix(system_1, system_2) / len(system_2),
        }


async def main() -> None:
    print("mode   requests  not extending the previous  prompt tokens  cacheable after the 1st  "
          "reported cached (all)  2nd chat's system prompt shared")
    for mode in ("code", "tools"):
        m = await measure(mode)
        print(f"{mode:6s} {m['requests']:8d}  {m['breaks']:26d}  {m['prompt']:13,d}  {m['cacheable']:23.1%}  "
              f"{m['reported']:21.1%}  {m['second']:.1%}")


if __name__ == "__main__":
    asyncio.run(main())
