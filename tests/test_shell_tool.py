"""exec_command through the real registry: output, exit codes, timeouts, the deny list, env."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from nanobot.config import Config
from nanobot.tools.files import FILE_TOOLS
from nanobot.tools.registry import ToolContext, ToolRegistry
from nanobot.tools.shell import SHELL_TOOLS, denied_reason
from nanobot.trust import OWNER

registry = ToolRegistry(FILE_TOOLS + SHELL_TOOLS)


@pytest.fixture
def ctx(config: Config, workspace: Path) -> ToolContext:
    return ToolContext(config=config, workspace=workspace, session_key="cli:default", trust=OWNER)


async def run(ctx: ToolContext, command: str, **kwargs) -> str:
    """The command's output; a success's "[exit code 0]" line is checked and taken off."""
    result = await registry.call("exec_command", {"command": command} | kwargs, ctx)
    if result.endswith("\n[exit code 0]"):
        result = result.removesuffix("\n[exit code 0]")
        return "(no output)" if result == "(no output)" else result + "\n"
    return result


def _gone(pid: int) -> bool:
    """True once the process no longer exists (or is only a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


async def _wait_gone(pid: int, seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        await asyncio.sleep(0.02)
    return _gone(pid)


async def test_output_and_cwd(ctx, workspace):
    assert await run(ctx, "echo hello") == "hello\n"
    assert (await run(ctx, "pwd")).strip() == str(workspace.resolve())
    assert await run(ctx, "true") == "(no output)"


async def test_stderr_and_exit_code(ctx):
    assert await run(ctx, "echo out; echo err >&2; exit 3") == "out\nerr\n[exit code 3]"
    assert await run(ctx, "exit 4") == "(no output)\n[exit code 4]"
    raw = await registry.call("exec_command", {"command": "echo ok"}, ctx)
    assert raw == "ok\n[exit code 0]"  # the exit code always, as the tool's description promises


async def test_sees_files_written_by_file_tools(ctx):
    await registry.call("write_file", {"path": "d/x.txt", "content": "from write_file"}, ctx)
    assert await run(ctx, "cat d/x.txt") == "from write_file\n"


async def test_timeout_kills_the_process_group(ctx, workspace):
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await run(ctx, "echo started; sleep 60 & echo $! > child.pid; sleep 60", timeout=1)
    elapsed = time.monotonic() - start
    assert elapsed < 20, elapsed  # killed at its timeout, not after the command's minute
    message = str(info.value)
    assert "timed out after 1s" in message and "started" in message  # the partial output
    assert await _wait_gone(int((workspace / "child.pid").read_text()))  # the grandchild too


async def test_config_timeout_is_the_default(ctx):
    ctx.config.tools.exec.timeout = 1
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await run(ctx, "sleep 60")
    assert time.monotonic() - start < 20  # killed at the configured second, not after a minute


async def test_bad_timeout(ctx):
    with pytest.raises(ValueError):
        await run(ctx, "true", timeout=0)


async def test_cancel_kills_the_command(ctx, workspace):
    task = asyncio.create_task(run(ctx, "echo $$ > sh.pid; sleep 30"))
    pid_file = workspace / "sh.pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_gone(int(pid_file.read_text()))


async def test_background_child_does_not_hold_the_turn(ctx, workspace):
    start = time.monotonic()
    out = await run(ctx, "sleep 60 & echo $! > bg.pid; echo done")
    assert out == "done\n"
    assert time.monotonic() - start < 20  # not the background child's minute
    os.kill(int((workspace / "bg.pid").read_text()), 9)


async def test_output_is_capped_in_the_middle(ctx):
    ctx.config.tools.exec.max_output_chars = 200
    out = await run(ctx, "seq 1 20000")
    assert out.startswith("1\n2\n3\n")
    assert out.endswith("19999\n20000\n")
    assert "omitted" in out
    assert len(out) < 300


async def test_huge_output_stays_bounded(ctx):
    ctx.config.tools.exec.max_output_chars = 100
    out = await run(ctx, "head -c 5000000 /dev/zero | tr '\\0' 'a'; echo; echo END")
    assert out.endswith("END\n") and "omitted" in out and len(out) < 200


async def test_disabled(ctx):
    ctx.config.tools.exec.enabled = False
    with pytest.raises(PermissionError, match="disabled"):
        await run(ctx, "echo hi")


async def test_env_has_no_secrets(ctx, monkeypatch):
    monkeypatch.setenv("NANOBOT_PROVIDERS__OPENAI__API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("NANOBOT_CHANNELS__TELEGRAM__TOKEN", "123:tg-do-not-leak")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-also-not")
    out = await run(ctx, "env")
    assert "do-not-leak" not in out and "sk-also-not" not in out
    assert "NANOBOT_" not in out
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert {"PATH", "HOME", "LANG"} <= names


# Never run these for real: each test asserts the guard matches before the registry call.
DENIED = [
    "rm -rf /",
    "rm -rf /*",
    "rm -rf ~",
    "rm -rf ~/",
    "rm -fr --no-preserve-root /",
    "sudo rm -rf /",
    "rm -r -f /",
    "rm --recursive --force /",
    "rm -Rf $HOME",
    'rm -rf "$HOME"',
    "rm -rf /etc",
    "cd /tmp && rm -rf / && echo done",
    "cd / && rm -rf *",
    "mkfs.ext4 /dev/sda1",
    "sudo mkfs -t ext4 /dev/sdb",
    "dd if=/dev/zero of=/dev/sda bs=1M",
    "dd if=image.iso of=/dev/nvme0n1",
    "cat junk > /dev/sda",
    "echo x | sudo tee /dev/sdb",
    ":(){ :|:& };:",
    "bomb(){ bomb | bomb & }; bomb",
    "shutdown -h now",
    "sudo reboot",
    "halt",
    "poweroff",
    "/sbin/reboot",
    "init 0",
    "sudo systemctl poweroff",
    "echo bye; reboot",
    "sh -c 'reboot'",
    "chmod -R 777 /",
    "chown -R nobody:nogroup /",
    "sudo chown -R me /",
]

ALLOWED = [
    "rm -rf build/",
    "rm -rf ./build /tmp/nanobot-test-dir-that-does-not-exist",
    "rm file.txt",
    "rm -f /tmp/nanobot-test-file-that-does-not-exist",
    "echo reboot",
    "echo 'shutdown is scheduled'",
    "grep -r shutdown . || true",
    "ls -la / > /dev/null",
    "ls > /dev/null 2>&1",
    "dd if=/dev/zero of=out.bin bs=1 count=4",
    "dd if=/dev/zero of=/dev/null bs=1 count=4",
    "chmod -R u+w .",
    "chmod -r nothing 2>/dev/null || true",
    "mkdir -p a/b && rm -r a",
    "initdb=0; echo $initdb",
]


@pytest.mark.parametrize("command", DENIED)
async def test_destructive_commands_are_refused(ctx, command):
    assert denied_reason(command), command
    with pytest.raises(PermissionError, match="refused"):
        await run(ctx, command)


@pytest.mark.parametrize("command", ALLOWED)
def test_benign_commands_pass_the_guard(command):
    assert denied_reason(command) is None


async def test_benign_commands_run(ctx, workspace):
    (workspace / "build").mkdir()
    (workspace / "build" / "x.o").write_text("")
    (workspace / "file.txt").write_text("")
    assert await run(ctx, "rm -rf build/ && rm file.txt && echo reboot") == "reboot\n"
    assert sorted(os.listdir(workspace)) == [".tmp"]  # TMPDIR of the shell
