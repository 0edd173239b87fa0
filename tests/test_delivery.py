"""Durable delivery in-process: repeats dropped, replies kept through long outages, in order,
unfinished messages resumed at start. (Real crashes: tests/test_delivery_crash.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nanobot.channel_plugin import SendFailed
from nanobot.config import Config
from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.delivery.outbox import SendGate
from nanobot.sqlite_file import open_db
from nanobot.bus import OutboundMessage
from nanobot.gateway.dispatcher import RESUME_NOTICE
from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.http_proxy import HttpProxy
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import fast_pace, keep_discord_urls, running_gateway, telegram_gateway_config, kept_about, until
from tests.test_cli import nanobot

ALICE, BOB = 42, 77


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    cfg = telegram_gateway_config(llm.base_url, workspace, tg, ALICE, BOB)
    cfg.channels.telegram.streaming = False
    return cfg


def echo(body: dict) -> dict:
    """The model answers each message with its text, so replies can be matched to messages."""
    return reply("re: " + body["messages"][-1]["content"])


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in tg.sent if m["chat_id"] == chat]


async def test_an_update_delivered_again_is_answered_once(config: Config, llm: FakeOpenAI, tg: FakeTelegram,
                                                          home: Path) -> None:
    llm.fallback = echo
    tg.confirm_updates = False  # every poll returns the update again, as after a lost confirmation
    async with running_gateway(config) as gateway:
        tg.push_text(ALICE, ALICE, "once")
        await tg.wait_sent(1)
        await tg.wait_calls("getUpdates", tg.calls.count("getUpdates") + 5)  # five more deliveries of it
        intake = gateway.channels.ctx.intake
        assert intake.repeats >= 5
    assert texts(tg, ALICE) == ["re: once"] and len(llm.chat_requests) == 1


async def test_a_discord_message_dispatched_again_is_answered_once(config: Config, llm: FakeOpenAI,
                                                                   dc: FakeDiscord, monkeypatch: pytest.MonkeyPatch,
                                                                   home: Path) -> None:
    keep_discord_urls(monkeypatch)
    dc.connect(config, 9).streaming = config.channels.telegram.enabled = False
    llm.fallback = echo
    async with running_gateway(config):
        message = await dc.push_message(5, 9, "hello", username="friend")
        await dc.wait_sent(1)
        await dc._dispatch("MESSAGE_CREATE", message)  # a replay, as after a RESUME
        await dc.push_message(5, 9, "and then")
        await dc.wait_sent(2)
    assert [m["content"] for m in dc.sent] == ["re: hello", "re: and then"]
    assert len(llm.chat_requests) == 2


async def test_a_discord_message_sent_while_down_is_answered_once_after_the_start(
        config: Config, llm: FakeOpenAI, dc: FakeDiscord, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """A new Discord session replays nothing: a DM sent while the gateway was down is read from
    the chat's history at the next start, answered once, and not again at the start after."""
    keep_discord_urls(monkeypatch)
    dc.connect(config, 9).streaming = config.channels.telegram.enabled = False
    llm.fallback = echo
    async with running_gateway(config):
        await dc.push_message(5, 9, "one", username="friend")
        await dc.wait_sent(1)
    await dc.push_message(5, 9, "while you were away", username="friend", away=True)
    async with running_gateway(config):
        await dc.wait_sent(2)
    async with running_gateway(config):
        await dc.push_message(5, 9, "three", username="friend")
        await dc.wait_sent(3)
    assert [m["content"] for m in dc.sent] == ["re: one", "re: while you were away", "re: three"]


async def test_replies_wait_out_an_outage_longer_than_the_old_give_up(config: Config, llm: FakeOpenAI,
                                                                     tg: FakeTelegram) -> None:
    llm.fallback = echo
    async with running_gateway(config):
        await tg.wait_calls("getUpdates")
        tg.push_text(ALICE, ALICE, "first")
        tg.push_text(BOB, BOB, "hello")
        await llm.request_event.wait()
        tg.fail_all(calls=60)  # sends and polls fail: the old adapter gave up after 5 attempts
        tg.push_text(ALICE, ALICE, "second")
        await tg.wait_until(lambda: len(tg.sent) == 3 and tg.failed >= 60, timeout=20)
    assert texts(tg, ALICE) == ["re: first", "re: second"] and texts(tg, BOB) == ["re: hello"]


async def test_a_refused_message_is_not_retried_and_does_not_block_others(config: Config, llm: FakeOpenAI,
                                                                         tg: FakeTelegram, home: Path) -> None:
    llm.fallback = echo
    async with running_gateway(config) as gateway:
        await gateway.bus.publish_outbound(OutboundMessage("telegram", "not-a-chat", "hi"))  # Telegram: 400
        tg.push_text(ALICE, ALICE, "go")
        await tg.wait_sent(1)
    rows = await outbox_rows(home)
    assert ("not-a-chat", "failed") in rows and (str(ALICE), "sent") in rows
    assert texts(tg, ALICE) == ["re: go"]


async def test_unanswered_messages_are_resumed_at_start_in_order(config: Config, llm: FakeOpenAI,
                                                                 tg: FakeTelegram, home: Path) -> None:
    config.gateway.shutdown_grace_seconds = 0.2
    llm.fallback = lambda body: delayed(echo(body), 30)  # the model hangs: shut down mid-turn
    async with running_gateway(config):
        await tg.wait_calls("getUpdates")
        for text in ("one", "two", "three"):
            tg.push_text(ALICE, ALICE, text)
        await llm.request_event.wait()  # "one" is with the model; "two" and "three" wait in the queue
    assert texts(tg, ALICE) == [RESUME_NOTICE]  # nothing answered; everything on record
    code, out, _ = await nanobot("status", home=home)
    assert code == 0 and "Delivery:  3 messages not yet answered, 0 replies not yet sent, 0 refused" in out
    llm.fallback = echo
    async with running_gateway(config):
        await tg.wait_until(lambda: len(texts(tg, ALICE)) == 4, timeout=15)
    one, two, three = texts(tg, ALICE)[1:]
    assert one == f"re: {RESUMED_NOTE}"
    resumed = [r for r in llm.chat_requests if r["messages"][-1]["content"] == RESUMED_NOTE]
    assert [m["content"] for m in resumed[0]["messages"] if m["role"] == "user"] == ["one", RESUMED_NOTE]
    assert (two, three) == ("re: two", "re: three")
    assert await outbox_rows(home) == [(str(ALICE), "sent")] * 3  # the notice is not kept


async def test_a_reply_handed_over_again_while_on_its_way_is_sent_once(config: Config, tg: FakeTelegram) -> None:
    """A recorded reply handed to the outbound again while its send is still out (an adoption
    retried after an outage returns the worker's own unsent replies) goes out once."""
    async with running_gateway(config) as gateway:
        answered = tg.hold("sendMessage")
        await gateway.outbound.put(once := OutboundMessage("telegram", str(ALICE), "once"))
        await tg.wait_until(lambda: texts(tg, ALICE) == ["once"])  # sent, not yet answered
        pending = await gateway.outbound.store.pending_outbound()
        # Read back as after a restart, with the time of the first send: send ids are made of it.
        assert [(m.outbox_id, m.outbox_created) for m in pending] == [(once.outbox_id, once.outbox_created)]
        gateway.outbound.resend(pending)
        await gateway.outbound.put(OutboundMessage("telegram", str(ALICE), "after"))  # behind any repeat
        answered.set()
        await tg.wait_until(lambda: "after" in texts(tg, ALICE))
    assert texts(tg, ALICE) == ["once", "after"]


async def test_the_outbound_keeps_nothing_of_a_chat_once_its_sends_are_done(config: Config, tg: FakeTelegram) -> None:
    """Months of chats pass through a gateway (a stranger's pairing code makes one): what it
    keeps to order a chat's sends goes once they are out, whatever their kind."""
    chats = [str(900_000 + i) for i in range(20)]
    async with running_gateway(config) as gateway:
        for chat in chats:
            await gateway.bus.publish_outbound(OutboundMessage("telegram", chat, kind="typing"))
            await gateway.outbound.put(OutboundMessage("telegram", chat, "hello"))
        await tg.wait_until(lambda: sorted(str(m["chat_id"]) for m in tg.sent) == chats)
        await until(lambda: not gateway.outbound._inflight._tasks)
        assert kept_about(gateway.outbound, "90000") == []


# Two Telegram messages' worth: the platform shows it in two parts.
LONG_REPLY = "PART-ONE " + "x" * 3000 + "\n\nPART-TWO " + "y" * 3000


async def test_a_reply_whose_second_part_failed_goes_on_from_there(config: Config, llm: FakeOpenAI,
                                                                    tg: FakeTelegram, home: Path) -> None:
    """The Bot API fails a long reply's second part: the outbox's next attempt sends that part
    only, in the same run and after a restart (the progress is kept on the reply's row)."""
    refusals: asyncio.Queue[None] = asyncio.Queue()
    down = [True]

    def fails(path: str, body: bytes) -> bool:
        if down[0] and b"PART-TWO" in body:
            refusals.put_nowait(None)
            return True
        return False

    async def refused(times: int) -> None:
        for _ in range(times):
            await asyncio.wait_for(refusals.get(), 10)

    llm.script(reply(LONG_REPLY), reply("LATER " + LONG_REPLY))
    async with HttpProxy(tg.api_base, fails) as proxy:
        config.channels.telegram.api_base = proxy.url
        async with running_gateway(config, pace=fast_pace(drain_s=0.1)):  # stops with part two unsent
            tg.push_text(ALICE, ALICE, "a long one")
            await refused(2)  # so the first refusal's progress is recorded
        down[0] = False
        async with running_gateway(config):
            await tg.wait_until(lambda: len(texts(tg, ALICE)) == 2)
            while not refusals.empty():  # the first run's
                refusals.get_nowait()
            down[0] = True  # in one run: part two fails once, then goes
            tg.push_text(ALICE, ALICE, "another")
            await refused(1)
            down[0] = False
            await tg.wait_until(lambda: len(texts(tg, ALICE)) == 4)
    assert [text[:14] for text in texts(tg, ALICE)] == ["PART-ONE xxxxx", "PART-TWO yyyyy",
                                                       "LATER PART-ONE", "PART-TWO yyyyy"]
    assert await outbox_rows(home) == [(str(ALICE), "sent")] * 2


async def test_what_a_group_said_before_a_restart_comes_with_the_next_message_to_the_bot(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    llm.fallback = echo
    group = -100500
    async with running_gateway(config):
        tg.push_text(group, BOB, "the meeting moved to 5pm", chat_type="group", username="bob")
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_sent(1)  # so the group's message before it was taken in too
    async with running_gateway(config):
        tg.push_text(group, ALICE, "@nanobot_test_bot when is the meeting?", chat_type="group")
        await tg.wait_sent(2)
    assert llm.chat_requests[-1]["messages"][-1]["content"] == (
        "[said here since the last message to me:\n@bob: the meeting moved to 5pm]\nwhen is the meeting?")


async def outbox_rows(home: Path) -> list[tuple[str, str]]:
    conn = await open_db(home / "nanobot.db")
    try:
        async with conn.execute("SELECT chat_id, state FROM outbox ORDER BY id") as cur:
            return [tuple(r) for r in await cur.fetchall()]
    finally:
        await conn.close()


async def test_a_send_gate_probes_alone_while_down_and_lets_all_through_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate, calls, up = SendGate(first=0.2), [], False
    inflight, most = 0, 0

    async def send(name: str) -> None:
        nonlocal inflight, most
        calls.append(name)
        inflight += 1
        most = max(most, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        if not up:
            raise SendFailed("down", retry=True)

    with pytest.raises(SendFailed):
        await gate.attempt(lambda: send("first"))
    assert gate.down
    waiting = [asyncio.create_task(gate.attempt(lambda n=n: send(n))) for n in ("a", "b", "c")]
    await asyncio.sleep(0.02)
    assert calls == ["first"]  # nobody knocks before the probe's time
    up = True
    await asyncio.gather(*waiting)
    assert calls[1] == "a" and sorted(calls[2:]) == ["b", "c"] and not gate.down
    assert most == 2  # after the probe, b and c went together, not one behind the other
