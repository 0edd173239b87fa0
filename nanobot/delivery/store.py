"""The delivery tables.

Every write goes through one writer task that runs what is queued and commits once: under
load, one commit covers many messages; alone, a write waits for its own commit. ``put``
returns only after the commit, so "recorded" means in the database: safe from a crash of the
process (kill -9, OOM). Incoming messages are also synced to disk before Telegram is told.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any, Awaitable, Callable

import aiosqlite

from nanobot.bus import InboundMessage, OutboundMessage, OutgoingFile
from nanobot.db import migrate
from nanobot.periodic import Periodic

log = logging.getLogger(__name__)

MIGRATIONS = ["""
CREATE TABLE inbound (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    delivery_key TEXT NOT NULL,  -- the platform's id (Telegram update_id, Discord message id)
    message TEXT NOT NULL,  -- the InboundMessage as JSON
    done INTEGER NOT NULL DEFAULT 0,  -- 1 once its reply is in the outbox (or it needs none)
    received REAL NOT NULL,
    UNIQUE (channel, delivery_key)
);
CREATE INDEX inbound_open ON inbound (id) WHERE done = 0;
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    content TEXT NOT NULL,
    reply_to TEXT,
    metadata TEXT NOT NULL,
    file_name TEXT,
    file_data BLOB,
    photo INTEGER,
    state TEXT NOT NULL DEFAULT 'pending',  -- pending, sent, failed
    error TEXT,
    created REAL NOT NULL,
    finished REAL,
    finishes INTEGER  -- the inbound message this reply settles
);
CREATE INDEX outbox_pending ON outbox (id) WHERE state = 'pending';
-- In the same statement as the reply's INSERT, so no other commit on the connection can split them.
CREATE TRIGGER outbox_finishes AFTER INSERT ON outbox WHEN NEW.finishes IS NOT NULL
BEGIN
    UPDATE inbound SET done = 1 WHERE id = NEW.finishes;
END;
"""]

SLOW_BATCH_S = 0.25  # a batch slower than this is logged: replies wait for their marks meanwhile
KEEP_DONE_S = 3 * 86400  # Telegram keeps unconfirmed updates for 24 h: repeats are caught well past that

Op = Callable[[aiosqlite.Connection], Awaitable[Any]]


class DeliveryStore:
    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        self.conn = conn
        self.path = path  # the database file ("" in memory)
        self._queue: asyncio.Queue[tuple[Op, asyncio.Future[Any]]] = asyncio.Queue()
        self._marks: list[tuple[str, str | None, float, int]] = []  # outbox marks not yet written
        self._marks_done: asyncio.Future[Any] | None = None
        self._writer = asyncio.create_task(self._write_loop(), name="delivery writer")

    @classmethod
    async def open(cls, conn: aiosqlite.Connection) -> DeliveryStore:
        """On the runtime's connection: a second one to the same file would contend for the
        write lock with it (SQLite has one writer) and gain nothing."""
        await migrate(conn, "delivery", MIGRATIONS)
        async with conn.execute("PRAGMA database_list") as cur:
            path = next((row[2] for row in await cur.fetchall() if row[1] == "main"), "")
        return cls(conn, path)

    async def close(self) -> None:
        """Write what is queued (the last marks), then close."""
        if not self._writer.done():
            try:
                await asyncio.wait_for(self.put(_nothing), timeout=5)  # FIFO: everything before it is committed
            except Exception as exc:
                log.warning("delivery store: could not flush at close: %s", exc)
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)

    async def put(self, op: Op) -> Any:
        """Run ``op`` in the next batch; return its value once the batch is committed."""
        return await self.submit(op)

    def submit(self, op: Op) -> asyncio.Future[Any]:
        """Queue ``op`` now (in order with every other write); the future is its value, committed."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((op, done))
        return done

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            # Marks first, in a commit of their own: until a sent reply's mark is written, a
            # crash would send it again.
            marks = [item for item in batch if item[0] == self._write_marks]
            for part in (marks, [item for item in batch if item[0] != self._write_marks]):
                if part:
                    await self._commit(part)

    async def _commit(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        results: list[Any] = []
        started = time.monotonic()
        try:
            for op, _ in batch:
                results.append(await op(self.conn))
            await self.conn.commit()
        except Exception as exc:
            await self.conn.rollback()
            log.error("delivery store: a write failed: %s", exc)
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        if time.monotonic() - started > SLOW_BATCH_S:
            log.warning("delivery store: %d writes took %.0f ms", len(batch), (time.monotonic() - started) * 1000)
        for (_, done), value in zip(batch, results):
            if not done.done():
                done.set_result(value)

    # ---- inbound -----------------------------------------------------------------------
    async def record_inbound(self, messages: list[InboundMessage]) -> list[int | None]:
        """Store messages (one commit); each gets its row id, or None if it was stored before."""
        async def op(conn: aiosqlite.Connection) -> list[int | None]:
            ids: list[int | None] = []
            now = time.time()
            for msg in messages:
                cur = await conn.execute(
                    "INSERT OR IGNORE INTO inbound (channel, delivery_key, message, received) VALUES (?, ?, ?, ?)",
                    (msg.channel, msg.metadata["delivery_key"], _inbound_json(msg), now))
                ids.append(cur.lastrowid if cur.rowcount == 1 else None)
            return ids

        ids = await self.put(op)
        # The platform is told next that it may forget these: they must survive a power cut too,
        # which synchronous=NORMAL (kept for every other write) does not promise; so sync the WAL.
        await asyncio.to_thread(_sync_wal, self.path)
        return ids

    async def finish_inbound(self, intake_id: int) -> None:
        await self.put(lambda conn: conn.execute("UPDATE inbound SET done = 1 WHERE id = ?", (intake_id,)))

    async def unfinished_inbound(self) -> list[InboundMessage]:
        async with self.conn.execute("SELECT id, message FROM inbound WHERE done = 0 ORDER BY id") as cur:
            rows = await cur.fetchall()
        return [_inbound_from(row["id"], row["message"]) for row in rows]

    # ---- outbox ------------------------------------------------------------------------
    async def record_outbound(self, msg: OutboundMessage, finishes: int | None) -> int:
        """Store a reply to send, and in the same commit mark the message it answers as done."""
        async def op(conn: aiosqlite.Connection) -> int:
            file = msg.file
            cur = await conn.execute(  # one statement: the trigger settles ``finishes`` with it
                "INSERT INTO outbox (channel, chat_id, kind, content, reply_to, metadata, file_name, file_data, "
                "photo, created, finishes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (msg.channel, msg.chat_id, msg.kind, msg.content, msg.reply_to, _metadata_json(msg.metadata),
                 file.name if file else None, file.data if file else None, int(file.photo) if file else None,
                 time.time(), finishes))
            return cur.lastrowid

        return await self.put(op)

    def mark_outbound(self, outbox_id: int, state: str, error: str | None = None) -> asyncio.Future[Any]:
        """Queued at once; all marks waiting are written with one statement in the next batch.
        Until then a crash sends that message again, so marks must not wait behind much."""
        first = not self._marks
        self._marks.append((state, error, time.time(), outbox_id))
        if first:
            self._marks_done = self.submit(self._write_marks)
        return self._marks_done

    async def _write_marks(self, conn: aiosqlite.Connection) -> None:
        marks, self._marks = self._marks, []
        await conn.executemany("UPDATE outbox SET state = ?, error = ?, finished = ? WHERE id = ?", marks)

    async def pending_outbound(self) -> list[OutboundMessage]:
        async with self.conn.execute("SELECT * FROM outbox WHERE state = 'pending' ORDER BY id") as cur:
            rows = await cur.fetchall()
        return [_outbound_from(row) for row in rows]

    async def backlog(self) -> tuple[int, int, int]:
        """(messages not yet answered, replies not yet sent, replies refused) for ``status``."""
        counts = []
        for sql in ("SELECT count(*) FROM inbound WHERE done = 0",
                    "SELECT count(*) FROM outbox WHERE state = 'pending'",
                    "SELECT count(*) FROM outbox WHERE state = 'failed'"):
            async with self.conn.execute(sql) as cur:
                counts.append((await cur.fetchone())[0])
        return counts[0], counts[1], counts[2]

    async def prune(self, now: float | None = None) -> None:
        """Forget what is long finished (the tables would otherwise grow for months)."""
        cutoff = (now or time.time()) - KEEP_DONE_S

        async def op(conn: aiosqlite.Connection) -> None:
            await conn.execute("DELETE FROM inbound WHERE done = 1 AND received < ?", (cutoff,))
            await conn.execute("DELETE FROM outbox WHERE state != 'pending' AND finished < ?", (cutoff,))

        await self.put(op)


def _sync_wal(path: str) -> None:
    if not path:
        return
    try:
        fd = os.open(f"{path}-wal", os.O_RDONLY)
    except FileNotFoundError:  # checkpointed away: the data is in the main file, synced by SQLite
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Pruner(Periodic):
    """Prunes the delivery tables every few hours, for the months the daemon runs."""

    name = "delivery pruner"
    tick_first = True

    def __init__(self, store: DeliveryStore, interval: float = 6 * 3600) -> None:
        super().__init__(interval)
        self.store = store

    async def tick(self) -> None:
        await self.store.prune()


async def _nothing(conn: aiosqlite.Connection) -> None:
    return None


def _inbound_json(msg: InboundMessage) -> str:
    data = asdict(msg)
    data.pop("received_at")
    data["metadata"] = {k: v for k, v in msg.metadata.items() if _jsonable(v)}
    return json.dumps(data)


def _inbound_from(row_id: int, text: str) -> InboundMessage:
    msg = InboundMessage(**json.loads(text))
    msg.metadata["intake_id"] = row_id
    return msg


def _metadata_json(metadata: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in metadata.items() if _jsonable(v)})


def _outbound_from(row: Any) -> OutboundMessage:
    file = OutgoingFile(row["file_name"], row["file_data"], bool(row["photo"])) if row["file_name"] else None
    metadata = json.loads(row["metadata"])
    metadata.pop("stream_id", None)  # the streamed message of before the restart is not ours to edit
    metadata["outbox_id"], metadata["outbox_created"] = row["id"], row["created"]
    return OutboundMessage(row["channel"], row["chat_id"], row["content"], kind=row["kind"],
                           reply_to=row["reply_to"], metadata=metadata, file=file)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
