"""The Monty sandbox, on real Monty workers: one pool for the module, a fresh key per test."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from typing import Any

import pytest
import pytest_asyncio

from nanobot.config import CodeRuntime
from nanobot.sandbox import offers
from nanobot.sandbox import MontyPool, Sandbox, StopProgram, render_stubs
from nanobot.tools.registry import ToolContext, tool

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = CodeRuntime(max_execution_ms=2000, max_memory_mb=64, max_tool_calls=200, max_output_chars=2000)
_keys = itertools.count()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sandbox():
    box = Sandbox(max_live_sessions=4, spare_workers=4)
    yield box
    await box.close()


@pytest.fixture
def key() -> str:
    return f"test:{next(_keys)}"


class Host:
    """The host side of a run: plain Python functions the program may call, and a call log."""

    def __init__(self, **functions: Any) -> None:
        self.functions = {"double": lambda x: x * 2, **functions}
        self.log: list[tuple[str, tuple, dict]] = []

    @property
    def names(self) -> set[str]:
        return set(self.functions)

    async def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        self.log.append((name, args, kwargs))
        return self.functions[name](*args, **kwargs)


async def run(box: Sandbox, code: str, key: str, host: Host | None = None, limits: CodeRuntime = LIMITS, **kw: Any):
    host = host or Host()
    return await box.run(code, session_key=key, call=host.call, function_names=host.names, limits=limits, **kw)


async def test_print_output_and_last_value(sandbox, key):
    result = await run(sandbox, "print('hello')\nprint('n =', 1 + 1)\n{'a': [1, 2]}", key)
    assert result.ok, result.error
    assert result.output == "hello\nn = 2\n"
    assert result.value == "{'a': [1, 2]}"
    assert result.to_model_text() == "hello\nn = 2\nOut: {'a': [1, 2]}"


async def test_statement_has_no_value_and_empty_run_says_so(sandbox, key):
    result = await run(sandbox, "x = 1", key)
    assert result.ok and result.value is None and result.output == ""
    assert result.to_model_text() == "(no output)"


async def test_output_is_capped_with_a_note(sandbox, key):
    result = await run(sandbox, "for i in range(1000):\n    print('x' * 9)", key)
    assert result.ok
    assert len(result.output) < LIMITS.max_output_chars + 200  # the note says how to get the rest
    assert "[output truncated: 8,000 more characters not shown; print a slice" in result.output
    assert "write the whole to a file with write_file]" in result.output


async def test_inputs_are_globals_and_output_survives_an_error(sandbox, key):
    result = await run(sandbox, "print(sum(data))\nmissing", key, inputs={"data": [1, 2, 3]})
    assert result.output == "6\n" and result.error_type == "NameError"
    assert result.to_model_text().startswith("6\nTraceback")


async def test_timezone_is_the_sandbox_local_zone(sandbox, key):
    code = "import datetime\ndatetime.datetime.now().astimezone().utcoffset().total_seconds() / 3600"
    result = await run(sandbox, code, key, timezone="Asia/Kolkata")
    assert result.value == "5.5", result.error


async def test_host_function_called_100_times_in_a_loop(sandbox, key):
    host = Host()
    result = await run(sandbox, "total = 0\nfor i in range(100):\n    total += double(i)\ntotal", key, host)
    assert result.ok, result.error
    assert result.value == str(sum(2 * i for i in range(100)))
    assert result.function_calls == 100 and len(host.log) == 100


async def test_keyword_arguments_and_tool_as_a_value(sandbox, key):
    host = Host(greet=lambda name, punct="!": f"hi {name}{punct}")
    result = await run(sandbox, "f = greet\n[f('a', punct='?'), greet(name='b')]", key, host)
    assert result.ok, result.error
    assert result.value == "['hi a?', 'hi b!']"
    assert host.log[0] == ("greet", ("a",), {"punct": "?"})


async def test_failing_function_raises_builtin_the_program_can_catch(sandbox, key):
    def read_file(path):
        raise FileNotFoundError(f"no such file: {path}")

    code = ("try:\n    read_file('missing.txt')\nexcept FileNotFoundError as e:\n"
            "    print('caught:', e)\n'after'")
    result = await run(sandbox, code, key, Host(read_file=read_file))
    assert result.ok, result.error
    assert result.output == "caught: no such file: missing.txt\n"
    assert result.value == "'after'"


async def test_unknown_exception_type_reaches_program_as_runtime_error(sandbox, key):
    class Weird(Exception):
        pass

    def boom():
        raise Weird("odd")

    result = await run(sandbox, "try:\n    boom()\nexcept RuntimeError as e:\n    print(e)", key, Host(boom=boom))
    assert result.output == "Weird: odd\n"


async def test_uncaught_error_shows_traceback_in_model_code(sandbox, key):
    def read_file(path):
        raise PermissionError("outside the workspace")

    code = "def load(p):\n    return read_file(p)\n\nx = 1\nload('/etc/passwd')"
    result = await run(sandbox, code, key, Host(read_file=read_file))
    assert not result.ok and result.error_type == "PermissionError"
    assert "line 5" in result.error and "line 2, in load" in result.error
    assert "return read_file(p)" in result.error
    assert result.error.rstrip().endswith("PermissionError: outside the workspace")
    assert "nanobot" not in result.error and "site-packages" not in result.error  # no host frames


async def test_syntax_error(sandbox, key):
    result = await run(sandbox, "x = (1,\nprint(x", key)
    assert result.error_type == "SyntaxError"
    assert "SyntaxError" in result.error


async def test_name_error_for_unknown_names_and_functions(sandbox, key):
    result = await run(sandbox, "undefined_thing + 1", key)
    assert result.error_type == "NameError" and "undefined_thing" in result.error
    result = await run(sandbox, "no_such_tool(1)", key)
    assert result.error_type == "NameError" and "no_such_tool" in result.error


async def test_infinite_loop_times_out_within_limit_and_resets_state(sandbox, key):
    limits = LIMITS.model_copy(update={"max_execution_ms": 300})
    await run(sandbox, "kept = 1", key, limits=limits)
    started = time.perf_counter()
    result = await run(sandbox, "while True:\n    pass", key, limits=limits)
    assert time.perf_counter() - started < 1.0
    assert result.error_type == "TimeoutError"
    assert "300 ms limit" in result.error
    assert result.state_reset and "reset" in result.to_model_text()
    after = await run(sandbox, "kept", key, limits=limits)  # a fresh session, still working
    assert after.error_type == "NameError"


async def test_memory_bomb_ends_with_memory_error_fast(sandbox, key):
    started = time.perf_counter()
    result = await run(sandbox, "x = [0] * 10**9", key)
    assert time.perf_counter() - started < 0.5
    assert result.error_type == "MemoryError"
    assert "64 MB memory limit" in result.error and "line 1" in result.error
    assert result.state_reset
    assert (await run(sandbox, "1 + 1", key)).value == "2"


async def test_state_persists_across_runs(sandbox, key):
    assert (await run(sandbox, "def inc(n):\n    return n + step\nstep = 10", key)).ok
    result = await run(sandbox, "inc(5)", key)
    assert result.value == "15"
    other = await run(sandbox, "step", f"{key}-other")
    assert other.error_type == "NameError"  # sessions do not share state


async def test_no_persistence_when_persist_state_is_off(sandbox, key):
    limits = LIMITS.model_copy(update={"persist_state": False})
    assert (await run(sandbox, "a = 1", key, limits=limits)).ok
    assert (await run(sandbox, "a", key, limits=limits)).error_type == "NameError"
    assert key not in sandbox.live_sessions


async def test_state_survives_dump_and_a_new_pool(sandbox, key):
    host = Host()
    blob = (await run(sandbox, "import json\ndata = {'n': 3}\nf = double\ndef twice(x):\n    return f(x) * 2",
                      key, host, save_state=True)).state
    assert isinstance(blob, bytes) and blob

    fresh = Sandbox(MontyPool(max_processes=2))  # as after a daemon restart
    try:
        assert fresh.restore(key, blob) and fresh.has_state(key)
        result = await run(fresh, "json.dumps(data), twice(data['n'])", key, host)
        assert result.ok, result.error
        assert result.value == "('{\"n\": 3}', 12)"
        assert not fresh.restore(key, blob)  # live state wins over a stale dump
    finally:
        await fresh.close()
        await fresh.pool.close()


async def test_save_state_returns_dump_and_over_cap_state_is_dropped_with_notice(sandbox, key):
    result = await run(sandbox, "small = 1", key, save_state=True)
    assert result.state and not result.notices
    capped = Sandbox(sandbox.pool, max_state_bytes=50_000)
    try:
        big = await run(capped, "big = 'x' * 200_000", key, save_state=True)
        assert big.ok and big.state is None
        assert "over the" in big.to_model_text() and "restart will lose it" in big.to_model_text()
        assert (await run(capped, "len(big)", key)).value == "200000"  # kept live, though
    finally:
        await capped.close()


async def test_state_too_large_to_dump_is_discarded_and_the_next_program_runs(sandbox, key):
    # 30 MB of string fits the 64 MB limit, but the worker cannot also build its dump.
    big = await run(sandbox, "x = 'a' * 30_000_000\nprint('made')", key, save_state=True)
    assert big.ok and big.output.strip() == "made" and big.state is None
    assert "could not be saved" in big.to_model_text() and "discarded" in big.to_model_text()
    after = await run(sandbox, "print(1 + 1)", key, save_state=True)
    assert after.ok and after.output.strip() == "2" and after.state is not None


async def test_bad_saved_state_starts_fresh_with_notice(sandbox, key):
    sandbox.restore(key, b"not a monty dump")
    result = await run(sandbox, "1", key)
    assert result.ok and result.value == "1"
    assert any("could not be restored" in n for n in result.notices)


async def test_reset_clears_state(sandbox, key):
    await run(sandbox, "secret = 42", key)
    await sandbox.reset(key)
    assert key not in sandbox.live_sessions and not sandbox.has_state(key)
    assert (await run(sandbox, "secret", key)).error_type == "NameError"


async def test_release_parks_state_and_lru_cap_keeps_it(sandbox, key):
    await run(sandbox, "mine = 'kept'", key)
    await sandbox.release(key)
    assert key not in sandbox.live_sessions and sandbox.has_state(key)
    for i in range(sandbox.max_live_sessions + 1):  # pushes every other session out
        await run(sandbox, f"v = {i}", f"{key}-lru{i}")
    assert len(sandbox.live_sessions) <= sandbox.max_live_sessions
    assert f"{key}-lru0" not in sandbox.live_sessions  # least recently used went first
    assert (await run(sandbox, "mine", key)).value == "'kept'"
    assert (await run(sandbox, "v", f"{key}-lru0")).value == "0"


async def test_many_sessions_at_once_beyond_live_cap(sandbox, key):
    async def slow_wait(name, args, kwargs):
        await asyncio.sleep(0.02)  # every session is busy at once

    async def one(i: int):
        return await sandbox.run(f"wait()\n{i} * 2", session_key=f"{key}-c{i}", call=slow_wait,
                                 function_names={"wait"}, limits=LIMITS)

    n = sandbox.max_live_sessions * 2
    results = await asyncio.gather(*(one(i) for i in range(n)))
    assert [r.value for r in results] == [str(i * 2) for i in range(n)]
    assert len(sandbox.live_sessions) <= sandbox.max_live_sessions


async def test_tool_call_cap(sandbox, key):
    limits = LIMITS.model_copy(update={"max_tool_calls": 5})
    host = Host()
    result = await run(sandbox, "for i in range(10):\n    double(i)", key, host, limits=limits)
    assert result.error_type == "RuntimeError"
    assert "at most 5 function calls" in result.error
    assert result.function_calls == 5 and len(host.log) == 5


async def test_await_on_a_function_gives_a_clear_message_without_running_it(sandbox, key):
    host = Host()
    result = await run(sandbox, "x = await double(2)", key, host)
    assert result.error_type == "TypeError"
    assert "call it without `await`, e.g. `x = double(...)`" in result.error
    assert host.log == []
    gathered = await run(sandbox, "import asyncio\nawait asyncio.gather(double(1), double(2))", key, host)
    assert gathered.error_type == "TypeError" and "without `await`" in gathered.error


async def test_stop_program_ends_the_run_successfully(sandbox, key):
    answers = []

    def final_answer(value):
        answers.append(value)
        raise StopProgram

    code = "print('before')\nfinal_answer('done')\nprint('never')"
    result = await run(sandbox, code, key, Host(final_answer=final_answer))
    assert result.ok and result.output == "before\n" and answers == ["done"]


async def test_unconvertible_return_value_becomes_type_error(sandbox, key):
    result = await run(sandbox, "try:\n    weird()\nexcept TypeError as e:\n    print('caught')",
                       key, Host(weird=lambda: object()))
    assert result.ok, result.error
    assert result.output == "caught\n"


async def test_os_access_is_refused_and_sleep_allowed(sandbox, key):
    result = await run(sandbox, "from pathlib import Path\nPath('/etc/passwd').read_text()", key)
    assert result.error_type == "PermissionError" and "provided functions" in result.error
    result = await run(sandbox, "import time\ntime.sleep(0.01)\n'slept'", key)
    assert result.value == "'slept'"


async def test_worker_crash_becomes_error_and_other_sessions_survive(sandbox, key):
    await run(sandbox, "a = 1", key)
    await run(sandbox, "b = 2", f"{key}-neighbour")
    os.kill(sandbox.worker_pid(key), signal.SIGKILL)
    result = await run(sandbox, "a", key)
    assert result.error_type == "SandboxCrash" and result.state_reset
    assert (await run(sandbox, "a", key)).error_type == "NameError"  # fresh session, working
    assert (await run(sandbox, "b", f"{key}-neighbour")).value == "2"


async def test_cancelled_run_resets_state_and_session_recovers(sandbox, key):
    await run(sandbox, "a = 1", key)
    task = asyncio.ensure_future(run(sandbox, "while True:\n    pass", key))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await run(sandbox, "a", key)).error_type == "NameError"


async def test_cancelled_during_a_function_call(sandbox, key):
    started = asyncio.Event()

    async def hang(name, args, kwargs):
        started.set()
        await asyncio.sleep(30)

    await run(sandbox, "a = 1", key)
    task = asyncio.ensure_future(sandbox.run("hang()", session_key=key, call=hang, function_names={"hang"},
                                             limits=LIMITS))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await run(sandbox, "a", key)).error_type == "NameError"
    assert (await run(sandbox, "b = 2\nb", key)).value == "2"


# -- stubs and checks ------------------------------------------------------------------------


@tool
async def read_file(ctx: ToolContext, path: str) -> str:
    """Read a text file.

    More detail that the stub leaves out."""
    return ""


@tool
async def list_dir(ctx: ToolContext, path: str = ".", limit: int | None = None) -> list[str]:
    """List a directory."""
    return []


async def test_render_stubs():
    stubs = render_stubs([read_file, list_dir])
    assert stubs.startswith("from typing import")
    assert "def read_file(path: str) -> str: ...  # Read a text file." in stubs
    assert "def list_dir(path: str = '.', limit: int | None = None) -> list[str]:" in stubs
    assert "More detail" not in stubs
    assert not render_stubs([read_file], header=False).startswith("from")


async def test_type_check_error_is_an_error_result(sandbox, key):
    limits = LIMITS.model_copy(update={"type_check": True})
    stubs = render_stubs([read_file, list_dir])
    host = Host(read_file=lambda path: "text", list_dir=lambda path=".", limit=None: [])
    result = await run(sandbox, "n: int = read_file('a.txt')", key, host, limits=limits, stubs=stubs)
    assert result.error_type == "TypeCheckError" and "not assignable" in result.error
    assert host.log == []  # nothing ran
    ok = await run(sandbox, "names = list_dir('.')\nlen(names)", key, host, limits=limits, stubs=stubs)
    assert ok.ok, ok.error


async def test_check_code_without_running(sandbox):
    stubs = render_stubs([read_file, list_dir])
    assert await sandbox.check_code("x = read_file('a')\nwhile True:\n    pass", stubs=stubs) is None
    assert "SyntaxError" in await sandbox.check_code("def f(:\n    pass")
    problem = await sandbox.check_code("list_dir(3)", stubs=stubs, type_check=True)
    assert problem and "list_dir" in problem
    assert await sandbox.check_code("list_dir(3)", stubs=stubs, type_check=False) is None


@pytest.mark.parametrize("module", [m.split()[0] for m in offers.MODULES])
async def test_every_module_the_prompt_offers_imports(sandbox, key, module):
    result = await run(sandbox, f"import {module}\nprint('ok')", key)
    assert result.ok and result.output == "ok\n", result.error


@pytest.mark.parametrize("module", list(offers.MISSING_MODULES))
async def test_a_missing_module_says_which_and_what_to_use_instead(sandbox, key, module):
    result = await run(sandbox, f"import {module}", key)
    assert result.error_type == "ModuleNotFoundError"
    assert f"No module named '{module}' in the sandbox; {offers.MISSING_MODULES[module]}" in result.error


async def test_a_missing_builtin_says_what_to_do_instead(sandbox, key):
    result = await run(sandbox, "try:\n    dir()\nexcept NameError as e:\n    print(e)\n__import__('json')", key)
    assert "dir() is not available in the sandbox; print the names you want to look at" in result.output
    assert result.error_type == "NameError" and "__import__() is not available in the sandbox; write `import name`" \
        in result.error
