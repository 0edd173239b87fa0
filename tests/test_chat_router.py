"""The chat router's instants that traffic hits only now and then (the first two seen in
test_pg_restart under load): a takeover that meets a wake-up's claim, a message handed on as its
chat is let go, and a chat given back as its next message is handed on. Each is made exact: a
row lock holds the sweep between its takeover and its taking the chat; the let-go comes in the
same step as the hand-over; the model's answer waits until the chat was given back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator

import asyncpg
import pytest

from nanobot.bus import InboundMessage, MessageBus, OutboundMessage
from nanobot.cluster.leases import ChatLeases
from nanobot.cluster.registry import MIGRATIONS, Registry
from nanobot.cluster.router import ChatRouter, GatewayHooks
from nanobot.delivery.store import DeliveryStore
from nanobot.postgres import PostgresDatabase
from nanobot.session_rows import DatabaseSessionStore
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import until
from tests.test_workers import asked, asks, echo, fast, texts, worker_config, workers  # noqa: F401  (fixtures)


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[PostgresDatabase]:
    db = await PostgresDatabase.open(pg_url)
    await db.migrate("workers", MIGRATIONS)
    yield db
    await db.close()


async def test_a_chat_taken_over_while_a_wake_up_claims_it_is_queued_once(db: PostgresDatabase, pg_url: str) -> None:
    """The sweep takes over two chats a dead worker left; while it adopts the first one's unsent
    reply, a wake-up claims the second (the claim finds the lease ours already). The sweep then
    took the second chat again: its unanswered messages were queued twice, and each ran twice."""
    dead = await DeliveryStore.open(db, worker="w0")  # w0 never joined: dead
    [first] = await dead.record_inbound([InboundMessage("telegram", "41", "41", "hi", delivery_key="a1")])
    assert await ChatLeases(db, "w0").claim("telegram:41")
    assert await dead.record_outbound(OutboundMessage("telegram", "41", "left by w0"), finishes=first)
    await dead.record_inbound([InboundMessage("telegram", "42", "42", text, delivery_key=f"b{n}")
                               for n, text in enumerate(["one", "two"])])  # nobody's lease
    await dead.close()
    line, blocker = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    store = await DeliveryStore.open(db, worker="w1")
    try:
        backend = await line.fetchrow("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        await Registry(db, "w1", 30.0).register((backend["pid"], backend["backend_start"]), 1, time.time(), "/w")
        bus = MessageBus()
        router = ChatRouter(ChatLeases(db, "w1"), store, bus, await DatabaseSessionStore.create(db),
                            GatewayHooks(resend=lambda replies: None, let_go=lambda chats: None), asyncio.Event())
        router.joined.set()
        async with blocker.transaction():  # holds the dead worker's reply: the sweep's adoption waits
            await blocker.execute("SELECT 1 FROM outbox WHERE chat_id = '41' FOR UPDATE")
            sweep = asyncio.create_task(router.sweep())
            await until(lambda: db.fetchval("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)"))
            wake_up = asyncio.create_task(router.pull("telegram:42", claim=True))
            await until(lambda: "telegram:42" in router.held)
        await asyncio.gather(sweep, wake_up)
        queued = [bus.inbound.get_nowait().content for _ in range(bus.inbound.qsize())]
        assert queued == ["one", "two"]  # ("hi" is answered: its reply waits to be sent)
    finally:
        await store.close()
        await line.close()
        await blocker.close()


async def test_a_message_handed_on_as_its_chat_is_let_go_does_not_run(
        llm, tg: FakeTelegram, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """The router hands a held chat's message to the dispatcher, and the line breaks before the
    dispatcher took it off the bus (the worker lets its chats go). It ran anyway, in a new turn
    for a chat another worker now held: that turn's history went into the shared history."""
    llm.fallback = echo
    async with workers([worker_config(llm, workspace, tg, pg_url, "w1", tmp_path)]) as gateways:
        gateway = gateways["w1"]
        tg.push_text(41, 41, "hello")
        await tg.wait_sent(1, timeout=30)
        asked = len(llm.requests)
        late = InboundMessage("telegram", "41", "41", "late", intake_id=10_000)
        await gateway.bus.publish_inbound(late)  # handed on (the dispatcher takes it next)...
        gateway.cluster.router.forget_all()  # ...and in the same step the line breaks
        await until(gateway.bus.inbound.empty)  # the dispatcher took it
        assert "telegram:41" not in gateway.dispatcher.workers
    assert len(llm.requests) == asked and texts(tg, 41) == ["re: hello"]


async def test_a_chat_going_quiet_as_a_message_is_handed_on_is_kept(
        llm, tg: FakeTelegram, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """A chat's worker went quiet (its queue empty for idleWorkerSeconds) just as the router
    handed it the chat's next message: the chat was given back all the same, as nothing was
    unanswered past what the router had handed on. The message's reply was then refused (the
    lease gone) and the message ran again, on whichever worker took the chat next."""
    given_back = asyncio.Event()

    async def answer(body: dict) -> dict:  # "again" is answered once the chat was given back, or kept
        if asked(body) == "again":
            await given_back.wait()
        return echo(body)

    llm.fallback = answer
    async with workers([worker_config(llm, workspace, tg, pg_url, "w1", tmp_path)]) as gateways:
        gateway = gateways["w1"]
        tg.push_text(41, 41, "hello")
        await tg.wait_sent(1, timeout=30)
        await gateway.intake.accept([InboundMessage("telegram", "41", "41", "again", is_private=True, delivery_key="again")])
        await gateway.cluster.router.release("telegram:41")  # the worker went quiet meanwhile
        given_back.set()
        await tg.wait_sent(2, timeout=30)
    assert asks(llm, "again") == 1
    assert texts(tg, 41) == ["re: hello", "re: again"]
