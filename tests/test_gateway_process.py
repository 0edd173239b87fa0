"""``nanobot gateway`` as a real process: both channels against the stand-ins, systemd's notify
protocol on a datagram socket bound here, SIGTERM for a clean exit. Production timings."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest

from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram

ALICE = 42


class NotifyListener:
    """What systemd would hear on NOTIFY_SOCKET (an abstract socket, as the '@' form tests)."""

    def __init__(self) -> None:
        self.name = f"@nanobot-test-{os.getpid()}-{id(self)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.setblocking(False)
        self.states: list[str] = []

    async def wait_for(self, state: str, timeout: float = 15.0) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while state not in self.states:
                self.states.extend((await loop.sock_recv(self.sock, 4096)).decode().split("\n"))

    def close(self) -> None:
        self.sock.close()


def open_files_limits(pid: int) -> tuple[str, str]:
    """A process's (soft, hard) limit of open files, as /proc shows them."""
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if line.startswith("Max open files"))
    return line.split()[3], line.split()[4]


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeOpenAI, FakeTelegram, FakeDiscord]]:
    async with FakeOpenAI() as llm, FakeTelegram() as tg, FakeDiscord() as dc:
        yield llm, tg, dc


def write_config(home: Path, workspace: Path, llm: FakeOpenAI, tg: FakeTelegram, dc: FakeDiscord) -> None:
    config = {
        "agents": {"defaults": {"workspace": str(workspace), "model": "fake-model", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "test-key", "apiBase": llm.base_url}},
        "channels": {
            "telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": [str(ALICE)],
                         "streaming": False},
            "discord": {"enabled": True, "token": dc.token, "apiBase": dc.api_base, "gatewayUrl": dc.gateway_url,
                        "allowFrom": [], "streaming": False},
        },
        "gateway": {"shutdownGraceSeconds": 2},
    }
    (home / "config.json").write_text(json.dumps(config))


async def test_gateway_process_notifies_systemd_and_stops_cleanly(
        fakes: tuple[FakeOpenAI, FakeTelegram, FakeDiscord], home: Path, workspace: Path, tmp_path: Path) -> None:
    llm, tg, dc = fakes
    write_config(home, workspace, llm, tg, dc)
    listener = NotifyListener()
    env = {**os.environ, "NANOBOT_HOME": str(home), "NOTIFY_SOCKET": listener.name,
           "WATCHDOG_USEC": "200000"}
    log = open(tmp_path / "gateway.log", "wb")
    # Started as under systemd: 1,024 open files at most, unless the process asks for the hard limit.
    soft_1024 = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
                 "(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
                 "os.execv(sys.executable, [sys.executable, '-m', 'nanobot', 'gateway'])")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", soft_1024, env=env,
                                                stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        await listener.wait_for("READY=1")
        soft, hard = open_files_limits(proc.pid)
        assert soft == hard or hard == "unlimited" and soft == "65536"  # a chat's history file is open while it is
        assert dc.identifies == 1 and "getUpdates" in tg.calls  # both channels were up at READY
        llm.script(reply("pong from the daemon"))
        tg.push_text(ALICE, ALICE, "ping")
        [sent] = await tg.wait_sent(1)
        assert sent["text"] == "pong from the daemon"
        await listener.wait_for("WATCHDOG=1")
        proc.send_signal(signal.SIGTERM)
        await listener.wait_for("STOPPING=1")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        listener.close()
        log.close()
    output = (tmp_path / "gateway.log").read_text()
    assert "Traceback" not in output, output
    loop = "asyncio" if importlib.util.find_spec("uvloop") is None else "uvloop"  # nanobot/eventloop.py
    assert f"event loop {loop}" in (home / "logs" / "nanobot.log").read_text()
    assert (home / "sessions" / f"telegram_{ALICE}.jsonl").exists()  # the history was flushed


def test_without_uvloop_the_gateway_loop_is_asyncios_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows, or `pip uninstall uvloop`: the same code runs on asyncio's loop."""
    from nanobot import eventloop

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    monkeypatch.setattr(eventloop, "uvloop", None)
    assert eventloop.run(loop_module()) == "asyncio"
    assert isinstance(eventloop.policy(), asyncio.DefaultEventLoopPolicy)
