"""What the API, the page and the terminal socket may use of the gateway they serve.

A narrow interface, not the ``Gateway``: submitting goes through the internal channel they
add, and the rest is reading (histories, status, usage) and the owner's few levers (cron,
pairing). ``nanobot.gateway.app.Gateway`` implements it; nothing in ``nanobot.api`` imports
the gateway, so the API sits below it in the package order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nanobot.agent.loop import Agent
    from nanobot.channel_plugin import BaseChannel, ChannelContext
    from nanobot.config import Config
    from nanobot.database import Database
    from nanobot.health import Health
    from nanobot.notices import NoticeLog
    from nanobot.access import PairingStore
    from nanobot.cron.store import CronRun, CronStore
    from nanobot.session import Session
    from nanobot.trust import OwnerKeys
    from nanobot.usage import UsageStore


class FrontDoor(Protocol):
    config: Config
    home: Path
    db: Database
    cron: CronStore
    usage: UsageStore
    agent: Agent
    pairing: PairingStore
    notices: NoticeLog  # the owner's notices of the last 30 days, for the page's Status view
    api_owners: OwnerKeys  # the owner API keys' names, which the API keeps current (they decide a chat's trust)
    key_refresh_s: float  # how often the API reads the keys again (one added or revoked elsewhere)
    http_timeout_s: float | None  # a request's headers, or its body, taking longer ends it (nanobot.listener)
    keepalive_s: float  # a stream quiet this long gets a comment line, so no proxy takes it for dead

    # ---- turns --------------------------------------------------------------------------
    def channel_context(self) -> ChannelContext:
        """For an internal channel (the API's, the terminal's) to take messages in."""

    def add_internal_channel(self, channel: BaseChannel) -> None:
        """Route replies to ``channel``; it carries nothing but answers to its own requests."""

    def accepting(self) -> bool:
        """False once the gateway is shutting down (a new turn would be cut off)."""

    # ---- chats --------------------------------------------------------------------------
    async def open_chat(self, chat: str) -> Session:
        """The chat's history as it is now (among workers: as its holder last wrote it)."""

    async def chats(self, prefix: str, limit: int) -> list[str]:
        """The keys of chats starting with ``prefix``, the latest first."""

    async def chat_folder(self, chat: str) -> Path:
        """Where the chat's files are: the workspace for owner chats, its own folder for members."""

    def held_here(self, chat: str) -> bool:
        """Whether the chat's turns run here, and its messages come here: always alone on the store."""

    # ---- the owner's ----------------------------------------------------------------------
    async def status_lines(self) -> list[str]:
        """Channels, MCP servers, the shell, the database, tasks, disk (and workers)."""

    async def run_cron_now(self, job_id: str) -> CronRun:
        """Ask the cron clock for a run of the job now and wait for its record."""

    def health(self) -> Health:
        """What /readyz checks."""
