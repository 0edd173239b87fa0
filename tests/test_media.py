"""Media end to end: voice notes, photos and documents in, files out, through the real gateway
with the stand-in Telegram and Discord servers and the scripted model (which also serves
/audio/transcriptions)."""

from __future__ import annotations

import base64
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import aiohttp

from nanobot.config import Config, TelegramWebhook
from nanobot.media.images import with_images
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, error, reply, tool_call
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import fast_pace, keep_discord_urls, running_gateway, telegram_gateway_config
from tests.test_cli import nanobot
from tests.test_workers import free_port, post_update
from nanobot.media.isolation import ParseLimits, Unreadable, failure_marker, parse_file
from tests.media_files import (adts_aac, decoded_audio, docx, docx_inflating_to, encoded_audio, jpeg, ogg_opus,
                               pdf_with_text, png, png_claiming, scanned_pdf)

ALICE, BOB, GROUP = 42, 77, -100500
FRIEND, DM = 4242, 5


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_discord_urls(monkeypatch)


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> Config:
    cfg = telegram_gateway_config(llm.base_url, workspace, tg, ALICE, BOB)
    cfg.channels.telegram.owners = [str(ALICE)]
    cfg.channels.telegram.streaming = False
    cfg.tools.transcription.provider = "openai"  # the scripted server answers /audio/transcriptions too
    return cfg


def user_message(request: dict[str, Any]) -> dict[str, Any]:
    return [m for m in request["messages"] if m["role"] == "user"][-1]


def image_parts(request: dict[str, Any]) -> list[str]:
    """The data URLs of every image part in a request."""
    return [part["image_url"]["url"] for m in request["messages"] if isinstance(m["content"], list)
            for part in m["content"] if part["type"] == "image_url"]


def history(home: Path, key: str) -> str:
    return (home / "sessions" / f"{key.replace(':', '_')}.jsonl").read_text()


# ---- voice ----------------------------------------------------------------------------------

async def test_a_voice_note_is_answered_from_its_transcript(config: Config, llm: FakeOpenAI,
                                                             tg: FakeTelegram, home: Path) -> None:
    config.tools.transcription.language = "de"
    llm.transcripts.append("what is on my calendar today")
    llm.script(reply("Nothing today."))
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, b"OggS-fake-opus", duration=4)
        [sent] = await tg.wait_sent(1, timeout=15)
    assert sent["text"] == "Nothing today."
    [heard] = llm.transcriptions
    assert heard["data"] == b"OggS-fake-opus" and heard["model"] == "whisper-1" and heard["language"] == "de"
    assert heard["filename"].endswith("voice.ogg")
    assert user_message(llm.chat_requests[0])["content"] == "[voice] what is on my calendar today"
    assert "[voice] what is on my calendar today" in history(home, f"telegram:{ALICE}")


async def test_without_transcription_the_bot_says_once_how_to_enable_it(config: Config, llm: FakeOpenAI,
                                                                         tg: FakeTelegram) -> None:
    config.tools.transcription.provider = ""
    config.tools.speech.provider = "openai"  # a voice note in is answered aloud too (whenVoice), but not the hint
    llm.script(reply("I cannot listen to that one either; please type it."))
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, b"first")
        [hint] = await tg.wait_sent(1, timeout=15)
        tg.push_voice(ALICE, ALICE, b"second")
        await tg.wait_sent(2, timeout=15)
        await tg.wait_until(lambda: len(tg.files) == 1, timeout=15)
    assert [r["input"] for r in llm.speech_requests] == ["I cannot listen to that one either; please type it."]
    assert "transcription" in hint["text"] and '"provider": "openai"' in hint["text"]
    assert len(llm.chat_requests) == 1 and llm.transcriptions == []  # the hint cost no model call
    assert "not transcribed, voice transcription is off" in user_message(llm.chat_requests[0])["content"]
    assert "transcription" not in tg.sent[1]["text"]  # said once per chat


async def test_a_voice_note_counts_toward_usage_and_the_budgets(config: Config, llm: FakeOpenAI,
                                                                tg: FakeTelegram) -> None:
    """Transcription is paid for by the minute (prices.<model>.inputMinutes): it counts toward
    usage and the daily budgets, a member's toward the members' share, checked before the
    upload. It was in neither: a member could have it transcribe past any budget."""
    from nanobot.config import Price
    from nanobot.usage import start_of_today

    config.providers["openai"].prices = {"whisper-1": Price(input_minutes=6.0)}  # $6 a minute
    config.agents.defaults.daily_budget_usd = 20.0  # member chats together: half of it, $10
    llm.transcripts.append("the first one")
    llm.fallback = lambda body: reply("ok")
    async with running_gateway(config) as gateway:
        tg.push_voice(BOB, BOB, b"one", duration=60)  # $6
        await tg.wait_sent(1, timeout=15)
        tg.push_voice(BOB, BOB, b"two", duration=60)  # $6 more: past the members' $10
        refused = (await tg.wait_sent(2, timeout=15))[1]
        spent = await gateway.runtime.usage.cost_since(start_of_today(config.agents.defaults.timezone), members=True)
    assert [t["data"] for t in llm.transcriptions] == [b"one"] and spent == 6.0
    assert "budget" in refused["text"] and len(llm.chat_requests) == 1
    code, out, _ = await nanobot("status", home=config.home)
    assert "Usage [transcription]: 1 model call" in out, out


async def test_a_recording_costs_what_the_transcription_server_counted(config: Config, llm: FakeOpenAI,
                                                                       tg: FakeTelegram) -> None:
    """The server's count prices a recording: whisper-1's seconds (a file sent as a document has
    no duration from Telegram, nor do the page's, Slack's or mail's recordings: they cost $0),
    gpt-4o-transcribe's tokens at input/output rather than the platform's minutes; a model priced
    by the minute alone (as OpenAI's price list puts gpt-4o-transcribe) by the minute."""
    from nanobot.config import Price
    from nanobot.usage import start_of_today

    config.providers["openai"].prices = {"whisper-1": Price(input_minutes=6.0),
                                         "gpt-4o-transcribe": Price(input=6.0, output=10.0, input_minutes=99.0),
                                         "gpt-4o-mini-transcribe": Price(input_minutes=3.0)}
    tokens = {"type": "tokens", "input_tokens": 500_000, "output_tokens": 100_000, "total_tokens": 600_000}
    llm.transcripts.extend([{"text": "the memo", "usage": {"type": "duration", "seconds": 90}},
                            {"text": "the note", "usage": tokens}, {"text": "another", "usage": tokens}])
    llm.fallback = lambda body: reply("ok")
    async with running_gateway(config) as gateway:
        tg.push_document(ALICE, ALICE, b"memo", file_name="memo.opus")  # $9: 1.5 minutes
        await tg.wait_sent(1, timeout=15)
        config.tools.transcription.model = "gpt-4o-transcribe"
        tg.push_voice(ALICE, ALICE, b"note", duration=60)  # $3 + $1, not $99
        await tg.wait_sent(2, timeout=15)
        config.tools.transcription.model = "gpt-4o-mini-transcribe"
        tg.push_voice(ALICE, ALICE, b"another", duration=60)  # $3: the minute Telegram said
        await tg.wait_sent(3, timeout=15)
        spent = await gateway.runtime.usage.cost_since(start_of_today(config.agents.defaults.timezone))
    assert len(llm.transcriptions) == 3 and spent == pytest.approx(16.0)
    assert llm.transcriptions[0]["filename"].endswith("memo.ogg")  # OpenAI refuses the name .opus


async def test_a_transcription_servers_odd_count_is_not_taken(config: Config, llm: FakeOpenAI,
                                                              tg: FakeTelegram) -> None:
    """A local server's usage written its own way (no token count, a negative one, seconds as a
    word) is left aside: the note is heard and priced at the minutes Telegram said. The missing
    count failed the turn on a TypeError."""
    from nanobot.config import Price
    from nanobot.usage import start_of_today

    config.tools.transcription.model = "local-whisper"
    config.providers["openai"].prices = {"local-whisper": Price(input=1.0, input_minutes=6.0)}
    llm.transcripts.extend([{"text": "one", "usage": {"type": "tokens", "input_tokens": None}},
                            {"text": "two", "usage": {"type": "tokens", "input_tokens": -5, "output_tokens": 1}},
                            {"text": "three", "usage": {"type": "duration", "seconds": "long"}}])
    llm.fallback = lambda body: reply("heard: " + user_message(body)["content"])
    async with running_gateway(config) as gateway:
        for n, text in enumerate(("one", "two", "three"), 1):
            tg.push_voice(ALICE, ALICE, text.encode(), duration=60)
            await tg.wait_sent(n, timeout=15)
        spent = await gateway.runtime.usage.cost_since(start_of_today(config.agents.defaults.timezone))
    assert [m["text"] for m in tg.sent] == ["heard: [voice] one", "heard: [voice] two", "heard: [voice] three"]
    assert spent == pytest.approx(18.0)


async def test_a_voice_note_too_long_or_not_understood_gets_a_short_reply(config: Config, llm: FakeOpenAI,
                                                                          tg: FakeTelegram) -> None:
    config.tools.transcription.max_seconds = 60
    llm.transcripts.extend([error(500, message="whisper fell over"), error(401, message="key sk-CANARY refused")])
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, b"long", duration=125)
        [too_long] = await tg.wait_sent(1, timeout=15)
        tg.push_voice(ALICE, ALICE, b"short", duration=5)
        failed = (await tg.wait_sent(2, timeout=15))[1]
        tg.push_voice(BOB, BOB, b"short", duration=5)  # a member: the server's words are the owner's business
        told = (await tg.wait_sent(3, timeout=15))[2]
    assert "2 min 5 s" in too_long["text"] and "tools.transcription.maxSeconds" in too_long["text"]
    assert [t["data"] for t in llm.transcriptions] == [b"short", b"short"]  # the long one was never uploaded
    assert failed["text"].startswith("I could not transcribe your voice note") and "HTTP 500" in failed["text"]
    assert told["text"] == ("I could not transcribe your voice note: the transcription server gave no answer. "
                            "Please try again or type it.")
    assert llm.chat_requests == []


async def test_how_long_a_voice_note_is_comes_from_its_own_bytes(config: Config, llm: FakeOpenAI,
                                                                tg: FakeTelegram) -> None:
    """Telegram's duration is what the sender's app claimed: a note of 61 s claiming 3 passed
    maxSeconds, and the budget check saw 3 s. Its own bytes say 61 s, and it is refused before
    any upload; a note of 2 s claiming 500 is heard."""
    config.tools.transcription.max_seconds = 60
    llm.transcripts.append("short after all")
    llm.fallback = lambda body: reply("ok")
    async with running_gateway(config):
        tg.push_voice(ALICE, ALICE, encoded_audio(61, "libopus", "ogg", 48000, tone=False), duration=3)
        [refused] = await tg.wait_sent(1, timeout=15)
        tg.push_voice(ALICE, ALICE, encoded_audio(2, "libopus", "ogg", 48000, tone=False), duration=500)
        await tg.wait_sent(2, timeout=15)
    assert "1 min 1 s" in refused["text"] and "tools.transcription.maxSeconds" in refused["text"]
    assert len(llm.transcriptions) == 1 and "[voice] short after all" in str(llm.chat_requests[0]["messages"])


@pytest.mark.parametrize("codec, container, rate, seconds", [
    ("libopus", "ogg", 48000, 2.0), ("aac", "mp4", 16000, 2.0), ("aac", "adts", 44100, 2.02),
    ("libopus", "webm", 48000, 2.0), ("libmp3lame", "mp3", 16000, 2.1), ("libmp3lame", "mp3", 44100, 2.05)])
def test_a_recordings_length_is_read_from_ogg_mp4_adts_webm_and_mp3(codec: str, container: str, rate: int,
                                                                    seconds: float) -> None:
    """Ogg Opus (Telegram, WhatsApp, Element, Firefox), MP4 (Safari), raw AAC (Signal), WebM
    (Chromium: the page's test has a real one) and MP3 (MPEG-1 and MPEG-2; one frame of the
    encoder's own more) say how long they are; anything else does not."""
    from nanobot.media.duration import recording_seconds

    assert recording_seconds(encoded_audio(2.0, codec, container, rate, tone=False)) == pytest.approx(seconds, abs=0.05)


def test_marker_bytes_in_the_sound_are_not_taken_for_a_formats_headers() -> None:
    """Each format is walked by its structure: bytes that only look like a header ("mvhd" in
    another box, "OggS" near the end with no whole page behind it) are not read as one, and
    what is no recording says nothing."""
    from nanobot.media.duration import recording_seconds

    junk = (b"", b"OggS", b"\0\0\0\x08ftyp", b"\x1a\x45\xdf\xa3\x01\xff", png(10, 10), b"x" * 64,
            b"ID3\4\0\0\0\0\0\0" + b"\xff" * 64)
    assert [recording_seconds(other) for other in junk] == [None] * len(junk)
    mp4 = encoded_audio(2.0, "aac", "mp4", 16000, tone=False)
    ftyp = int.from_bytes(mp4[:4], "big")
    fake = b"mvhd" + bytes(8) + (1).to_bytes(4, "big") + (10**9).to_bytes(4, "big")  # 10^9 s, if read
    stray = (8 + len(fake)).to_bytes(4, "big") + b"free" + fake
    assert recording_seconds(mp4[:ftyp] + stray + mp4[ftyp:]) == pytest.approx(2.0, abs=0.05)
    ogg = encoded_audio(2.0, "libopus", "ogg", 48000, tone=False)
    stray = b"OggS\0\4" + (10**12).to_bytes(8, "little") + bytes(5)
    assert recording_seconds(ogg + stray) == pytest.approx(2.0, abs=0.05)


def test_a_wav_recordings_length_is_its_data_over_its_byte_rate() -> None:
    """WAV (what OpenAI's clients send as input_audio): 3 s of 16-bit 16 kHz mono; cut short, as
    much as is there; a chunk before the data that says "data" is walked over."""
    import wave

    from nanobot.media.duration import recording_seconds

    out = io.BytesIO()
    with wave.open(out, "wb") as recording:
        recording.setnchannels(1), recording.setsampwidth(2), recording.setframerate(16000)
        recording.writeframes(bytes(2 * 16000 * 3))
    data = out.getvalue()
    assert recording_seconds(data) == 3.0 and recording_seconds(data[:44 + 32000]) == 1.0
    assert recording_seconds(data[:30]) is None
    comment = b"INFOICMT" + (8).to_bytes(4, "little") + b"my data!"  # the word "data" before the data chunk
    listed = data[:36] + b"LIST" + len(comment).to_bytes(4, "little") + comment + data[36:]
    assert recording_seconds(listed) == 3.0


@pytest.mark.parametrize("rate, layout", [(8000, "mono"), (44100, "stereo"), (48000, "mono")])
def test_raw_aac_is_repacked_sample_for_sample_and_anything_else_left_alone(rate: int, layout: str) -> None:
    """Raw AAC (Signal's voice notes) becomes an M4A file of the same sound, as FFmpeg decodes
    it, also cut short mid-frame; Ogg, MP3 and M4A are not ADTS and go as they are."""
    from nanobot.media.aac import adts_to_m4a

    recorded = adts_aac(seconds=0.7, rate=rate, layout=layout)
    repacked = adts_to_m4a(recorded)
    assert repacked is not None and decoded_audio(repacked)[0].startswith("mov,mp4,m4a")
    assert decoded_audio(repacked)[1:] == decoded_audio(recorded)[1:]
    cut = adts_to_m4a(recorded[:-5])
    assert cut is not None and decoded_audio(cut)[1] == rate
    assert [adts_to_m4a(other) for other in (ogg_opus(), b"\xff\xfb\x90\x64" + bytes(400), repacked, b"")] == [None] * 4


def test_raw_aac_of_countless_tiny_frames_is_not_repacked() -> None:
    """25 MB of one-byte AAC frames would keep a thread busy for seconds (a member can send it):
    over MAX_FRAMES it goes as it came, and the transcription server refuses it."""
    from nanobot.media.aac import MAX_FRAMES, adts_to_m4a

    header = 0xFFF << 44 | 1 << 40 | 1 << 38 | 8 << 34 | 1 << 30 | 8 << 13  # no CRC, LC, 16 kHz, mono, 8 bytes
    frame = header.to_bytes(7, "big") + b"x"
    assert adts_to_m4a(frame * MAX_FRAMES) is not None and adts_to_m4a(frame * (MAX_FRAMES + 1)) is None


# ---- photos ---------------------------------------------------------------------------------

async def test_a_photo_reaches_the_model_as_an_image_part_and_the_history_keeps_a_path(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram, home: Path) -> None:
    from PIL import Image

    llm.script(reply("A red rectangle."))
    async with running_gateway(config):
        tg.push_photo(ALICE, ALICE, jpeg(3000, 2000), caption="what is this?")
        await tg.wait_sent(1, timeout=15)
    user = user_message(llm.chat_requests[0])
    text, picture = user["content"]
    assert text["type"] == "text" and "what is this?" in text["text"] and "[photo: inbox/" in text["text"]
    data = base64.b64decode(picture["image_url"]["url"].split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as img:
        assert max(img.size) == 1568 and img.format == "JPEG"  # resized from 3000 x 2000
    saved = history(home, f"telegram:{ALICE}")
    assert '"images": ["inbox/' in saved and "base64" not in saved


async def test_an_albums_pictures_are_one_message(config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    """Telegram posts an album's pictures as updates of their own, a moment apart: they are one
    turn with all of them and the caption, not three answers."""
    llm.fallback = lambda body: reply(f"{len(image_parts(body))} pictures")
    async with running_gateway(config):
        first = tg.push_photo(ALICE, ALICE, jpeg(40, 30), caption="add these up", media_group_id="A1")
        await tg.wait_until(lambda: first["update_id"] in tg.handed_out)  # read, and the rest still coming
        for shade in (60, 90):
            tg.push_photo(ALICE, ALICE, jpeg(40, 30, (shade, 0, 0)), media_group_id="A1")
        tg.push_text(ALICE, ALICE, "thanks")
        await tg.wait_sent(2, timeout=15)
    assert tg.sent[0]["text"] == "3 pictures" and len(llm.chat_requests) == 2  # the album, then "thanks"
    assert "add these up" in str(user_message(llm.chat_requests[0])["content"])


async def test_in_a_group_an_album_whose_caption_names_the_bot_comes_whole(config: Config, llm: FakeOpenAI,
                                                                            tg: FakeTelegram) -> None:
    """Only the first picture of an album carries its caption: the mention there speaks for the
    others, which came without words (and were kept out as not for the bot)."""
    llm.fallback = lambda body: reply(f"{len(image_parts(body))} pictures")
    async with running_gateway(config):
        for caption, shade in (("@nanobot_test_bot what are these?", 30), (None, 60)):
            tg.push_photo(GROUP, ALICE, jpeg(40, 30, (shade, 0, 0)), caption=caption, media_group_id="G1",
                          chat_type="group")
        await tg.wait_sent(1, timeout=15)
    assert tg.sent[0]["text"] == "2 pictures" and len(llm.chat_requests) == 1
    assert "what are these?" in str(user_message(llm.chat_requests[0])["content"])


def on_webhook(config: Config) -> tuple[int, str]:
    """The config's Telegram served through a webhook on a free loopback port: (port, secret)."""
    port, secret = free_port(), "album-secret-for-tests"
    config.channels.telegram.webhook = TelegramWebhook(url="https://bot.example.org/tg", listen=f"127.0.0.1:{port}",
                                                       secret_token=secret)
    return port, secret


async def test_a_group_albums_caption_speaks_for_its_pictures_after_a_restart_too(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    """What the caption said is noted in the store, not in one process's memory: a picture that
    lands after a restart (or, behind a webhook, on another worker) still belongs to the turn."""
    llm.fallback = lambda body: reply(f"{len(image_parts(body))} pictures")
    port, secret = on_webhook(config)
    async with aiohttp.ClientSession() as http:
        async with running_gateway(config, pace=fast_pace(album_quiet_s=60)):  # stopped while the album grows
            first = tg.push_photo(GROUP, ALICE, jpeg(40, 30), caption="@nanobot_test_bot what are these?",
                                  media_group_id="G2", chat_type="group")
            assert await post_update(http, port, "/tg", first, secret) == 200
        async with running_gateway(config, pace=fast_pace(album_quiet_s=5)):
            second = tg.push_photo(GROUP, ALICE, jpeg(40, 30, (60, 0, 0)), media_group_id="G2", chat_type="group")
            assert await post_update(http, port, "/tg", second, secret) == 200
            await tg.wait_sent(1, timeout=20)
    assert tg.sent[0]["text"] == "2 pictures" and len(llm.chat_requests) == 1


async def test_an_albums_pictures_through_a_webhook_are_one_message_also_after_a_restart(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram, home: Path) -> None:
    """Through a webhook Telegram posts each picture alone, the next only once the last was
    answered: each is recorded and answered at once, and the album is still one turn, also when
    the gateway stopped before it was whole (its recorded parts are joined at the next start)."""
    llm.fallback = lambda body: reply(f"{len(image_parts(body))} pictures")
    port, secret = on_webhook(config)
    async with aiohttp.ClientSession() as http:
        async with running_gateway(config, pace=fast_pace(album_quiet_s=60)):  # stopped while the album grows
            for caption, shade in (("add these up", 30), (None, 60)):
                update = tg.push_photo(ALICE, ALICE, jpeg(40, 30, (shade, 0, 0)), caption=caption, media_group_id="A1")
                assert await post_update(http, port, "/tg", update, secret) == 200
        assert llm.chat_requests == []
        async with running_gateway(config):
            await tg.wait_until(lambda: bool(tg.sent))
            assert await post_update(http, port, "/tg", tg.push_text(ALICE, ALICE, "thanks"), secret) == 200
            await tg.wait_sent(2, timeout=15)
    assert [m["text"] for m in tg.sent] == ["2 pictures", "2 pictures"]  # the second: the history's
    assert [str(user_message(r)["content"]).count("'type': 'image_url'") for r in llm.chat_requests] == [2, 0]
    assert "add these up" in str(user_message(llm.chat_requests[0])["content"])
    code, out, _ = await nanobot("status", home=home)
    assert "Delivery:  0 messages not yet answered" in out  # the reply settled both pictures


async def test_only_the_last_five_images_go_back_to_the_model(config: Config, llm: FakeOpenAI,
                                                              tg: FakeTelegram) -> None:
    async with running_gateway(config):
        for i in range(7):
            tg.push_photo(ALICE, ALICE, jpeg(40, 30, (i * 30, 0, 0)), caption=f"photo {i}")
            await tg.wait_sent(i + 1, timeout=15)
        tg.push_text(ALICE, ALICE, "which was the first?")
        await tg.wait_sent(8, timeout=15)
    assert [len(image_parts(r)) for r in llm.chat_requests] == [1, 2, 3, 4, 5, 5, 5, 5]
    last = llm.chat_requests[-1]["messages"]
    assert isinstance(last[1]["content"], str) and "[photo: inbox/" in last[1]["content"]  # oldest: a path


async def test_a_model_that_rejects_images_gets_paths_and_is_remembered(config: Config, llm: FakeOpenAI,
                                                                       tg: FakeTelegram, home: Path) -> None:
    def blind_server(body: dict[str, Any]) -> Any:
        if image_parts(body):
            return error(400, message="image input is not supported by this model")
        return reply("I only see a file name.")

    llm.fallback = blind_server
    async with running_gateway(config):
        tg.push_photo(ALICE, ALICE, jpeg(40, 30), caption="look")
        [first] = await tg.wait_sent(1, timeout=15)
        tg.push_photo(ALICE, ALICE, jpeg(40, 30), caption="and this one")
        second = (await tg.wait_sent(2, timeout=15))[1]
    assert first["text"].startswith("I only see a file name.") and "does not accept images" in first["text"]
    assert second["text"] == "I only see a file name."  # said once
    assert [bool(image_parts(r)) for r in llm.chat_requests] == [True, False, False]
    assert json.loads((home / "vision-off.json").read_text()) == ["openai/fake-model"]


async def test_a_refusal_of_this_request_does_not_take_pictures_from_the_model(config: Config, llm: FakeOpenAI,
                                                                            tg: FakeTelegram, home: Path) -> None:
    """A request with a photo refused for its length or by a policy is no sign that the model
    takes no pictures: remembered as such, one member's photo took them from every chat, for good."""
    from nanobot.media.vision import rejects_images
    from nanobot.providers.base import ProviderError

    refusals = [error(400, message="This model's maximum context length is 128000 tokens. However, your messages "
                                   "resulted in 130000 tokens (including 1105 in the images)."),
                error(400, message="Your input image may contain content that is not allowed by our safety system.")]
    llm.fallback = lambda body: refusals.pop(0) if refusals and image_parts(body) else reply("A cat.")
    async with running_gateway(config):
        for n, caption in enumerate(("long", "unsafe", "a cat?"), start=1):
            tg.push_photo(ALICE, ALICE, jpeg(40, 30), caption=caption)
            await tg.wait_sent(n, timeout=15)
    assert tg.sent[-1]["text"] == "A cat." and image_parts(llm.chat_requests[-1])  # still shown pictures
    assert not (home / "vision-off.json").exists()
    said = ("Invalid content type. image_url is only supported by certain models.", "LLaVA is not a multimodal model",
            "unknown variant `image_url`, expected `text`", "messages[1].content must be a string")
    assert all(rejects_images(ProviderError(text, status=400)) for text in said)
    assert not rejects_images(ProviderError("image too large: 25 MB", status=400))


async def test_images_shown_are_capped_and_unreadable_ones_become_paths(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png())
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "bomb.png").write_bytes(png_claiming(100_000, 100_000))  # 10 gigapixels, 100 bytes
    messages = [{"role": "user", "content": "x", "images": ["a.png", "broken.jpg", "gone.jpg", "bomb.png"]}]
    [sent] = await with_images(messages, tmp_path, keep=5)
    assert [p["type"] for p in sent["content"]] == ["text", "image_url"]  # RGBA flattened to JPEG
    notes = sent["content"][0]["text"]
    assert "[image: broken.jpg]" in notes and "[image: gone.jpg]" in notes and "[image: bomb.png]" in notes
    assert "100000x100000 pixels" in failure_marker(tmp_path / "bomb.png").read_text()  # refused before decoding
    assert (await with_images(messages, tmp_path, keep=0))[0]["content"].startswith("x\n[image: a.png]")
    assert "images" in messages[0]  # the history itself is not changed


# ---- documents ------------------------------------------------------------------------------

async def test_a_pdf_reaches_code_mode_as_text(config: Config, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    config.agents.defaults.execution_mode = "code"
    # The key is the file's name in the inbox, which the prompt gives.
    llm.script(reply('```python\ntext = files["telegram_ufile1_invoice.pdf"]\nprint(text.splitlines()[1])\n```'),
               reply("The total is 1234 EUR."))
    async with running_gateway(config):
        tg.push_document(ALICE, ALICE, pdf_with_text("Invoice 2026-11", "Total due: 1234 EUR"), "invoice.pdf",
                         caption="how much?")
        [sent] = await tg.wait_sent(1, timeout=15)
    first, second = llm.chat_requests
    prompt = user_message(first)["content"]
    assert "files['telegram_ufile1_invoice.pdf'] (35 chars)" in prompt and "Invoice 2026-11" in prompt  # a preview
    assert "Total due: 1234 EUR" in user_message(second)["content"]  # the program's output
    assert sent["text"] == "The total is 1234 EUR."


async def test_a_scanned_pdf_says_so_and_a_docx_is_a_path_plus_preview(config: Config, llm: FakeOpenAI,
                                                                        tg: FakeTelegram, workspace: Path) -> None:
    llm.script(reply("It is a scan."), tool_call("read_file", {"path": "PLACEHOLDER"}), reply("done"))
    async with running_gateway(config):
        tg.push_document(ALICE, ALICE, scanned_pdf(), "scan.pdf")
        await tg.wait_sent(1, timeout=15)
        tg.push_document(ALICE, ALICE, docx("Minutes of the meeting", "Action: ship it"), "minutes.docx")
        await tg.wait_sent(2, timeout=15)
    scan = user_message(llm.chat_requests[0])["content"]
    assert "scan.pdf has no text layer" in scan and "no OCR" in scan
    minutes = user_message(llm.chat_requests[1])["content"]
    assert "Minutes of the meeting" in minutes and "read_file('inbox/telegram_ufile2_minutes.docx.txt')" in minutes
    text = (workspace / "inbox" / "telegram_ufile2_minutes.docx.txt").read_text()
    assert "Action: ship it" in text and "total | 42" in text


async def test_a_docx_bomb_from_a_member_is_refused_in_one_line_and_the_bot_answers_on(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> None:
    config.channels.telegram.group_policy = "open"
    seen = []

    def answer(body: dict[str, Any]) -> Any:
        seen.append(user_message(body)["content"])
        return reply("I could not read that file.")

    llm.script(answer, reply("Hello Alice."))
    async with running_gateway(config):
        tg.push_document(GROUP, BOB, docx_inflating_to(40), "report.docx", chat_type="group", username="bob")
        await tg.wait_sent(1, timeout=15)
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_sent(2, timeout=15)
    assert "could not be read: telegram_ufile1_report.docx would unpack to 41 MB of text and markup; I read documents up to 16 MB" in seen[0]
    inbox = workspace / "chats" / f"telegram_{GROUP}" / "inbox"
    assert "would unpack" in failure_marker(inbox / "telegram_ufile1_report.docx").read_text()  # not parsed again
    assert [m["text"] for m in tg.sent] == ["I could not read that file.", "Hello Alice."]


async def test_parsing_runs_in_a_child_with_cpu_memory_and_time_limits(tmp_path: Path) -> None:
    heavy = tmp_path / "heavy.docx"
    heavy.write_bytes(docx_inflating_to(12))  # under the caps, but seconds of CPU and ~300 MB to parse
    for limits in (ParseLimits(cpu_seconds=1), ParseLimits(memory_bytes=120 << 20)):
        failure_marker(heavy).unlink(missing_ok=True)
        with pytest.raises(Unreadable, match="more memory or time to read than I allow"):
            await parse_file("document", tmp_path, "heavy.docx", limits)
    failure_marker(heavy).unlink()
    with pytest.raises(Unreadable, match="took longer than 0.01 s"):
        await parse_file("document", tmp_path, "heavy.docx", ParseLimits(wall_seconds=0.01))
    small = tmp_path / "small.docx"
    small.write_bytes(docx("fine"))
    assert "fine" in (await parse_file("document", tmp_path, "small.docx"))["text"]


async def test_a_file_that_failed_is_not_parsed_again_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "minutes.docx"
    path.write_bytes(docx("Minutes"))
    with pytest.raises(Unreadable, match="took longer"):
        await parse_file("document", tmp_path, "minutes.docx", ParseLimits(wall_seconds=0.001))
    with pytest.raises(Unreadable, match="took longer"):  # recorded: no second try, even with room now
        await parse_file("document", tmp_path, "minutes.docx")
    path.write_bytes(docx("Minutes, corrected"))
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)
    assert "Minutes, corrected" in (await parse_file("document", tmp_path, "minutes.docx"))["text"]


# ---- files out ------------------------------------------------------------------------------

async def test_a_programs_send_file_arrives_as_a_photo_and_as_a_document(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram, workspace: Path) -> None:
    config.agents.defaults.execution_mode = "code"
    (workspace / "chart.png").write_bytes(png())
    llm.script(reply('```python\nwrite_file("report.csv", "month,sales\\nJan,10\\n")\n'
                     'send_file("chart.png", caption="Sales by month")\nsend_file("report.csv")\n'
                     'final_answer("Here you are.")\n```'))
    async with running_gateway(config):
        tg.push_text(ALICE, ALICE, "send me the chart and the data")
        await tg.wait_sent(1, timeout=15)
        await tg.wait_until(lambda: len(tg.files) == 2)
    photo, document = tg.files
    assert (photo["method"], photo["filename"], photo["caption"]) == ("photo", "chart.png", "Sales by month")
    assert photo["data"] == png() and photo["chat_id"] == ALICE
    assert (document["method"], document["filename"]) == ("document", "report.csv")
    assert document["data"] == b"month,sales\nJan,10\n"


async def test_send_file_refuses_big_files_escapes_and_other_chats_from_members(
        config: Config, llm: FakeOpenAI, tg: FakeTelegram, workspace: Path, home: Path) -> None:
    with open(workspace / "huge.bin", "wb") as f:
        f.truncate(51 * 1024 * 1024)  # sparse: no real 51 MB on disk
    (home / "config.json").write_text('{"secret": "CANARY-CONFIG"}')
    results = []

    def record(body: dict[str, Any]) -> Any:
        results.append(body["messages"][-1]["content"])
        return reply("done")

    llm.script(tool_call("send_file", {"path": "huge.bin"}), record,
               tool_call("send_file", {"path": str(home / "config.json")}), record,
               tool_call("send_file", {"path": "notes.txt", "to": f"telegram:{ALICE}"}), record)
    (workspace / "chats" / f"telegram_{GROUP}").mkdir(parents=True)
    (workspace / "chats" / f"telegram_{GROUP}" / "notes.txt").write_text("member notes")
    config.channels.telegram.group_policy = "open"
    async with running_gateway(config):
        tg.push_text(ALICE, ALICE, "send the big file")
        await tg.wait_sent(1, timeout=15)
        tg.push_text(ALICE, ALICE, "send the config")
        await tg.wait_sent(2, timeout=15)
        tg.push_text(GROUP, BOB, "send my notes to alice", chat_type="group", username="bob")
        await tg.wait_sent(3, timeout=15)
    big, escape, member = results
    assert "over the 52,428,800-byte limit" in big and "telegram takes files up to 50 MB" in big
    assert "PermissionError" in escape and "outside the workspace" in escape
    assert "PermissionError" in member and "may only send messages to itself" in member
    assert tg.files == []


async def test_discord_voice_in_and_file_out(config: Config, llm: FakeOpenAI, dc: FakeDiscord,
                                             workspace: Path) -> None:
    dc.connect(config, FRIEND).streaming = False
    config.channels.telegram.enabled = False
    (workspace / "chart.png").write_bytes(png())
    llm.transcripts.append("send me the chart")
    llm.script(tool_call("send_file", {"path": "chart.png", "caption": "the chart"}), reply("Sent."))
    async with running_gateway(config):
        await dc.push_message(DM, FRIEND, "", username="friend", attachments={"voice-message.ogg": b"OggS"},
                              voice_seconds=2.5)
        await dc.wait_sent(2, timeout=15)
    assert user_message(llm.chat_requests[0])["content"] == "[voice] send me the chart"
    [upload] = dc.files
    assert (upload["filename"], upload["content"], upload["data"]) == ("chart.png", "the chart", png())
