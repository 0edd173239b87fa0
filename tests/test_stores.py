"""Each store through its public interface, on both engines: the home's SQLite file and a real
PostgreSQL. The same calls must give the same answers."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import AsyncIterator

import pytest

from nanobot.access import PairingPolicy, PairingStore
from nanobot.bus import InboundMessage, OutboundMessage, OutgoingFile
from nanobot.cron.store import CronStore, utcnow
from nanobot.database import Database, SqliteDatabase
from nanobot.delivery.store import DeliveryStore
from nanobot.postgres import PostgresDatabase
from nanobot.session_rows import DatabaseSessionStore
from nanobot.usage import MIGRATIONS as USAGE, UsageStore
from tests.fakes.postgres import create_database, drop_database


@pytest.fixture(params=["sqlite", "postgresql"])
async def db(request: pytest.FixtureRequest, home: Path, pg_server: str) -> AsyncIterator[Database]:
    url = await create_database(pg_server) if request.param == "postgresql" else ""
    database = await PostgresDatabase.open(url) if url else await SqliteDatabase.open(home / "nanobot.db")
    yield database
    await database.close()
    if url:
        await drop_database(pg_server, url)


async def test_usage_totals(db: Database) -> None:
    usage = await UsageStore.create(db)
    await usage.record_call("telegram:1", "code", "m", 100, 20, provider="openai", cost=0.5)
    await usage.record_call("telegram:2", "code", "m", 0, 0, outcome="error", provider="openai")
    await usage.record_execution("telegram:1", "code", 12, 3, "ok")
    await usage.record_execution("telegram:1", "code", 7.5, 0, "TimeoutError")
    totals = (await usage.totals())["code"]
    assert (totals.model_calls, totals.failed_calls, totals.prompt_tokens, totals.completion_tokens) == (2, 1, 100, 20)
    assert (totals.executions, totals.failures, totals.cost_usd) == (2, 1, 0.5)
    assert (await usage.totals("telegram:2"))["code"].model_calls == 1
    assert (await usage.by_model())["openai/m"].model_calls == 2 and await usage.cost_since(0) == 0.5


async def test_usage_totals_count_what_an_older_nanobot_recorded(db: Database) -> None:
    """The bot's all-time totals are kept as calls are recorded; a home written before they were
    has its calls counted once, when it is opened."""
    older = {engine: steps[:-1] for engine, steps in USAGE.items()}
    await db.migrate("usage", older)
    before = UsageStore(db)
    await before.record_call("telegram:1", "code", "m", 100, 20, provider="openai", cost=0.25)
    await before.record_execution("telegram:1", "code", 12, 3, "ok")
    usage = await UsageStore.create(db)
    await usage.record_call("telegram:2", "tools", "m", 10, 2, provider="openai", cost=0.5, member=True, cached_tokens=8)
    await usage.record_call("telegram:2", "tools", "m", 0, 0, outcome="error", provider="openai")
    await usage.record_execution("telegram:2", "code", 7.5, 0, "TimeoutError")
    totals = await usage.totals()
    assert {mode: (t.model_calls, t.failed_calls, t.prompt_tokens, t.cached_tokens, t.executions, t.failures)
            for mode, t in totals.items()} == {"code": (1, 0, 100, 0, 2, 1), "tools": (2, 1, 10, 8, 0, 0)}
    assert (await usage.by_model())["openai/m"].model_calls == 3
    assert (await usage.cost_since(0), await usage.cost_since(0, members=True)) == (0.75, 0.5)
    assert (await usage.totals("telegram:2"))["tools"].model_calls == 2  # one chat's: its own rows


async def test_pairing(db: Database) -> None:
    store = await PairingStore.open(db, PairingPolicy(max_pending=2))
    code = await store.request("telegram", "7", "ann")
    assert code and await store.request("telegram", "7", "ann") is None  # not resent within the interval
    both = await asyncio.gather(store.request("discord", "8", None), store.request("discord", "8", None))
    assert sum(c is not None for c in both) == 1  # the same stranger at once: one code
    assert [r.sender_id for r in await store.pending()] == ["7", "8"]
    user = await store.approve(code.lower())
    assert user.sender_name == "ann" and await store.is_paired("telegram", "7")
    assert [u.sender_id for u in await store.unwelcomed()] == ["7"]
    await store.mark_welcomed(user)
    assert await store.unwelcomed() == [] and [u.sender_id for u in await store.paired()] == ["7"]
    denied = await store.deny([r for r in await store.pending() if r.sender_id == "8"][0].code)
    assert denied.channel == "discord" and await store.request("discord", "8", None) is None
    assert await store.revoke("telegram", "7") and not await store.revoke("telegram", "7")
    with pytest.raises(ValueError, match="no pending pairing code"):
        await store.approve("NOPE1234")


async def test_cron_store(db: Database) -> None:
    store = await CronStore.open(db)
    job = await store.add(name="n", owner_session="telegram:1", schedule_kind="every", expression="60",
                          timezone="UTC", payload_kind="code", payload="print(1)")
    assert [j.id for j in await store.list("telegram:1")] == [job.id]
    assert await store.set_enabled(job.id, False) and not (await store.get(job.id)).enabled
    assert await store.request_run(job.id) and (await store.get(job.id)).run_requested
    started = utcnow()
    after = await store.record_run(job.id, started, 12, "error", "boom", 2)
    assert after.last_status == "error" and after.consecutive_failures == 1
    await store.record_run(job.id, started + timedelta(seconds=1), 3, "ok")
    assert (await store.get(job.id)).consecutive_failures == 0
    assert [r.status for r in await store.runs(job.id)] == ["ok", "error"]
    await store.set_first_runs([(job.id, started)])
    assert (await store.get(job.id)).next_run_at == started
    assert await store.remove(job.id) and await store.get(job.id) is None



async def test_the_envelope_keeps_its_typed_fields_and_never_a_waiting_caller(db: Database) -> None:
    """What the layers share is typed and recorded; a caller's future travels with the message
    and is never stored; rows written when these lived in a ``metadata`` object read the same."""
    store = await DeliveryStore.open(db)
    try:
        waiting = asyncio.get_running_loop().create_future()
        thread = {"subject": "tea", "message_id": "<m1@example.org>", "references": ""}
        msg = InboundMessage("email", "bob@example.org", "bob@example.org", "tea?", source="user", delivery_key="m1",
                             durations={"inbox/a.ogg": 3.5}, untrusted="a forwarded message", reply_context=thread,
                             mode="tools", resumed=True, intake_id=99, reply_future=waiting)
        [row_id] = await store.record_inbound([msg])
        await db.execute("INSERT INTO inbound (channel, delivery_key, message, received, chat) VALUES "
                         "($1, $2, $3, $4, $5)", "telegram", "old", '{"channel": "telegram", "chat_id": "1", '
                         '"sender_id": "cron:j1", "content": "old", "metadata": {"delivery_key": "old", '
                         '"reply_context": {"a": "b"}, "mode": "code", "intake_id": 3}}', 0.0, "telegram:1")
        back, old = await store.unfinished_inbound()
        assert (back.intake_id, back.delivery_key, back.durations, back.untrusted, back.reply_context, back.mode) == \
            (row_id, "m1", {"inbox/a.ogg": 3.5}, "a forwarded message", thread, "tools")
        assert back.reply_future is None and not back.resumed
        assert (old.delivery_key, old.reply_context, old.mode, old.source) == ("old", {"a": "b"}, "code", "cron")
        reply = OutboundMessage("email", "bob@example.org", "at four", stream_id=7, turn_reply=True, reply_context=thread,
                                offer=("/mode code", "/mode default"))
        reply_id = await store.record_outbound(reply, finishes=row_id)
        [pending] = await store.pending_outbound()
        assert (pending.outbox_id, pending.reply_context, pending.offer, pending.stream_id, pending.turn_reply) == \
            (reply_id, thread, reply.offer, None, False)  # the stream of before a restart is not ours to edit
    finally:
        await store.close()

async def test_delivery(db: Database) -> None:
    store = await DeliveryStore.open(db)
    try:
        messages = [InboundMessage("telegram", "1", "1", text, delivery_key=key)
                    for text, key in (("a", 10), ("b", 11), ("a again", 10))]
        first, second, repeat = await store.record_inbound(messages)
        assert first and second and repeat is None  # the platform delivered 10 twice
        assert [m.content for m in await store.unfinished_inbound()] == ["a", "b"]
        reply_id = await store.record_outbound(OutboundMessage("telegram", "1", "re: a"), finishes=first)
        photo = await store.record_outbound(OutboundMessage("telegram", "1", "cap", kind="file",
                                                            file=OutgoingFile("p.png", b"\x89PNG", True)), None)
        assert [m.content for m in await store.unfinished_inbound()] == ["b"]  # settled with its reply
        await store.mark_outbound(reply_id, "sent")
        [pending] = await store.pending_outbound()
        assert pending.outbox_id == photo and pending.file.data == b"\x89PNG" and pending.file.photo
        assert await store.backlog() == (1, 1, 0)
        await store.finish_inbound(second)
        await store.prune(now=10**12)
        assert await store.backlog() == (0, 1, 0)  # the pending reply is never pruned
    finally:
        await store.close()


async def test_a_long_history_in_a_table_opened_at_once_is_one_session(db: Database) -> None:
    """Years of a chat are read off the event loop, as the files are (tests/test_session.py
    times that), so two tasks may open it at once: they share one session."""
    store = await DatabaseSessionStore.create(db)
    record = json.dumps({"role": "user", "content": "a line of an old conversation " * 4})
    await db.executemany("INSERT INTO history (session_key, record) VALUES ($1, $2)",
                         [("telegram:7", json.dumps({"_meta": {"key": "telegram:7"}}))] + [("telegram:7", record)] * 20_000)
    first, second = await asyncio.gather(store.open("telegram:7"), store.open("telegram:7"))
    assert first is second is store.get("telegram:7") and first.count == 20_000


async def test_histories_in_a_table(db: Database) -> None:
    """The database journal on either engine (PostgreSQL uses it; SQLite keeps JSONL files)."""
    store = await DatabaseSessionStore.create(db)
    session = await store.open("telegram:9")
    session.append({"role": "user", "content": "hi"})
    session.set_meta(mode="tools")
    session.append({"role": "assistant", "content": "hello"})
    session.append({"role": "user", "content": "no answer came"})
    session.mark_failed()
    await store.flush()
    again = await DatabaseSessionStore(db).open("telegram:9")
    assert [m["content"] for m in again.messages] == ["hi", "hello", "no answer came"] and again.meta.mode == "tools"
    assert [m["content"] for m in again.history(10)] == ["hi", "hello"]  # kept for the reader, not the model
    assert await store.exists("telegram:9") and not await store.exists("telegram:10")
    assert (await store.records("telegram:9"))[0]["_meta"]["key"] == "telegram:9"
    with pytest.raises(RuntimeError, match="before it was opened"):
        DatabaseSessionStore(db).get("telegram:9")
