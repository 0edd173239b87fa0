"""kill -9 of a real gateway process at the worst moments, then a restart: every accepted
message is answered exactly once, in order per chat (a reply the platform took just before
the kill, unmarked, may go out once more). The stand-ins hold their answers at the right
moment, so the kill lands where it should, not by luck."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable

import pytest

from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.gateway.dispatcher import GAVE_UP_REPLY, MAX_TURN_STARTS
from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TWO_PARTS, nanobot_process

ALICE, BOB = 42, 77


@pytest.fixture
async def fakes(home: Path, workspace: Path) -> AsyncIterator[tuple[FakeOpenAI, FakeTelegram]]:
    """The stand-ins, a gateway config pointing at them, and a model that echoes."""
    async with FakeOpenAI() as llm, FakeTelegram() as tg:
        write_config(home, workspace, llm, tg)
        llm.fallback = echo
        yield llm, tg


def echo(body: dict) -> dict:
    """Answers the last message the user wrote (a resumed turn ends with a note, not a repeat)."""
    asked = [m["content"] for m in body["messages"] if m["role"] == "user" and m["content"] != RESUMED_NOTE]
    return reply("re: " + asked[-1].split("\n")[-1])


def texts(tg: FakeTelegram, chat: int = ALICE) -> list[str]:
    return [m["text"] for m in tg.sent if m["chat_id"] == chat]


def write_config(home: Path, workspace: Path, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    config = {
        "agents": {"defaults": {"workspace": str(workspace), "model": "fake-model", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "test-key", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": [str(ALICE), str(BOB)], "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}, "shutdownGraceSeconds": 1},
    }
    (home / "config.json").write_text(json.dumps(config))


@asynccontextmanager
async def gateway(home: Path, tg: FakeTelegram, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A gateway process, polling; killed (-9) on the way out if the test has not done so."""
    polls = tg.calls.count("getUpdates")
    with open(log, "ab") as out:
        async with nanobot_process("gateway", home=home, stdout=out, stderr=asyncio.subprocess.STDOUT) as proc:
            await tg.wait_until(lambda: tg.calls.count("getUpdates") > polls or proc.returncode is not None, 20)
            assert proc.returncode is None, log.read_text()[-2000:]
            yield proc


async def restart_until(home: Path, tg: FakeTelegram, log: Path, done: Callable[[], bool]) -> None:
    """A fresh gateway runs until ``done()``, then 0.3 s more, in which nothing else may come."""
    async with gateway(home, tg, log):
        await tg.wait_until(done, timeout=20)
        await asyncio.sleep(0.3)


async def kill(proc: asyncio.subprocess.Process) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


@asynccontextmanager
async def killed_while_held(tg: FakeTelegram, proc: asyncio.subprocess.Process, method: str,
                            when: Callable[[dict], bool] = lambda params: True) -> AsyncIterator[None]:
    """The stand-in does ``method``'s work (of the calls ``when`` picks) but holds its answer;
    once the gateway waits on one, it is killed, and the stand-in answers freely again."""
    release = tg.hold(method, when)
    yield  # the test sends what leads to the held call
    await tg.wait_until(lambda: tg.holding.get(method, 0) >= 1, timeout=15)
    await kill(proc)
    del tg.held[method]
    release.set()


async def test_killed_mid_turn_the_message_is_resumed_and_answered_once(
        fakes: tuple[FakeOpenAI, FakeTelegram], home: Path, tmp_path: Path) -> None:
    llm, tg = fakes
    llm.fallback = lambda body: delayed(echo(body), 60)  # the model is slow: the kill lands mid-turn
    tg.confirm_updates = False  # and Telegram will deliver the message again after the restart
    async with gateway(home, tg, tmp_path / "gw.log") as proc:
        tg.push_text(ALICE, ALICE, "hello")
        await asyncio.wait_for(llm.request_event.wait(), 15)
        await kill(proc)
    tg.push_text(ALICE, ALICE, "sent while it was down")
    tg.push_text(BOB, BOB, "me too")
    tg.confirm_updates = True
    llm.fallback = echo
    await restart_until(home, tg, tmp_path / "gw.log", lambda: len(tg.sent) == 3)
    assert texts(tg) == ["re: hello", "re: sent while it was down"] and texts(tg, BOB) == ["re: me too"]
    resumed = [r for r in llm.chat_requests if RESUMED_NOTE in r["messages"][-1]["content"]]
    assert len(resumed) == 1 and resumed[0]["messages"][-1]["content"] == RESUMED_NOTE
    asked = [m["content"] for m in resumed[0]["messages"] if m["role"] == "user"]
    assert asked == ["hello", RESUMED_NOTE]  # the recorded message, once, then the note
    lines = [json.loads(line) for line in (home / "sessions" / f"telegram_{ALICE}.jsonl").read_text().splitlines()]
    assert [m["content"] for m in lines if m.get("role") == "user"] == ["hello", RESUMED_NOTE,
                                                                         "sent while it was down"]


async def test_a_message_the_process_dies_in_every_time_is_given_up(
        fakes: tuple[FakeOpenAI, FakeTelegram], home: Path, tmp_path: Path) -> None:
    """A message whose turn kills the daemon (a parser's crash, the watchdog) would be resumed at
    every start for ever, a model call each time: after MAX_TURN_STARTS it is answered that it
    was given up, and the chat goes on."""
    llm, tg = fakes
    llm.fallback = lambda body: delayed(echo(body), 60)
    tg.confirm_updates = False
    tg.push_text(ALICE, ALICE, "the deadly one")
    for start in range(MAX_TURN_STARTS):
        async with gateway(home, tg, tmp_path / "gw.log") as proc:
            await tg.wait_until(lambda: len(llm.chat_requests) > start, 15)
            await kill(proc)
    tg.confirm_updates = True
    llm.fallback = echo
    tg.push_text(ALICE, ALICE, "and this one?")
    await restart_until(home, tg, tmp_path / "gw.log", lambda: len(tg.sent) == 2)
    assert texts(tg) == [GAVE_UP_REPLY.format(starts=MAX_TURN_STARTS), "re: and this one?"]
    assert len(llm.chat_requests) == MAX_TURN_STARTS + 1  # not run again, then the next message


async def test_killed_between_send_and_mark_at_most_that_reply_repeats(
        fakes: tuple[FakeOpenAI, FakeTelegram], home: Path, tmp_path: Path) -> None:
    llm, tg = fakes
    async with gateway(home, tg, tmp_path / "gw.log") as proc:
        async with killed_while_held(tg, proc, "sendMessage"):  # Telegram takes the reply; no answer comes
            tg.push_text(ALICE, ALICE, "one")
    tg.push_text(ALICE, ALICE, "two")
    await restart_until(home, tg, tmp_path / "gw.log", lambda: "re: two" in texts(tg))
    assert texts(tg) == ["re: one", "re: one", "re: two"]  # the one unmarked reply, once more; nothing else
    assert len(llm.chat_requests) == 2  # the turn itself did not run again


async def test_killed_between_the_parts_of_a_long_reply_only_the_part_under_way_repeats(
        fakes: tuple[FakeOpenAI, FakeTelegram], home: Path, tmp_path: Path) -> None:
    """A reply Telegram shows as two messages; the kill lands while part two is on its way
    (Telegram took it, its answer is held). After the restart part two goes again; part one,
    which went before, does not (it did: the progress was written only when a part failed)."""
    llm, tg = fakes
    llm.fallback = lambda body: reply(TWO_PARTS)
    async with gateway(home, tg, tmp_path / "gw.log") as proc:
        async with killed_while_held(tg, proc, "sendMessage", lambda params: "B-PART" in str(params.get("text"))):
            tg.push_text(ALICE, ALICE, "a long one")
    await restart_until(home, tg, tmp_path / "gw.log", lambda: len(texts(tg)) == 3)
    assert [text[:6] for text in texts(tg)] == ["A-PART", "B-PART", "B-PART"]


async def test_killed_during_intake_nothing_is_lost(
        fakes: tuple[FakeOpenAI, FakeTelegram], home: Path, tmp_path: Path) -> None:
    llm, tg = fakes
    async with gateway(home, tg, tmp_path / "gw.log") as proc:
        async with killed_while_held(tg, proc, "getFile"):  # the download hangs: the batch is not stored yet
            tg.push_document(ALICE, ALICE, b"meeting notes", "notes.txt", caption="read this")
            tg.push_text(ALICE, ALICE, "and then this")
    await restart_until(home, tg, tmp_path / "gw.log", lambda: len(texts(tg)) == 2)
    first, second = texts(tg)
    assert first.startswith("re: ") and "meeting notes" in llm.chat_requests[0]["messages"][-1]["content"]
    assert second == "re: and then this" and len(llm.chat_requests) == 2
