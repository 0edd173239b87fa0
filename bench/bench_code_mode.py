"""Issue 3 figures: the N-file task in tools mode and in code mode, scripted model.

Model calls and total prompt tokens sent (cl100k tokenizer, bundled offline), and the size
of the code-mode system prompt with its stubs.

    python bench/bench_code_mode.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from common import token_counter

from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

PROGRAM = """```python
counts = {}
for name in list_dir("src"):
    if name.endswith(".py"):
        counts[name] = len(read_file("src/" + name).splitlines())
final_answer(f"{sum(counts.values())} lines in {len(counts)} files")
```"""


def make_workspace(n: int) -> Path:
    ws = Path(tempfile.mkdtemp(prefix="nanobot-bench-ws-"))
    (ws / "src").mkdir()
    for i in range(n):
        # ~40 lines of ordinary code per file, so reading a file costs what it would for real
        body = "\n".join(f"def function_{j}(value):\n    return value * {j} + {i}\n" for j in range(13))
        (ws / "src" / f"module_{i}.py").write_text(body)
    return ws


async def run_task(mode: str, n: int) -> tuple[int, int, int]:
    from nanobot.runtime import open_runtime

    count = token_counter()
    async with FakeOpenAI() as llm:
        if mode == "code":
            llm.script(reply(PROGRAM))
        else:
            llm.script(tool_call("list_dir", {"path": "src"}),
                       *[tool_call("read_file", {"path": f"src/module_{i}.py"}) for i in range(n)],
                       reply(f"{n * 39} lines in {n} files"))
        os.environ["NANOBOT_HOME"] = tempfile.mkdtemp(prefix="nanobot-bench-home-")
        config = config_for(llm.base_url, make_workspace(n), mode=mode, max_iterations=n + 5)
        async with open_runtime(config) as rt:
            await rt.agent.handle("cli:bench", "How many lines do the .py files under src/ have?")
        system_tokens = count.text(llm.chat_requests[0]["messages"][0]["content"])
        return len(llm.chat_requests), sum(count(r) for r in llm.chat_requests), system_tokens


async def main() -> None:
    print("| N | mode | model calls | prompt tokens sent | system prompt tokens |")
    print("| --- | --- | --- | --- | --- |")
    for n in (5, 20, 100):
        for mode in ("tools", "code"):
            calls, tokens, system = await run_task(mode, n)
            print(f"| {n} | {mode} | {calls} | {tokens:,} | {system:,} |")


if __name__ == "__main__":
    asyncio.run(main())
