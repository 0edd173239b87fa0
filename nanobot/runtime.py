"""Assembles the assistant for one process: database, stores, tools, provider and agent.

The CLI, the gateway and cron jobs all start from here, so each part is built one way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from nanobot.agent.deps import AgentDeps
from nanobot.agent.loop import Agent
from nanobot.bus import MessageBus, OutboundMessage, split_target
from nanobot.chat_names_legacy import rename_legacy_chats
from nanobot.config import Config, ConfigError
from nanobot.access import PairingStore
from nanobot.database import open_database
from nanobot.db import HomeError, check_writable
from nanobot.notices import OwnerNotices
from nanobot.providers.base import Provider
from nanobot.session import Histories, SessionStore
from nanobot.session_db import DatabaseSessionStore
from nanobot.skills import install_skills
from nanobot.tools.builtin import default_registry
from nanobot.sandbox.executor import CodeExecutor
from nanobot.tools.services import Services
from nanobot.trust import owner_chat
from nanobot.usage import UsageStore

if TYPE_CHECKING:
    from nanobot.cron.service import CronService, RunOutcome
    from nanobot.mcp.servers import McpServers

log = logging.getLogger(__name__)


def make_provider(config: Config) -> Provider:
    from nanobot.providers.router import make_router

    return make_router(config)


def workspace_ready(config: Config) -> None:
    """A missing workspace is created from the template (a fresh machine, a moved folder)."""
    from nanobot.workspace_template import copy_template

    workspace = config.workspace_path
    try:
        if not workspace.exists():
            copy_template(workspace)
            log.info("created the workspace %s from the template", workspace)
        workspace.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HomeError(f"workspace {workspace} cannot be created: {exc.strerror or exc}") from None


class SchedulerLink:
    """``run_cron``'s way to the cron scheduler, which only the gateway runs (it attaches it)."""

    def __init__(self) -> None:
        self.service: CronService | None = None

    async def run_now(self, job_id: str) -> RunOutcome:
        if self.service is None:
            raise RuntimeError("jobs run in the gateway (nanobot gateway), not in this terminal chat; to test a "
                               "code job here, run its code directly")
        return await self.service.run_now(job_id)


class Runtime:
    def __init__(self, config: Config, *, provider: Provider | None = None, bus: MessageBus | None = None,
                 home: Path | None = None) -> None:
        if home is not None:
            config.use_home(home)  # the workspace default and the tools' guards follow it
        self.config = config
        self.home = config.home
        self.bus = bus
        self._provider = provider
        self.notices = OwnerNotices(self._to_owner)

    async def __aenter__(self) -> "Runtime":
        workspace = self.config.workspace_path
        if workspace == self.home.resolve():
            raise ConfigError("agents.defaults.workspace: must not be the nanobot home itself")
        self.provider = self._provider or make_provider(self.config)  # a config problem shows before any I/O
        check_writable(self.home, "NANOBOT_HOME")
        workspace_ready(self.config)
        self.db = await open_database(self.config)
        try:
            self.usage = await UsageStore.create(self.db)
            pairing = await PairingStore.open(self.db)
        except BaseException:
            await self.db.close()  # aiosqlite's thread would otherwise keep the process alive
            raise
        on_files = self.db.engine == "sqlite"  # on PostgreSQL every piece of state is in the one database
        await rename_legacy_chats(self.db, self.home / "sessions" if on_files else None, workspace)
        self.sessions: Histories = SessionStore(self.home / "sessions")
        if not on_files:
            self.sessions = await DatabaseSessionStore.create(self.db)
        self.tools = default_registry(self.config)
        self.code = CodeExecutor(self.tools, self.db, self.usage)  # the sandbox starts on first use
        self.scheduler = SchedulerLink()
        self.mcp: McpServers | None = None
        if self.config.tools.mcp_servers:  # started by the gateway, or by the first turn
            from nanobot.mcp.servers import McpServers

            self.mcp = McpServers(self.config, self.tools, self.home / "logs")
        services = Services(db=self.db, sessions=self.sessions, pairing=pairing,
                            programs=self.code, scheduler=self.scheduler, announce=self.announce)
        self.deps = AgentDeps(config=self.config, provider=self.provider, tools=self.tools, sessions=self.sessions,
                              services=services, code=self.code, usage=self.usage, bus=self.bus, mcp=self.mcp)
        install_skills(self.deps.tools, self.deps.system_extras)  # read_skill and the skills list in the prompt
        self.agent = Agent(self.deps)
        return self

    async def announce(self, text: str) -> None:
        """Tell the owner, in one line, about a change that steers the assistant (always logged;
        at most one message a minute: ``OwnerNotices``)."""
        await self.notices.announce(text)

    async def _to_owner(self, text: str) -> None:
        target = owner_chat(self.config)
        if self.bus is None or target is None:
            return
        channel, chat_id = split_target(target)
        await self.bus.publish_outbound(OutboundMessage(channel, chat_id, text))

    async def __aexit__(self, *exc: object) -> None:
        await self.notices.close()
        await self.agent.close()  # memory consolidation still needs the provider and sessions
        if self.mcp is not None:
            await self.mcp.close()
        await self.sessions.flush()  # the database journal writes behind: wait for it
        self.sessions.close()
        await self.code.close()
        await self.provider.close()
        await self.db.close()
