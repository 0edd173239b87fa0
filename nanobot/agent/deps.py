"""What an agent is built from, and the per-chat tool context every turn and cron job starts with.

This module imports no other part of ``nanobot.agent``: the loop, the modes, code mode, memory
and commands all depend on it, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from nanobot.chat_names import parent_chat
from nanobot.trust import MEMBER, OwnerKeys, Trust, chat_scope, chat_trust, owner_chat
from nanobot.tools.registry import ToolContext

if TYPE_CHECKING:
    from nanobot.bus import Identity
    from nanobot.config import Config
    from nanobot.mcp.servers import McpServers
    from nanobot.providers.base import Provider
    from nanobot.sandbox.executor import CodeExecutor
    from nanobot.session import Histories
    from nanobot.tools.registry import ToolRegistry
    from nanobot.access import PairingStore
    from nanobot.bus import MessageBus
    from nanobot.cron.run_requests import RunRequests
    from nanobot.cron.store import CronStore
    from nanobot.database import Database
    from nanobot.notices import OwnerNotices
    from nanobot.tasks import TaskStore
    from nanobot.usage import UsageStore

PromptSection = Callable[[ToolContext], str]  # an extra system-prompt section, for one chat


@dataclass
class AgentDeps:
    """Everything an agent and its tools need, built once by the Runtime (the tools see it as
    ``nanobot.tools.services.Services``)."""

    config: Config
    provider: Provider
    tools: ToolRegistry
    sessions: Histories
    code: CodeExecutor  # runs the chat's programs (code and hybrid mode), checks a cron job's
    db: Database
    pairing: PairingStore
    tasks: TaskStore  # background tasks
    cron: CronStore  # the cron jobs (their rows are the schedule)
    cron_runs: RunRequests  # run_cron's: the gateway's cron clock runs what is asked for
    bus: MessageBus  # messages out (send_message, send_file) go onto it
    notices: OwnerNotices  # one short line to the owner chat(s)
    terminal: bool  # this process is the terminal chat (nanobot agent): it reaches no other chat
    usage: UsageStore  # every model call, its tokens and cost
    mcp: McpServers | None = None  # the configured MCP servers, if any (their tools are in the registry)
    api_owners: OwnerKeys = field(default_factory=OwnerKeys)  # owner API keys' names, kept current by the API
    system_extras: tuple[PromptSection, ...] = ()  # extra system-prompt sections (the skills list)

    async def announce(self, text: str) -> None:
        """Tell the owner, in one line (always logged; at most one message a minute)."""
        await self.notices.announce(text)

    async def owner_chat(self) -> str | None:
        """Where notices and the heartbeat go (``nanobot.trust.owner_chat``)."""
        return owner_chat(self.config, await self.pairing.owner_chats())

    def trust(self, session_key: str) -> Trust:
        """Whether a chat is the owner's or a member's (``nanobot.trust``)."""
        return chat_trust(self.config, session_key, self._peer(session_key), self.api_owners)

    def chat_context(self, session_key: str) -> ToolContext:
        """A fresh tool context for one turn (or cron run) of this chat: its trust and folder. A
        background task's turn acts for its chat (its trust, folder, "this chat"), with a
        Python state of its own."""
        trust, root = chat_scope(self.config, session_key, self._peer(session_key), self.api_owners)
        if trust == MEMBER:
            root.mkdir(parents=True, exist_ok=True)
        chat = parent_chat(session_key)
        return ToolContext(config=self.config, workspace=root, session_key=chat,
                           services=self, trust=trust, origin="task" if chat != session_key else "user",
                           state_key=session_key)

    def _peer(self, session_key: str) -> Identity | None:
        """The private peer the chat remembers (a task's chat is opened before the task runs)."""
        return self.sessions.get(parent_chat(session_key)).meta.peer
