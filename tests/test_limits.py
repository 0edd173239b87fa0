"""The limits a chat cannot pass, through the real tool registry: messages per turn, the
workspace quota, cron jobs per chat and their minimum interval, run-record pruning, hard
links, and where write_file may create directories."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from nanobot.config import Config
from nanobot.cron.store import CronStore, utcnow
from nanobot.runtime import open_runtime
from nanobot.tools import paths
from nanobot.tools.builtin import default_registry
from nanobot.tools.registry import ToolContext
from nanobot.trust import OWNER
from tests.fakes.openai_server import FakeOpenAI
from tests.helpers import config_for


@pytest.fixture
def ctx(config: Config, workspace: Path) -> ToolContext:
    return ToolContext(config=config, workspace=workspace, session_key="telegram:42", trust=OWNER)


async def call(ctx: ToolContext, name: str, **args):
    return await default_registry(ctx.config).call(name, args, ctx)


async def test_messages_per_turn_are_capped(config: Config) -> None:
    config.gateway.max_messages_per_turn = 3
    config.providers["openai"].api_key = "unused"
    async with open_runtime(config) as rt:
        await rt.sessions.open("telegram:42")
        ctx = rt.chat_context("telegram:42")
        for i in range(3):
            await call(ctx, "send_message", content=f"m{i}")
        with pytest.raises(PermissionError, match="at most 3 messages per turn"):
            await call(ctx, "send_message", content="one too many")
        assert rt.bus.outbound.qsize() == 3


async def test_write_file_stays_within_the_workspace_quota(ctx: ToolContext, workspace: Path) -> None:
    ctx.config.tools.max_workspace_mb = 1
    (workspace / "existing.bin").write_bytes(b"x" * 600_000)
    await call(ctx, "write_file", path="small.txt", content="fine")
    with pytest.raises(PermissionError, match="workspace is full"):
        await call(ctx, "write_file", path="big.txt", content="y" * 500_000)
    assert not (workspace / "big.txt").exists()


async def test_a_members_shell_loop_is_stopped_at_the_workspace_quota(config: Config, workspace: Path) -> None:
    """RLIMIT_FSIZE bounds each file a command writes, not how many: a member's loop wrote past
    tools.maxWorkspaceMb until the disk the database is on was full. It is killed once the disk
    has lost the room the workspace had left (and a little)."""
    from nanobot.trust import MEMBER, chat_folder

    config.tools.max_workspace_mb = 16
    folder = chat_folder(workspace, "telegram:-100")
    folder.mkdir(parents=True)
    member = ToolContext(config=config, workspace=folder, session_key="telegram:-100", trust=MEMBER)
    loop = "i=0; while true; do head -c 1000000 /dev/zero > f$i; i=$((i+1)); sleep 0.01; done"
    with pytest.raises(PermissionError, match=r"wrote past the .* MiB the workspace had left \(tools.maxWorkspaceMb\)"):
        await call(member, "exec_command", command=loop, timeout=20)
    written = sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("f"))
    assert written < 256 * 2**20  # (other tests write to the same disk meanwhile: no exact figure)
    # Empty files fill a disk's inodes as surely: each counts as a block.
    with pytest.raises(PermissionError, match=r"tools.maxWorkspaceMb"):
        await call(member, "exec_command", command="mkdir e && cd e && seq 1 1000000 | xargs touch", timeout=20)
    assert len(os.listdir(folder / "e")) < 100_000


async def test_files_sent_to_a_terminal_or_api_chat_count_toward_the_quota(config: Config, workspace: Path) -> None:
    """A copy of each file sent to an API or terminal chat is kept in its folder (sent/) for its
    reader to fetch: 20 a turn, 10 MB each, were kept past tools.maxWorkspaceMb."""
    config.tools.max_workspace_mb = 1
    config.providers["openai"].api_key = "unused"
    (workspace / "report.bin").write_bytes(b"r" * 400_000)
    async with open_runtime(config) as rt:
        await rt.sessions.open("cli:default")
        ctx = rt.chat_context("cli:default")
        assert "sent to cli:default" in await call(ctx, "send_file", path="report.bin")
        with pytest.raises(PermissionError, match="the workspace is full"):
            await call(ctx, "send_file", path="report.bin")
        assert rt.bus.outbound.qsize() == 1


async def test_hard_links_are_not_read(ctx: ToolContext, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("CANARY")
    os.link(outside, workspace / "innocent.txt")
    with pytest.raises(PermissionError, match="hard links"):
        await call(ctx, "read_file", path="innocent.txt")


def test_parent_directories_are_made_only_beneath_the_workspace(workspace: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / "a").symlink_to(elsewhere)  # swapped in after the path was checked
    with pytest.raises(PermissionError, match="changed while it was being opened"):
        paths._walk_to(workspace / "a" / "b", workspace.resolve(), "a/b/x.txt", create=True)
    assert list(elsewhere.iterdir()) == []


async def test_cron_from_chat_has_a_minimum_interval_and_a_per_chat_cap(llm: FakeOpenAI, workspace: Path) -> None:
    config = config_for(llm.base_url, workspace)
    config.gateway.max_cron_jobs_per_chat = 2
    async with open_runtime(config) as rt:
        await rt.sessions.open("telegram:42")
        ctx = rt.chat_context("telegram:42")
        with pytest.raises(ValueError, match="at most once a minute"):
            await rt.tools.call("schedule_cron", {"expression": "every 30s", "code": "print(1)"}, ctx)
        for _ in range(2):
            await rt.tools.call("schedule_cron", {"expression": "every 60s", "code": "print(1)"}, ctx)
        with pytest.raises(PermissionError, match="2 scheduled jobs already"):
            await rt.tools.call("schedule_cron", {"expression": "every 1h", "code": "print(1)"}, ctx)
        await rt.sessions.open("telegram:43")
        other = rt.chat_context("telegram:43")  # another chat has its own allowance
        await rt.tools.call("schedule_cron", {"expression": "every 1h", "code": "print(1)"}, other)


async def test_old_run_records_are_pruned(home: Path) -> None:
    store = await CronStore.open(home / "nanobot.db")
    try:
        job = await store.add(name="j", owner_session="telegram:1", schedule_kind="every", expression="60",
                              timezone="UTC", payload_kind="code", payload="print(1)", deliver_to=None,
                              next_run_at=None)
        now = utcnow()
        await store.record_run(job.id, now - timedelta(days=40), 1, "ok")
        await store.record_run(job.id, now - timedelta(days=2), 1, "ok")
        await store.record_run(job.id, now, 1, "ok")
        assert len(await store.runs(job.id)) == 2
    finally:
        await store.close()
