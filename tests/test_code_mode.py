"""Code and hybrid mode end to end: scripted model (real openai SDK), real Monty, real tools."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nanobot.config import AgentOverride
from nanobot.runtime import open_runtime
from nanobot.trust import OWNER
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

COUNT_PROGRAM = """```python
total = 0
for name in list_dir("src"):
    if name.endswith(".py"):
        total += len(read_file("src/" + name).splitlines())
final_answer(f"{total} lines")
```"""


def make_files(workspace: Path, n: int) -> None:
    (workspace / "src").mkdir()
    for i in range(n):
        (workspace / "src" / f"m{i}.py").write_text("a = 1\nb = 2\n")


async def ask(llm: FakeOpenAI, workspace: Path, *messages: str, session: str = "cli:c", mode: str = "code",
              progress=None, **settings) -> list[str]:
    async with open_runtime(config_for(llm.base_url, workspace, mode=mode, **settings)) as rt:
        return [await rt.agent.handle(session, m, progress=progress) for m in messages]


@pytest.mark.parametrize("n", [5, 20])
async def test_n_file_task_costs_one_call_in_code_mode(llm: FakeOpenAI, workspace: Path, n: int) -> None:
    make_files(workspace, n)
    llm.script(reply(COUNT_PROGRAM))
    assert await ask(llm, workspace, "count lines") == [f"{2 * n} lines"]
    assert len(llm.chat_requests) == 1
    assert "tools" not in llm.chat_requests[0]  # code mode sends no native tool definitions
    system = llm.chat_requests[0]["messages"][0]["content"]
    assert "def read_file(path: str) -> str" in system and "final_answer" in system


async def test_same_task_in_tools_mode_costs_a_call_per_file(llm: FakeOpenAI, workspace: Path) -> None:
    n = 5
    make_files(workspace, n)
    llm.script(tool_call("list_dir", {"path": "src"}),
               *[tool_call("read_file", {"path": f"src/m{i}.py"}) for i in range(n)], reply("10 lines"))
    assert await ask(llm, workspace, "count lines", mode="tools") == ["10 lines"]
    assert len(llm.chat_requests) == n + 2


async def test_result_goes_back_and_the_model_answers(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello")
    llm.script(reply("Let me check.\n<run_python>\ntext = read_file('a.txt')\nprint(text.upper())\nlen(text)\n</run_python>"),
               reply("It says HELLO."))
    assert await ask(llm, workspace, "read a.txt") == ["It says HELLO."]
    result = llm.chat_requests[1]["messages"][-1]
    assert result == {"role": "user", "content": "<python_result>\nHELLO\nOut: 5\n</python_result>"}


async def test_functions_called_as_tools_run_as_the_program_the_model_meant(llm: FakeOpenAI, workspace: Path) -> None:
    """Local models trained on tool use may call functions as tools in code mode, in <tool_call>
    text or natively: each call runs as the program it meant and what it printed goes back; the
    user never sees the call."""
    (workspace / "a.txt").write_text("hello")
    llm.script(reply('<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>'),
               tool_call("list_dir", {"path": "."}),
               reply('<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'),
               reply("It says hello."))
    assert await ask(llm, workspace, "read a.txt") == ["It says hello."]
    assert llm.chat_requests[1]["messages"][-2:] == [
        {"role": "assistant", "content": "```python\nprint(read_file(path='a.txt'))\n```"},
        {"role": "user", "content": "<python_result>\nhello\n</python_result>"}]
    assert "a.txt" in llm.chat_requests[2]["messages"][-1]["content"]
    assert llm.chat_requests[3]["messages"][-1]["content"].startswith(
        "<python_result>\nNot run: the <tool_call> block is not valid JSON (")
    assert llm.chat_requests[3]["messages"][-1]["content"].endswith("; nothing was run. Write a Python program instead.\n</python_result>")


@pytest.mark.parametrize("fence", ["python", "Python", "py", "python3"])
async def test_a_fence_is_run_however_the_model_names_python(llm: FakeOpenAI, workspace: Path, fence: str) -> None:
    """Local models write ```Python or ```python3 as often as ```python: each runs."""
    llm.script(reply(f"```{fence}\nfinal_answer(str(6 * 7))\n```"))
    assert await ask(llm, workspace, "six sevens?") == ["42"]


async def test_errors_are_fed_back_and_the_fix_succeeds(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nx = (1,\n```"),
               reply("```python\nprint(undefined_name)\n```"),
               reply("```python\nread_file('missing.txt')\n```"),
               reply("```python\ntry:\n    read_file('missing.txt')\nexcept FileNotFoundError as e:\n    final_answer('no file: ' + str(e)[:20])\n```"))
    [answer] = await ask(llm, workspace, "go")
    assert answer.startswith("no file:")
    results = [r["messages"][-1]["content"] for r in llm.chat_requests[1:]]
    assert "SyntaxError" in results[0]
    assert "NameError" in results[1] and "undefined_name" in results[1]
    assert "FileNotFoundError" in results[2] and "line 1" in results[2]


async def test_state_persists_across_turns_and_a_restart(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nnotes = ['a']\ndef add(x):\n    notes.append(x)\n    return len(notes)\nfinal_answer('ok')\n```"),
               reply("```python\nfinal_answer(add('b'))\n```"))
    assert await ask(llm, workspace, "one", "two") == ["ok", "2"]
    llm.script(reply("```python\nfinal_answer(str(add('c')) + ' ' + ','.join(notes))\n```"))
    assert await ask(llm, workspace, "three") == ["3 a,b,c"]  # a new Runtime: state came from nanobot.db


async def test_new_clears_the_python_state(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nsecret = 42\nfinal_answer('set')\n```"),
               reply("```python\nfinal_answer(str(secret))\n```"))
    answers = await ask(llm, workspace, "set", "/new", "get")
    assert answers[:2] == ["set", "Started a new conversation."]
    assert answers[2] != "42" and "NameError" in llm.chat_requests[-1]["messages"][-1]["content"]


async def test_infinite_loop_and_memory_bomb_are_stopped(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nwhile True:\n    pass\n```"), reply("```python\nx = [0] * 10**9\n```"), reply("gave up"))
    started = time.monotonic()
    settings = {"code_runtime": config_for("", workspace).agents.defaults.code_runtime.model_copy(
        update={"max_execution_ms": 300, "max_memory_mb": 50})}
    assert await ask(llm, workspace, "loop", **settings) == ["gave up"]
    assert time.monotonic() - started < 10
    results = [r["messages"][-1]["content"] for r in llm.chat_requests[1:]]
    assert "TimeoutError" in results[0]
    assert "MemoryError" in results[1]


async def test_await_on_a_function_is_explained(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    llm.script(reply("```python\ntext = await read_file('a.txt')\n```"), reply("ok"))
    await ask(llm, workspace, "go")
    assert "without `await`" in llm.chat_requests[1]["messages"][-1]["content"]


async def test_say_notes_are_sent_at_once(llm: FakeOpenAI, workspace: Path) -> None:
    notes = []

    async def progress(text: str) -> None:
        notes.append(text)

    llm.script(reply("<say>Counting now.</say>\n```python\nfinal_answer('done')\n```"))
    assert await ask(llm, workspace, "go", progress=progress) == ["done"]
    assert notes == ["Counting now."]


async def test_llm_query_is_a_budgeted_sub_call(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nparts = [llm_query('summarize: ' + c) for c in ['aa', 'bb']]\n"
                     "try:\n    llm_query('one too many')\nexcept RuntimeError as e:\n    parts.append('budget')\n"
                     "final_answer(' | '.join(parts))\n```"),
               reply("sum-a"), reply("sum-b"))
    code_runtime = config_for("", workspace).agents.defaults.code_runtime.model_copy(update={"max_llm_queries": 2})
    assert await ask(llm, workspace, "go", code_runtime=code_runtime) == ["sum-a | sum-b | budget"]
    assert llm.chat_requests[1]["messages"] == [{"role": "user", "content": "summarize: aa"}]
    async with open_runtime(config_for(llm.base_url, workspace)) as rt:
        totals = (await rt.usage.totals())["code"]
    assert totals.model_calls == 3 and totals.executions == 1 and totals.failures == 0


async def test_an_llm_query_past_the_models_context_is_refused_before_it_is_sent(llm: FakeOpenAI,
                                                                                   workspace: Path) -> None:
    """A program can make a prompt of any length; a server with a larger context would bill it."""
    llm.script(reply("```python\ntry:\n    llm_query('x' * 5_000_000)\nexcept ValueError as e:\n"
                     "    final_answer(str(e))\n```"))
    [answer] = await ask(llm, workspace, "go")
    assert answer.startswith("llm_query: the prompt is about 1,666,67") and "contextTokens" in answer
    assert len(llm.chat_requests) == 1  # the program's own request only


async def test_large_input_arrives_as_context(llm: FakeOpenAI, workspace: Path) -> None:
    big = "word " * 5000
    llm.script(reply("```python\nfinal_answer(str(len(context.split())))\n```"))
    assert await ask(llm, workspace, big) == ["5000"]
    prompt = llm.chat_requests[0]["messages"][-1]["content"]
    assert "variable `context`" in prompt and len(prompt) < 1300


async def test_a_long_message_stays_whole_for_later_turns(llm: FakeOpenAI, workspace: Path, home: Path) -> None:
    pasted = "Line of a log file.\n" * 2000 + "QUESTION: how many lines mention the log?"
    llm.script(reply("That is a long log. Shall I count?"),
               reply("```python\nfinal_answer(str(sum('log' in l for l in context.splitlines())))\n```"))
    async with open_runtime(config_for(llm.base_url, workspace, mode="code")) as rt:
        assert await rt.agent.handle("cli:long", pasted) == "That is a long log. Shall I count?"
        assert await rt.agent.handle("cli:long", "yes, count") == "2001"  # no NameError: context
    preview = llm.chat_requests[0]["messages"][-1]["content"]
    assert "QUESTION: how many lines" in preview  # the end, where the question usually is
    [saved] = (workspace / "messages").iterdir()
    assert saved.read_text() == pasted
    assert "QUESTION" in (home / "sessions" / "cli_long.jsonl").read_text()


async def test_hybrid_exec_python_shares_state_with_later_programs(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "n.txt").write_text("3")
    llm.script(tool_call("exec_python", {"code": "n = int(read_file('n.txt'))\nn * 2"}),
               tool_call("read_file", {"path": "n.txt"}),
               tool_call("exec_python", {"code": "final_answer(n + 1)"}))
    assert await ask(llm, workspace, "go", mode="hybrid") == ["4"]
    names = {t["function"]["name"] for t in llm.chat_requests[0]["tools"]}
    assert {"exec_python", "read_file"} <= names
    assert llm.chat_requests[1]["messages"][-1]["content"] == "Out: 6"
    assert len(llm.chat_requests) == 3


async def test_mode_precedence_and_persistence(llm: FakeOpenAI, workspace: Path) -> None:
    config = config_for(llm.base_url, workspace, mode="code")
    config.agents.overrides["telegram:5"] = AgentOverride(execution_mode="tools")
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("telegram:5", "/mode") == "Mode: tools (choose with /mode tools|code|hybrid)."
        assert await rt.agent.handle("telegram:5", "/mode hybrid") == "Mode set to hybrid for this chat."
        assert "Unknown mode" in await rt.agent.handle("telegram:5", "/mode fast")
    async with open_runtime(config) as rt:  # after a restart the chat's choice still wins over the override
        assert await rt.agent.handle("telegram:5", "/mode") == "Mode: hybrid (choose with /mode tools|code|hybrid)."
        assert await rt.agent.handle("telegram:6", "/mode") == "Mode: code (choose with /mode tools|code|hybrid)."
        assert await rt.agent.handle("telegram:5", "/mode default") == \
            "Mode reset to the configured default for this chat: tools."  # the override applies again
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("telegram:5", "/mode") == "Mode: tools (choose with /mode tools|code|hybrid)."


async def test_unknown_commands_are_answered_here_and_paths_are_not_commands(llm: FakeOpenAI,
                                                                             workspace: Path) -> None:
    llm.script(reply("It lists hosts."))
    async with open_runtime(config_for(llm.base_url, workspace)) as rt:
        assert await rt.agent.handle("cli:c", "/nonsense now") == "Unknown command /nonsense. /help lists the commands."
        assert await rt.agent.handle("cli:c", "/etc/hosts is what?") == "It lists hosts."
    assert len(llm.chat_requests) == 1


async def test_status_command_shows_usage_per_mode(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nfinal_answer('hi')\n```"))
    [_, status] = await ask(llm, workspace, "hello", "/status", session="telegram:8")
    assert status.startswith("Session telegram:8: 3 messages, mode code, model fake-model.")  # no empty result
    assert "code: 1 model call, 10 prompt + 5 completion tokens, 1 execution, 0 failed" in status


async def test_use_skill_defines_helpers_in_the_session(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("```python\nprint(use_skill('summarize'))\nparts = chunk_text('abcdefghij' * 3, 12, 2)\n"
                     "final_answer(len(parts))\n```"),
               reply("```python\nfinal_answer(len(chunk_text('x' * 30, 10, 0)))\n```"),  # still defined next turn
               reply("```python\nuse_skill('no-such-skill')\n```"), reply("sorry"))
    assert await ask(llm, workspace, "one", "two", "three") == ["3", "3", "sorry"]
    error = llm.chat_requests[3]["messages"][-1]["content"]
    assert "ValueError: use_skill" in error and "no-such-skill" in error


async def test_use_skill_in_a_stateless_run_as_cron_jobs_have(llm: FakeOpenAI, workspace: Path) -> None:
    from nanobot.tools.registry import ToolContext

    async with open_runtime(config_for(llm.base_url, workspace, mode="code")) as rt:
        limits = rt.config.agents.defaults.code_runtime.model_copy(update={"persist_state": False})
        ctx = ToolContext(rt.config, workspace, "telegram:1", OWNER, services=rt)
        ok = await rt.code.run("use_skill('summarize')\nlen(chunk_text('y' * 25, 10, 0))", ctx, limits=limits,
                               timezone="UTC", mode="cron")
        bad = await rt.code.run("use_skill('nope')", ctx, limits=limits, timezone="UTC", mode="cron")
        computed = await rt.code.run("name = 'summarize'\nuse_skill(name)", ctx, limits=limits, timezone="UTC",
                                     mode="cron")
    assert ok.ok and ok.value == "3"
    assert bad.error_type == "ValueError" and "nope" in bad.error
    assert "literal string" in computed.error


async def test_code_shown_to_the_user_is_not_run(llm: FakeOpenAI, workspace: Path) -> None:
    answer = "Use slicing:\n```python show\nwrite_file('ran.txt', 'x')\nitems[::-1]\n```\nIt returns a new list."
    llm.script(reply(answer))
    [reply_text] = await ask(llm, workspace, "how do I reverse a list?")
    assert reply_text == answer.replace("```python show\n", "```python\n")
    assert not (workspace / "ran.txt").exists() and len(llm.chat_requests) == 1
    assert "```python show" in llm.chat_requests[0]["messages"][0]["content"]  # documented in the prompt


async def test_a_program_over_the_size_limit_is_refused_unrun_and_the_chat_goes_on(
        llm: FakeOpenAI, workspace: Path) -> None:
    huge = "I will run this program.\n```python\n" + 'write_file("ran.txt", "yes")\n' * 8_000 + "```"
    llm.script(reply(huge), reply("That was too long; here is the short answer."), reply("Hi again."))
    assert await ask(llm, workspace, "go", "hello") == ["That was too long; here is the short answer.", "Hi again."]
    assert not (workspace / "ran.txt").exists()
    second = llm.chat_requests[1]["messages"]
    assert "programs may have up to 200,000 (codeRuntime.maxProgramChars). It was not run." in second[-1]["content"]
    assert second[-2]["content"] == "I will run this program.\n[a program of 231,999 characters, not run]"
    assert sum(len(str(m["content"])) for m in llm.chat_requests[2]["messages"]) < 20_000  # not carried on


def test_no_stub_comment_stops_mid_sentence() -> None:
    from nanobot.sandbox.executor import code_stubs
    from nanobot.config import Config
    from nanobot.tools.builtin import default_registry

    stubs = code_stubs(default_registry(Config()), header=False)
    for line in stubs.strip().splitlines():
        assert line.split("  # ", 1)[1].endswith((".", ")", "?", '"', "`")), line
    assert "returns the job id. Output goes to this chat, or to `to`." in stubs and 'folders end with "/".' in stubs
    assert '{"status": "ok" or "error", "output": ...}' in stubs and 'a last line "[exit code N]".' in stubs


async def test_after_final_answer_no_empty_result_is_kept(llm: FakeOpenAI, workspace: Path) -> None:
    program = "```python\nfinal_answer('hi')\n```"
    llm.script(reply(program), reply("```python\nprint(2)\nfinal_answer('two')\n```"), reply("ok"))
    assert await ask(llm, workspace, "hello", "again", "and?") == ["hi", "two", "ok"]
    later = [(m["role"], m["content"]) for m in llm.chat_requests[2]["messages"][1:]]
    assert later[:2] == [("user", "hello"), ("assistant", f"{program}\n\nhi")]  # one message: roles alternate
    assert ("user", "<python_result>\n2\n</python_result>") in later  # a result that says something stays
    assert not any("(no output)" in str(c) for _, c in later)


async def test_a_programs_answer_is_cut_at_the_message_limit_saying_so(llm: FakeOpenAI, workspace: Path) -> None:
    """A program can make a string of any length: "x" * 3_000_000 as an answer was 734 Telegram
    messages in the chat ("[" * 3_000_000 also 41 s of the daemon's time to format them)."""
    from nanobot.tools.messaging import MAX_MESSAGE_CHARS

    llm.script(reply("```python\nfinal_answer('x' * 3_000_000)\n```"))
    [answer] = await ask(llm, workspace, "go")
    assert answer.startswith("x" * MAX_MESSAGE_CHARS + "\n\n[… cut here: 2,950,000 more characters")
    assert len(answer) < MAX_MESSAGE_CHARS + 200 and "send_file" in answer
