"""Chat leases: a chat's turns run on one worker at a time, the one whose row holds it.

A lease is claimed with an upsert that succeeds only where there is none or its holder is
dead (not in ``live_workers``); two workers claiming at once are ordered by the primary key,
so exactly one wins. Leases of dead workers are taken over in bulk with ``FOR UPDATE SKIP
LOCKED``: workers sweeping at the same moment split them instead of queueing on each other.
A holder gives a chat back when it goes quiet, so chats spread over the workers over time.
The rule for replies whose sender died (``_DEAD_WRITER``) lives here too: the chat's next
holder adopts and sends them. A sender still alive sends its own; the next holder's replies
wait for them (``unsent_elsewhere``), so a chat that moves keeps its order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nanobot.delivery.rows import outbound_from

if TYPE_CHECKING:
    from nanobot.bus import OutboundMessage
    from nanobot.database import Queries
    from nanobot.delivery.store import DeliveryStore
    from nanobot.postgres import PostgresDatabase

log = logging.getLogger(__name__)

# A reply row whose sender is gone: it is sent by the chat's next holder.
_DEAD_WRITER = "worker IS NULL OR worker NOT IN (SELECT id FROM live_workers)"

SWEEP_LIMIT = 200  # chats taken over per sweep (the next sweep takes more)


class ChatLeases:
    def __init__(self, db: PostgresDatabase, worker_id: str) -> None:
        self.db, self.id = db, worker_id
        self.may_fence = True  # false once the server refused it (another role's worker)

    async def claim(self, chat: str, *, only_with_work: bool = False) -> bool:
        """Hold ``chat`` if nobody alive does (or we do already); ``only_with_work``: only if it
        has an unanswered message (a wake-up is a hint anyone may send, not a reason to hold)."""
        return await self.db.fetchval(
            "INSERT INTO chat_leases AS l (chat, worker, since) SELECT $1, $2, nanobot_now() "
            "WHERE NOT $3::boolean OR EXISTS (SELECT 1 FROM inbound WHERE chat = $1 AND done = 0) "
            "ON CONFLICT (chat) DO UPDATE SET worker = excluded.worker, since = excluded.since "
            "WHERE l.worker = excluded.worker OR l.worker NOT IN (SELECT id FROM live_workers) RETURNING chat",
            chat, self.id, only_with_work) is not None

    async def release(self, chat: str) -> None:
        """Give the chat up; the other workers hear it is free (``nanobot_free``)."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM chat_leases WHERE chat = $1 AND worker = $2", chat, self.id)
            await tx.execute("SELECT pg_notify('nanobot_free', $1)", chat)

    async def release_all(self) -> None:
        """Give up every chat we held (we rejoined after a broken line: they are not ours)."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM chat_leases WHERE worker = $1", self.id)
            await tx.execute("SELECT pg_notify('nanobot_free', '*')")

    async def fence(self) -> int:
        """Cut the line of every worker whose heartbeat lapsed but whose connection lives on (a
        frozen process, a hung host): its singletons are freed, and if it wakes up it finds
        itself cut off and stops its turns before rejoining. How many were cut."""
        if not self.may_fence:
            return 0
        try:
            return len(await self.db.fetch(
                "SELECT pg_terminate_backend(w.backend_pid) FROM workers w JOIN pg_stat_activity a "
                "ON a.pid = w.backend_pid AND a.backend_start = w.backend_start WHERE w.expires < nanobot_now()"))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42501":  # insufficient_privilege: workers under other roles
                raise
            self.may_fence = False
            log.warning("workers run as other database roles, so a frozen worker cannot be cut off: its "
                        "singletons (Telegram polling, ...) move only once its connection drops. Run every "
                        "worker as one role (database.url), or grant it pg_signal_backend")
            return 0

    async def live_workers(self) -> list[str]:
        return [row["id"] for row in await self.db.fetch("SELECT id FROM live_workers ORDER BY id")]

    async def orphaned(self) -> list[str]:
        """Chats with work nobody alive holds: unanswered messages, or replies whose sender
        died; and chats we hold where a dead worker left replies unsent."""
        rows = await self.db.fetch(
            "WITH work AS (SELECT chat FROM inbound WHERE done = 0 "
            f"  UNION SELECT channel || ':' || chat_id FROM outbox WHERE state = 'pending' AND ({_DEAD_WRITER})) "
            "SELECT DISTINCT work.chat FROM work LEFT JOIN chat_leases l ON l.chat = work.chat "
            "WHERE l.chat IS NULL OR l.worker = $1 AND EXISTS (SELECT 1 FROM outbox WHERE state = 'pending' "
            f"  AND channel || ':' || chat_id = work.chat AND ({_DEAD_WRITER})) "
            "OR l.worker NOT IN (SELECT id FROM live_workers) LIMIT $2", self.id, SWEEP_LIMIT)
        return [row["chat"] for row in rows]

    async def adopt_replies(self, chat: str, delivery: DeliveryStore) -> list[OutboundMessage]:
        """A chat we hold: its unsent replies whose sender is gone, now ours to send, in order
        (written through the delivery store's queue, in order with its other writes)."""
        async def op(tx: Queries, again: bool) -> list[Any]:
            # Run again: the replies the lost commit adopted are ours already, and nobody else
            # sends them while we live.
            ours = "worker = $1 OR " if again else ""
            return await tx.fetch(
                "UPDATE outbox SET worker = $1 WHERE state = 'pending' AND channel || ':' || chat_id = $2 "
                f"AND ({ours}{_DEAD_WRITER}) RETURNING *", self.id, chat)

        rows = sorted(await delivery.put_retried(op), key=lambda row: row["id"])
        return [outbound_from(row) for row in rows]

    async def unsent_elsewhere(self, chat: str) -> bool:
        """Whether another live worker has replies in ``chat`` it recorded and has not sent yet
        (one slowed by a platform's rate limit, or whose marks waited out a database restart)."""
        return bool(await self.db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE state = 'pending' AND channel || ':' || chat_id = $1 "
            "AND worker <> $2 AND worker IN (SELECT id FROM live_workers))", chat, self.id))

    async def take_over(self, chats: list[str]) -> list[str]:
        """Of ``chats``, those we now hold: unleased ones, and dead workers' leases."""
        async with self.db.transaction() as tx:
            taken = await tx.fetch(
                "WITH lapsed AS (SELECT chat FROM chat_leases WHERE chat = ANY($1::text[]) "
                "  AND worker NOT IN (SELECT id FROM live_workers) FOR UPDATE SKIP LOCKED) "
                "UPDATE chat_leases l SET worker = $2, since = nanobot_now() FROM lapsed "
                "WHERE l.chat = lapsed.chat RETURNING l.chat", chats, self.id)
            fresh = await tx.fetch(
                "INSERT INTO chat_leases (chat, worker, since) SELECT c, $2, nanobot_now() FROM unnest($1::text[]) c "
                "ON CONFLICT (chat) DO NOTHING RETURNING chat", chats, self.id)
        return [row["chat"] for row in (*taken, *fresh)]
