"""Notices to the owner (a steering file changed, a new cron job, the budget is spent): at most
one message a minute. The first goes at once; what comes within the minute after it is sent as
one message at the minute's end ("3 new scheduled jobs: ..."), so 46 jobs made from 26 sessions
of a member key are one or two messages, not 46. Every notice is logged as it happens, and kept
for 30 days in ``owner_notices`` (``NoticeLog``), which the page's Status view shows: an owner
with no chat channel, on the page alone, reads them there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from nanobot.database import Database, Migrations
from nanobot.eventloop import cancel_and_wait
from nanobot.utf8 import without_bidi_controls

log = logging.getLogger(__name__)

NEW_JOB = "New scheduled job "  # how cron_tools starts its notice: batched ones are listed together
NOTICE_MAX = 300  # characters of one notice
KEEP_S = 30 * 86400  # how long a notice is kept for the page
MIGRATIONS: Migrations = {engine: ["""
CREATE TABLE owner_notices (at DOUBLE PRECISION NOT NULL, text TEXT NOT NULL);
CREATE INDEX owner_notices_at ON owner_notices (at);
"""] for engine in ("sqlite", "postgresql")}


class NoticeLog:
    """The notices of the last 30 days, for the page (a record the model never reads: they quote
    what members wrote)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    async def open(cls, db: Database) -> NoticeLog:
        await db.migrate("notices", MIGRATIONS)
        return cls(db)

    async def add(self, text: str) -> None:
        now = time.time()
        try:
            await self.db.execute("DELETE FROM owner_notices WHERE at < $1", now - KEEP_S)
            await self.db.execute("INSERT INTO owner_notices (at, text) VALUES ($1, $2)", now, text)
        except Exception as exc:  # a full disk, the database away: the notice still goes out and
            # is in the log, and what announced it (a job made, a file changed) stands
            log.warning("a notice was not kept for the page: %s", exc)

    async def latest(self, limit: int = 20) -> list[tuple[float, str]]:
        return [(row["at"], row["text"]) for row in await self.db.fetch(
            "SELECT at, text FROM owner_notices ORDER BY at DESC LIMIT $1", limit)]

    async def count_after(self, at: float) -> int:
        """How many came after ``at`` (a notice's, as ``latest`` gave it)."""
        [row] = await self.db.fetch("SELECT count(*) AS n FROM owner_notices WHERE at > $1", at)
        return int(row["n"])


class OwnerNotices:
    def __init__(self, send: Callable[[str], Awaitable[None]], kept: NoticeLog, *, interval_s: float = 60.0) -> None:
        self._send = send  # one message to the owner chat
        self.kept = kept
        self.interval_s = interval_s
        self._pending: list[str] = []
        self._quiet_until = 0.0
        self._later: asyncio.Task[None] | None = None

    async def announce(self, text: str) -> None:
        # One line, in the order written, whatever a member or stranger put in it (a job's name,
        # a display name): a notice must not grow lines that read as the assistant's own (a forged
        # "Approve: ..."), nor show the rest of its line reversed.
        text = " ".join(without_bidi_controls(text).split())
        text = text if len(text) <= NOTICE_MAX else text[:NOTICE_MAX - 1] + "…"
        log.warning("announced to the owner: %s", text)
        await self.kept.add(text)
        if not self._pending and time.monotonic() >= self._quiet_until:
            self._quiet_until = time.monotonic() + self.interval_s
            await self._send(f"🔔 {text}")
            return
        self._pending.append(text)
        if self._later is None:
            self._later = asyncio.create_task(self._flush_later(), name="owner notices")

    async def _flush_later(self) -> None:
        await asyncio.sleep(max(0.0, self._quiet_until - time.monotonic()))
        self._later = None
        await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._quiet_until = time.monotonic() + self.interval_s
            await self._send(batched(pending))

    async def close(self) -> None:
        """Send what waits now (shutdown: the gateway, before its last replies go out), rather
        than lose it."""
        await cancel_and_wait(self._later)
        self._later = None
        await self.flush()


def batched(notices: list[str]) -> str:
    if len(notices) == 1:
        return f"🔔 {notices[0]}"
    if all(n.startswith(NEW_JOB) for n in notices):
        return f"🔔 {len(notices)} new scheduled jobs:\n" + "\n".join(f"• {n.removeprefix(NEW_JOB)}" for n in notices)
    return f"🔔 {len(notices)} notices:\n" + "\n".join(f"• {n}" for n in notices)
