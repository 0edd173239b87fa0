"""kill -9 of a real gateway process mid-turn on WhatsApp and Signal (Matrix: test_matrix.py),
then a restart: the message is answered once, and nothing the platform delivered twice is."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from tests.fakes.openai_server import FakeOpenAI, delayed
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.whatsapp_api import FakeWhatsApp
from tests.helpers import nanobot_process, until
from tests.test_api import port_to_listen_again
from tests.test_delivery_crash import echo

OWNER_NUMBER = "+15550002222"


def write_config(home: Path, workspace: Path, llm: FakeOpenAI, channel: str, section: dict[str, Any]) -> None:
    config = {
        "agents": {"defaults": {"workspace": str(workspace), "model": "fake-model", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "test-key", "apiBase": llm.base_url}},
        "channels": {channel: {**section, "enabled": True, "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}, "shutdownGraceSeconds": 1},
    }
    (home / "config.json").write_text(json.dumps(config))


@asynccontextmanager
async def gateway(home: Path, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A gateway process, once it says it is ready; killed (-9) on the way out if still running."""
    start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        async with nanobot_process("gateway", home=home, stdout=out, stderr=asyncio.subprocess.STDOUT) as proc:
            await until(lambda: "gateway ready" in log.read_bytes()[start:].decode(errors="replace")
                        or proc.returncode is not None, timeout=30)
            assert proc.returncode is None, log.read_text()[-2000:]
            yield proc


async def killed_mid_turn_then_answered_once(home: Path, log: Path, llm: FakeOpenAI,
                                             send: Callable[[str], Awaitable[Any]],
                                             replies: Callable[[], list[str]], wait: Callable[..., Awaitable[None]]) -> None:
    """``send`` a message; kill the gateway while the model is answering it; start it again:
    one reply, from the turn run again on the recorded message."""
    llm.fallback = lambda body: delayed(echo(body), 60)  # the kill lands mid-turn
    async with gateway(home, log) as proc:
        await send("hello")
        await asyncio.wait_for(llm.request_event.wait(), 20)
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    llm.fallback = echo
    async with gateway(home, log):
        await wait(lambda: len(replies()) >= 1, timeout=30)
        await send("after")
        await wait(lambda: len(replies()) >= 2, timeout=30)
    assert replies() == ["re: hello", "re: after"]


async def test_whatsapp_killed_mid_turn_answers_once(llm: FakeOpenAI, home: Path, workspace: Path,
                                                     tmp_path: Path) -> None:
    async with FakeWhatsApp() as wa:
        write_config(home, workspace, llm, "whatsapp", wa.section(port_to_listen_again(), allowFrom=["15550002222"]))

        async def send(text: str) -> None:
            assert await wa.deliver("15550002222", text) == 200  # recorded before the 200

        await killed_mid_turn_then_answered_once(home, tmp_path / "gw.log", llm, send, wa.texts, wa.wait_until)


async def test_signal_killed_mid_turn_answers_once(llm: FakeOpenAI, home: Path, workspace: Path,
                                                   tmp_path: Path) -> None:
    async with FakeSignalCli("+15550001111", tmp_path) as sig:
        write_config(home, workspace, llm, "signal", {"account": sig.account, "rpcUrl": sig.url,
                                                      "allowFrom": [OWNER_NUMBER]})

        async def send(text: str) -> None:
            sig.push(OWNER_NUMBER, text)

        await killed_mid_turn_then_answered_once(home, tmp_path / "gw.log", llm, send,
                                                 lambda: [s["message"] for s in sig.sent], sig.wait_until)
