"""A full disk, for real: the gateway's home is a small tmpfs (a user and mount namespace of its
own, ``unshare -rm``), filled up while it runs and emptied again. Skipped where the kernel or
the machine does not allow such namespaces."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanobot.delivery.intake import DISK_FULL_REPLY
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram

ALICE, BOB = 42, 77


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rm and tmpfs mounts in it")


def fill(path: Path) -> None:
    """Write zeros until the file system says it is full. Unbuffered: a last write that fits in
    part leaves nothing behind for close() to fail on (how much room there is depends on how
    large the gateway's own files grew)."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


async def _ready(log: Path) -> None:
    while "gateway ready" not in log.read_text():  # the log is the only sign: no Telegram call marks it
        await asyncio.sleep(0.05)


async def test_a_full_disk_is_said_once_a_minute_per_chat_and_nothing_is_lost(tmp_path: Path) -> None:
    home, etc, workspace = tmp_path / "tmpfs-home", tmp_path / "etc", tmp_path / "tmpfs-workspace"
    for folder in (home, etc, workspace):
        folder.mkdir()
    async with FakeOpenAI(fallback=lambda body: reply("re: " + body["messages"][-1]["content"])) as llm, \
            FakeTelegram() as tg:
        (etc / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(workspace), "model": "m", "executionMode": "tools"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                      "allowFrom": [str(ALICE), str(BOB)], "streaming": False}},
            "gateway": {"heartbeat": {"enabled": False}}}))
        script = f'mount -t tmpfs -o size=6m tmpfs "{home}" && exec "{sys.executable}" -m nanobot gateway'
        log = open(tmp_path / "gateway.log", "wb")
        proc = await asyncio.create_subprocess_exec(
            "unshare", "-rm", "sh", "-c", script, stdout=log, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "NANOBOT_HOME": str(home), "NANOBOT_CONFIG": str(etc / "config.json")})
        inside = Path(f"/proc/{proc.pid}/root") / str(home).lstrip("/")  # the gateway's view of its home
        try:
            await asyncio.wait_for(_ready(tmp_path / "gateway.log"), 30)
            await asyncio.to_thread(fill, inside / "filler")
            for text in ("one", "two"):
                tg.push_text(ALICE, ALICE, text)
            tg.push_text(BOB, BOB, "three", username="bob")
            await tg.wait_until(lambda: len(tg.sent) >= 2, timeout=15)
            await asyncio.sleep(1.0)  # polls go on failing: still one reply per chat
            assert sorted((m["chat_id"], m["text"]) for m in tg.sent) == [(ALICE, DISK_FULL_REPLY),
                                                                          (BOB, DISK_FULL_REPLY)]
            status = subprocess.run(["nsenter", "-t", str(proc.pid), "-U", "-m", "--preserve-credentials",
                                     sys.executable, "-m", "nanobot", "status"], capture_output=True, text=True,
                                    timeout=60, env={**os.environ, "NANOBOT_HOME": str(home),
                                                     "NANOBOT_CONFIG": str(etc / "config.json")})
            assert "Disk:      FULL" in status.stdout, status.stdout + status.stderr
            (inside / "filler").unlink()  # room again: the messages, kept by Telegram, are answered
            await tg.wait_until(lambda: len(tg.sent) >= 5, timeout=20)
        finally:
            proc.kill()
            await proc.wait()
    answers = [(m["chat_id"], m["text"]) for m in tg.sent[2:]]
    assert sorted(answers) == [(ALICE, "re: one"), (ALICE, "re: two"), (BOB, "re: three")]
