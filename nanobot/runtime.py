"""Assembles the assistant for one process: database, stores, tools, provider and agent.

The CLI, the gateway and cron jobs all start from here, so each part is built one way.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from nanobot.agent.deps import AgentDeps
from nanobot.agent.loop import Agent
from nanobot.bus import MessageBus, OutboundMessage, split_target
from nanobot import collector
from nanobot.chat_names_legacy import rename_legacy_chats
from nanobot.config import Config, ConfigError
from nanobot.cron.run_requests import RunRequests
from nanobot.cron.store import CronStore
from nanobot.access import PairingStore
from nanobot.database import open_database
from nanobot.coordination import worker_id
from nanobot.eventloop import Changed
from nanobot.sqlite_file import HomeError, check_writable
from nanobot.notices import NoticeLog, OwnerNotices
from nanobot.providers.base import Provider
from nanobot.session import Histories
from nanobot.session_files import SessionStore
from nanobot.session_rows import DatabaseSessionStore
from nanobot.skills import read_skill, skills_prompt
from nanobot.tools.builtin import default_registry
from nanobot.sandbox.executor import CodeExecutor
from nanobot.trust import owner_chat
from nanobot.tasks import TaskStore
from nanobot.usage import UsageStore

if TYPE_CHECKING:
    from nanobot.database import Database

log = logging.getLogger(__name__)


def make_provider(config: Config, changed: Changed | None = None) -> Provider:
    from nanobot.providers.router import make_router

    return make_router(config, changed)


def workspace_ready(config: Config) -> bool:
    """A missing workspace is created from the template (a fresh machine, a moved folder);
    whether it was (a worker must not take a fresh one for the assistant's)."""
    from nanobot.workspace_template import copy_template

    workspace = config.workspace_path
    try:
        created = not workspace.exists()
        if created:
            copy_template(workspace)
            log.info("created the workspace %s from the template", workspace)
        workspace.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HomeError(f"workspace {workspace} cannot be created: {exc.strerror or exc}") from None
    return created


@dataclass(kw_only=True)
class Runtime(AgentDeps):
    """The process's one assembly: the parts an agent and its tools use (``AgentDeps``), the
    agent built on them, and what this process is; started, and whole when built
    (``open_runtime`` builds it)."""

    shared: bool  # the store is PostgreSQL: this process may be one worker of several
    workspace_created: bool  # this start made the workspace from the template (it was missing)
    status_changed: Changed  # set when a provider's cooldown or an MCP server's state changes
    agent: Agent = field(init=False)

    def __post_init__(self) -> None:
        self.agent = Agent(self)

    @property
    def home(self) -> Path:
        return self.config.home


@asynccontextmanager
async def open_runtime(config: Config, *, provider: Provider | None = None, terminal: bool = False,
                       home: Path | None = None) -> AsyncIterator[Runtime]:
    """The composition root of one process: checks the home and workspace, opens the configured
    store (SQLite with JSONL histories, or PostgreSQL for everything), and builds the parts in
    the order they need each other; closes them in reverse. ``terminal``: this process is the
    terminal chat (``nanobot agent``), which reaches no other chat."""
    if home is not None:
        config.use_home(home)  # the workspace default and the tools' guards follow it
    if config.workspace_path == config.home.resolve():
        raise ConfigError("agents.defaults.workspace: must not be the nanobot home itself")
    status_changed = Changed()  # a provider's cooldown, an MCP server's state: the gateway's state file
    provider = provider or make_provider(config, status_changed)  # a config problem shows before any I/O
    check_writable(config.home, "NANOBOT_HOME")
    created = workspace_ready(config)
    db = await open_database(config)
    try:
        rt = await _build(config, provider, terminal, db, created, status_changed)
    except BaseException:
        await db.close()  # aiosqlite's thread would otherwise keep the process alive
        raise
    collector.started()  # the program is built
    try:
        yield rt
    finally:
        await _close(rt)


async def _build(config: Config, provider: Provider, terminal: bool, db: Database,
                 workspace_created: bool, status_changed: Changed) -> Runtime:
    bus = MessageBus()
    usage = await UsageStore.create(db)
    pairing = await PairingStore.open(db)
    tasks, cron = await TaskStore.open(db), await CronStore.open(db)
    shared = db.engine == "postgresql"  # then every piece of state is in the one database
    sessions_dir = config.home / "sessions"
    await rename_legacy_chats(db, None if shared else sessions_dir, config.workspace_path)
    # A gateway on PostgreSQL is a worker: its histories are fenced by its chats' leases (created
    # when it joins, before its first turn).
    fenced_by = None if terminal else worker_id(config.gateway)
    sessions: Histories = await DatabaseSessionStore.create(db, fenced_by=fenced_by) if shared \
        else SessionStore(sessions_dir)
    tools = default_registry(config)
    tools.register(read_skill)
    code = CodeExecutor(tools, db, usage)  # the sandbox starts on first use
    cron_runs = RunRequests(cron)
    mcp = None
    if config.tools.mcp_servers:  # started by the gateway, or by the first turn
        from nanobot.mcp.servers import McpServers

        mcp = McpServers(config, tools, config.home / "logs", status_changed)
    notices = OwnerNotices(partial(_to_owner, config, pairing, None if terminal else bus), await NoticeLog.open(db))
    return Runtime(config=config, provider=provider, tools=tools, sessions=sessions, code=code, db=db,
                   pairing=pairing, tasks=tasks, cron=cron, cron_runs=cron_runs, bus=bus, notices=notices,
                   terminal=terminal, usage=usage, mcp=mcp, system_extras=(skills_prompt,), shared=shared,
                   workspace_created=workspace_created, status_changed=status_changed)


async def _to_owner(config: Config, pairing: PairingStore, bus: MessageBus | None, text: str) -> None:
    """Into the owner's chat; the terminal chat's process (no ``bus`` here) reaches none but its own."""
    if bus is None or (target := owner_chat(config, await pairing.owner_chats(), notices=True)) is None:
        return
    channel, chat_id = split_target(target)
    await bus.publish_outbound(OutboundMessage(channel, chat_id, text))


async def _close(rt: Runtime) -> None:
    await rt.notices.close()
    await rt.agent.close()  # memory consolidation still needs the provider and sessions
    if rt.mcp is not None:
        await rt.mcp.close()
    await rt.sessions.flush()  # the database journal writes behind: wait for it
    rt.sessions.close()
    await rt.code.close()
    await rt.provider.close()
    await rt.db.close()
