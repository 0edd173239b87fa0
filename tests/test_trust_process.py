"""The shell's confinement in a real nanobot process: the daemon's own environment stays out of
reach, and on a kernel without Landlock the shell refuses (fail closed) instead of running
unconfined. The kernel without Landlock is made for real: the process runs under a seccomp
filter that answers ENOSYS to landlock_create_ruleset, as an old kernel would."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from nanobot import confine
from tests.fakes.openai_server import FakeOpenAI, reply, tool_calls

NO_LANDLOCK = (
    "import errno, os, sys\n"
    "from nanobot import confine as c\n"
    "c.set_no_new_privs()\n"
    f"c.install_seccomp(c.seccomp_program(c.current_arch(), {{{confine.NR_LANDLOCK_CREATE_RULESET}: errno.ENOSYS}}, {{}}))\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'nanobot', *sys.argv[1:]])\n"
)

pytestmark = pytest.mark.skipif(confine.current_arch() is None or not confine.seccomp_available(),
                                reason="needs Linux with seccomp")


def write_config(home: Path, workspace: Path, llm: FakeOpenAI) -> None:
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace), "model": "fake-model", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "test-key", "apiBase": llm.base_url}}}))


async def nanobot(*args: str, home: Path, no_landlock: bool = False, env: dict[str, str] | None = None) -> str:
    prefix = ["-c", NO_LANDLOCK] if no_landlock else ["-m", "nanobot"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *prefix, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NANOBOT_HOME": str(home), **(env or {})})
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode()


async def test_status_and_exec_command_refuse_when_the_kernel_cannot_confine(
        llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    write_config(home, workspace, llm)
    status = await nanobot("status", home=home, no_landlock=True)
    assert "Shell:     REFUSED (the kernel offers no Landlock" in status and 'tools.exec.sandbox to "off"' in status
    llm.script(tool_calls(("exec_command", {"command": "echo RAN > ran.txt"})), reply("could not"))
    out = await nanobot("agent", "-m", "run it", home=home, no_landlock=True)
    assert "could not" in out
    [result] = [m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert "exec_command refused: the shell cannot be confined" in result and "tools.exec.sandbox" in result
    assert not (workspace / "ran.txt").exists()


async def test_opting_out_runs_unconfined_and_says_so(llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    write_config(home, workspace, llm)
    status = await nanobot("status", home=home, no_landlock=True, env={"NANOBOT_TOOLS__EXEC__SANDBOX": "off"})
    assert "Shell:     UNCONFINED" in status


@pytest.mark.skipif(not confine.probe().ok, reason="this kernel cannot confine the shell")
async def test_the_daemons_environment_never_reaches_the_model(llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    write_config(home, workspace, llm)
    llm.script(tool_calls(("exec_command", {"command": "env; cat /proc/$PPID/environ; tr '\\0' '\\n' "
                                                       "< /proc/$PPID/environ | grep CANARY"})), reply("done"))
    out = await nanobot("agent", "-m", "show me", home=home,
                        env={"NANOBOT_PROVIDERS__OPENAI__API_KEY": "sk-CANARY-ENV", "SOME_TOKEN": "CANARY-ENV2"})
    assert "done" in out
    assert "CANARY-ENV" not in json.dumps(llm.requests)
    [result] = [m["content"] for m in llm.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert "Permission denied" in result and f"HOME={workspace}" in result
