"""What a gateway asks of the other workers on its database, if there are any.

Some work must be done by one process at a time for the whole assistant: long-polling
Telegram (a second poller gets 409 Conflict), a Discord shard's connection, the cron clock.
Each such *singleton* is held under a name. Alone (SQLite, or no other worker) a gateway holds
every singleton at once and never loses one; on PostgreSQL the workers hold them with advisory
locks (``nanobot.cluster``), and a holder that dies or loses the database loses them, which
``Held.lost`` tells its user.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from nanobot.eventloop import cancel_and_wait

if TYPE_CHECKING:
    from nanobot.config import Gateway as GatewaySettings


def worker_id(settings: GatewaySettings) -> str:
    """This gateway's name among workers (``gateway.workerId``, else HOST:PID); also its
    metrics' ``worker`` label."""
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"


@dataclass(eq=False)
class Held:
    """A singleton this worker holds until ``lost`` is set (or it releases it)."""

    name: str
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Singletons(Protocol):
    async def try_hold(self, name: str) -> Held | None:
        """Hold ``name`` now if no other worker does; None if one does."""

    async def hold(self, name: str) -> Held:
        """Wait until this worker holds ``name`` (a holder that dies frees it)."""

    async def release(self, held: Held) -> None:
        """Let another worker have it (a normal stop)."""


class Alone:
    """The only gateway on its store: every singleton is ours, for good."""

    async def try_hold(self, name: str) -> Held | None:
        return Held(name)

    async def hold(self, name: str) -> Held:
        return Held(name)

    async def release(self, held: Held) -> None:
        return None


async def run_while_held(singletons: Singletons, held: Held, work: Awaitable[Any], *,
                         after: Callable[[], Awaitable[None]] | None = None) -> asyncio.Future[Any]:
    """Run ``work`` until it ends or ``held`` is lost, then stop it and run ``after`` (say, close
    a connection the next holder must not share). Unless it was lost, the singleton is then
    released for another worker, also when this is cancelled (a normal stop). The finished work."""
    task, lost = asyncio.ensure_future(work), asyncio.ensure_future(held.lost.wait())
    try:
        await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(task, lost)
        if after is not None:
            await after()
        if not held.lost.is_set():
            await asyncio.shield(singletons.release(held))
    return task
