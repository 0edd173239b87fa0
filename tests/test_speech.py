"""Spoken replies end to end: a voice note in gets the text reply, then a voice note out, through
the real gateway, the stand-in Telegram and the scripted model (which serves /audio/speech with
a small real OGG/Opus file). The API's part is in test_api (the voice note in the answer's
``nanobot`` field)."""

from __future__ import annotations

import logging

import pytest

from nanobot.config import Config, Price
from nanobot.media.speech import CODE_SAID, spoken_text
from nanobot.usage import start_of_today
from tests.fakes.openai_server import FakeOpenAI, error, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import running_gateway
from tests.media_files import ogg_opus
from tests.test_media import ALICE, BOB, fast, config as media_config  # noqa: F401  (fixtures)


@pytest.fixture
def config(media_config: Config) -> Config:
    """test_media's gateway (Telegram, transcription on), speaking too."""
    media_config.tools.speech.provider = "openai"  # the scripted server answers /audio/speech too
    return media_config


def test_status_says_whether_voice_notes_are_heard_and_replies_spoken() -> None:
    from nanobot.cli.status import voice_line

    config = Config()
    assert voice_line(config) == "voice notes not transcribed (tools.transcription); replies not spoken (tools.speech)"
    config.tools.transcription.provider = config.tools.speech.provider = "openai"
    assert voice_line(config) == ("voice notes transcribed (openai/whisper-1); replies spoken to a voice note "
                                  "(openai/gpt-4o-mini-tts, voice alloy; /voice per chat)")


def test_what_is_spoken_is_the_words_without_markers_or_code() -> None:
    markdown = ("# Plan\n\nRun **this** and see `ls`:\n\n```sh\nrm -rf /tmp/x\n```\n\n```py\nprint(1)\n```\n\n"
                "- one\n- [two](https://example.org)\n\n> quoted *words*")
    assert spoken_text(markdown) == f"Plan\nRun this and see ls:\n{CODE_SAID}\none\ntwo\nquoted words"
    # A table row by row, its cells apart ("Code modeyesno" before)
    assert spoken_text("| Feature | A |\n|---|---|\n| Code mode | yes |") == "Feature, A\nCode mode, yes"


async def test_a_voice_note_gets_the_text_then_a_voice_note(config: Config, llm: FakeOpenAI,
                                                            tg: FakeTelegram) -> None:
    """Not a failed turn's reply: its words are for reading ("HTTP 400: ..."), and it was spoken."""
    llm.transcripts.extend(["hello?", "what is on today"])
    llm.script(error(400, message="the model is overloaded"),
               reply("**Nothing** today.\n\n```\ncalendar.list()\n```"))
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, b"OggS-in", duration=2)
        [failed] = await tg.wait_sent(1, timeout=15)
        tg.push_voice(ALICE, ALICE, b"OggS-in", duration=3)
        text = (await tg.wait_sent(2, timeout=15))[1]
        await tg.wait_until(lambda: tg.files, timeout=15)
    assert failed["text"].startswith("Sorry, I could not get an answer from the model")
    [voice] = tg.files
    assert voice["method"] == "voice" and voice["data"] == ogg_opus() and voice["filename"] == "reply.ogg"
    assert text["message_id"] < voice["message_id"]  # the text first
    [asked] = llm.speech_requests
    assert asked == {"model": "gpt-4o-mini-tts", "voice": "alloy", "input": f"Nothing today.\n{CODE_SAID}",
                     "response_format": "opus"}


async def test_text_in_gets_text_only_and_voice_sets_it_per_chat(config: Config, llm: FakeOpenAI,
                                                                 tg: FakeTelegram) -> None:
    llm.fallback = lambda body: reply("fine")
    llm.transcripts.extend(["first", "second"])
    async with running_gateway(config):
        tg.push_text(ALICE, ALICE, "hello")
        await tg.wait_sent(1, timeout=15)
        tg.push_text(ALICE, ALICE, "/voice always")
        await tg.wait_sent(2, timeout=15)
        tg.push_text(ALICE, ALICE, "typed")
        await tg.wait_until(lambda: len(tg.files) == 1, timeout=15)
        tg.push_text(ALICE, ALICE, "/voice never")
        await tg.wait_sent(4, timeout=15)
        tg.push_voice(ALICE, ALICE, b"OggS-in")
        await tg.wait_sent(5, timeout=15)
        tg.push_text(ALICE, ALICE, "/voice")
        shown = (await tg.wait_sent(6, timeout=15))[5]
        tg.push_text(ALICE, ALICE, "/voice default")
        reset = (await tg.wait_sent(7, timeout=15))[6]
    assert [s["text"] for s in tg.sent[1:4:2]] == ["Voice set to always for this chat.",
                                                   "Voice set to never for this chat."]
    assert shown["text"].startswith("Voice: never")
    assert reset["text"] == "Voice reset to the configured default for this chat: whenVoice (tools.speech.reply)."
    assert len(tg.files) == 1 and [r["input"] for r in llm.speech_requests] == ["fine"]


def not_spoken(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nanobot.gateway.spoken"]


async def test_a_failing_speech_server_leaves_the_text_reply(config: Config, llm: FakeOpenAI, tg: FakeTelegram,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """And a reply past maxChars is not spoken: its text goes, with one log line."""
    config.tools.speech.max_chars = 20
    llm.transcripts.extend(["hi", "tell me more"])
    llm.speeches.append(error(500, message="the voice broke"))
    llm.script(reply("Hello there."), reply("A reply much longer than twenty characters."))
    caplog.set_level(logging.INFO, logger="nanobot.gateway.spoken")
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, b"OggS-in")
        [text] = await tg.wait_sent(1, timeout=15)
        await tg.wait_until(lambda: not_spoken(caplog), timeout=15)
        tg.push_voice(ALICE, ALICE, b"OggS-in")
        await tg.wait_until(lambda: len(not_spoken(caplog)) == 2, timeout=15)
    assert text["text"] == "Hello there." and len(tg.sent) == 2 and tg.files == []
    failed, too_long = not_spoken(caplog)
    assert "the reply was not spoken" in failed and "the voice broke" in failed
    assert "not spoken: 43 characters (tools.speech.maxChars: 20)" in too_long
    assert len(llm.speech_requests) == 1


async def test_a_member_chats_speech_counts_toward_the_members_budget(config: Config, llm: FakeOpenAI,
                                                                      tg: FakeTelegram,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    config.providers["openai"].prices = {"gpt-4o-mini-tts": Price(input_chars=1_000_000.0)}  # $1 a character
    config.agents.defaults.daily_budget_usd = 100.0  # members together: half of it
    config.tools.speech.reply = "always"
    caplog.set_level(logging.INFO, logger="nanobot.gateway.spoken")
    llm.fallback = lambda body: reply("0123456789")
    async with running_gateway(config) as gateway:
        tg.push_text(BOB, BOB, "hi")
        await tg.wait_until(lambda: tg.files, timeout=15)
        usage, since = gateway.runtime.usage, start_of_today(config.agents.defaults.timezone)
        members, everyone = await usage.cost_since(since, members=True), await usage.cost_since(since)
        llm.fallback = lambda body: reply("x" * 60)  # $60 of speech: past what members have left
        tg.push_text(BOB, BOB, "and again")
        await tg.wait_until(lambda: not_spoken(caplog), timeout=15)
    assert members == everyone == 10.0
    assert len(tg.files) == 1 and len(tg.sent) == 2
    assert "budget for member chats is spent" in not_spoken(caplog)[0]
