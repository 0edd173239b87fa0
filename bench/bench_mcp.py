"""MCP servers as functions: what a call costs from a program, what the tools cost in the
prompt, what a 30-call task costs in model calls and tokens, and what servers add to start-up.

    python bench/bench_mcp.py

Against the test suite's notes server (tests/fakes/mcp_notes.py, the real SDK) over stdio and
streamable HTTP on 127.0.0.1, and the scripted OpenAI server; tokens by cl100k (offline).
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, token_counter

from nanobot.config import Config, McpServer
from nanobot.runtime import open_runtime
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call

PROGRAMS, CALLS_PER_PROGRAM, RAW_CALLS = 40, 25, 500


def stdio(*extra: str) -> McpServer:
    return McpServer(command=sys.executable, args=["-m", "tests.fakes.mcp_notes", *extra], cwd=str(ROOT))


def config_for(base_url: str, workspace: Path, servers: dict[str, McpServer], mode: str = "code") -> Config:
    config = Config()
    config.agents.defaults.workspace = str(workspace)
    config.agents.defaults.execution_mode = mode
    config.agents.defaults.max_iterations = 40
    config.providers["openai"].api_base, config.providers["openai"].api_key = base_url, "k"
    config.tools.mcp_servers = servers
    return config


def q(samples: list[float], pct: int) -> float:
    return statistics.quantiles(samples, n=100)[pct - 1]


async def call_overhead(label: str, server: McpServer, workspace: Path, llm: FakeOpenAI) -> None:
    """Raw SDK calls (the server's own time plus transport) vs the same call from a program."""
    async with open_runtime(config_for(llm.base_url, workspace, {"notes": server})) as rt:
        await rt.mcp.ensure_started()
        connection = rt.mcp.connections["notes"]
        await connection.call("add_note", {"title": "x"})
        raw = []
        for _ in range(RAW_CALLS):
            start = time.perf_counter()
            await connection.call("get_note", {"note_id": 1})
            raw.append((time.perf_counter() - start) * 1000)
        await rt.sessions.open("cli:bench")  # a chat context reads its chat's session
        ctx = rt.chat_context("cli:bench")
        program = f"for i in range({CALLS_PER_PROGRAM}):\n    notes_get_note(1)\n"
        empty = f"for i in range({CALLS_PER_PROGRAM}):\n    pass\n"
        limits = rt.config.agents.defaults.code_runtime.model_copy(update={"persist_state": False})
        per_call = []
        for _ in range(PROGRAMS):
            timings = []
            for code in (empty, program):
                start = time.perf_counter()
                result = await rt.code.run(code, ctx, limits=limits, timezone="UTC", mode="bench")
                assert result.ok, result.error
                timings.append((time.perf_counter() - start) * 1000)
            per_call.append((timings[1] - timings[0]) / CALLS_PER_PROGRAM)
    raw50, raw95, prog50, prog95 = statistics.median(raw), q(raw, 95), statistics.median(per_call), q(per_call, 95)
    print(f"{label:6} raw SDK call p50 {raw50:5.2f} ms p95 {raw95:5.2f} ms | from a program p50 {prog50:5.2f} ms "
          f"p95 {prog95:5.2f} ms | overhead p50 {prog50 - raw50:5.2f} ms p95 {prog95 - raw95:5.2f} ms")


async def prompt_tokens(workspace: Path, llm: FakeOpenAI) -> None:
    from nanobot.agent.tool_offer import on_demand
    from nanobot.sandbox.executor import code_stubs

    count = token_counter().text
    servers = {name: stdio("--many", "20") for name in ("tracker", "mail", "calendar")}  # 3 x 30 tools
    async with open_runtime(config_for(llm.base_url, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        await rt.sessions.open("cli:bench")  # a chat context reads its chat's session
        ctx = rt.chat_context("cli:bench")
        builtin = count(code_stubs(rt.tools, header=False, ctx=ctx).split("\ndef tracker_")[0])
        full = count(code_stubs(rt.tools, header=False, ctx=ctx)) - builtin
        one_line = on_demand(rt.tools.tools(ctx=ctx), rt.config, rt.config.agents.defaults.context_tokens)
        listed = count(code_stubs(rt.tools, header=False, ctx=ctx, listed=one_line)) - builtin  # as a prompt has it
    print(f"prompt, 3 servers x 30 tools: full stubs {full:,} tokens, budgeted listing {listed:,} tokens "
          f"({listed / 90 * 100:,.0f} per 100 tools); built-in functions {builtin:,}")


async def task_30(workspace: Path, llm: FakeOpenAI) -> None:
    count = token_counter()
    program = ("```python\nfor i in range(30):\n    notes_add_note(title=f'note {i}')\n"
               "final_answer(f'{len(notes_list_notes())} notes')\n```")
    for mode, script in (("code", [reply(program)]),
                         ("tools", [*(tool_call("notes_add_note", {"title": f"note {i}"}) for i in range(30)),
                                    reply("30 notes")])):
        llm.requests.clear()
        llm.script(*script)
        async with open_runtime(config_for(llm.base_url, workspace / mode, {"notes": stdio()}, mode)) as rt:
            answer = await rt.agent.handle(f"cli:{mode}", "add 30 notes")
        tokens = sum(count(r) for r in llm.chat_requests)
        print(f"30-call task, {mode:5}: {len(llm.chat_requests):2} model calls, {tokens:7,} prompt tokens ({answer!r})")


async def startup(workspace: Path, llm: FakeOpenAI) -> None:
    from nanobot.gateway import Gateway

    for label, servers in (("no MCP servers", {}), ("3 stdio servers", {f"s{i}": stdio() for i in range(3)})):
        samples = []
        for _ in range(5):
            config = config_for(llm.base_url, workspace, servers)
            config.gateway.heartbeat.enabled = False
            start = time.perf_counter()
            async with open_runtime(config) as rt:
                gateway = Gateway(rt)
                await gateway.start()  # READY follows this
                samples.append((time.perf_counter() - start) * 1000)
                await gateway.stop()
        print(f"gateway start to READY, {label:15}: p50 {statistics.median(samples):6.0f} ms")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    os.environ["NANOBOT_HOME"] = tempfile.mkdtemp(prefix="nanobot-bench-")
    workspace = Path(tempfile.mkdtemp(prefix="nanobot-bench-ws-"))
    port = free_port()
    http = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.fakes.mcp_notes", "--http", str(port),
                                                cwd=ROOT, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.sleep(2)
        async with FakeOpenAI() as llm:
            await call_overhead("stdio", stdio(), workspace, llm)
            await call_overhead("http", McpServer(url=f"http://127.0.0.1:{port}/mcp"), workspace, llm)
            await prompt_tokens(workspace, llm)
            await task_30(workspace, llm)
            await startup(workspace, llm)
    finally:
        http.terminate()
        await http.wait()


if __name__ == "__main__":
    asyncio.run(main())
