"""JSONL histories: append-only, metadata first, torn or corrupt lines skipped, nothing else lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nanobot.bus import Identity
from nanobot.session_files import SessionStore, load_session


async def test_round_trip_with_metadata_first(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = await store.open("telegram:42")
    s.append({"role": "user", "content": "hi"})
    s.set_meta(mode="tools")
    s.append({"role": "assistant", "content": "hello"})
    store.close()
    lines = (tmp_path / "telegram_42.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["_meta"]["key"] == "telegram:42"
    again = await SessionStore(tmp_path).open("telegram:42")
    assert [m["content"] for m in again.messages] == ["hi", "hello"]
    assert again.meta.mode == "tools" and again.meta.created


async def test_torn_last_line_and_corrupt_line_are_skipped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = await store.open("cli:x")
    for i in range(3):
        s.append({"role": "user", "content": f"m{i}"})
    store.close()
    path = tmp_path / "cli_x.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, "{not json")
    path.write_text("\n".join(lines) + '\n{"role": "user", "content": "to')  # torn write at the end
    loaded = load_session("cli:x", path)
    assert [m["content"] for m in loaded.messages] == ["m0", "m1", "m2"]
    # appending after a torn line starts a fresh line, so the new record is readable
    s2 = await SessionStore(tmp_path).open("cli:x")
    s2.append({"role": "assistant", "content": "after"})
    s2.close()
    assert [m["content"] for m in load_session("cli:x", path).messages][-1] == "after"


async def test_reset_keeps_the_file_but_starts_fresh(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = await store.open("cli:r")
    s.append({"role": "user", "content": "old"})
    s.reset()
    s.append({"role": "user", "content": "new"})
    store.close()
    assert [m["content"] for m in (await SessionStore(tmp_path).open("cli:r")).messages] == ["new"]
    assert "old" in (tmp_path / "cli_r.jsonl").read_text()


async def test_history_window_starts_at_a_user_message_and_drops_unanswered_calls(tmp_path: Path) -> None:
    s = await SessionStore(tmp_path).open("cli:w")
    s.append({"role": "user", "content": "u1"})
    s.append({"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]})
    s.append({"role": "tool", "tool_call_id": "a", "content": "r"})
    s.append({"role": "assistant", "content": "done"})
    s.append({"role": "user", "content": "u2"})
    s.append({"role": "assistant", "content": None, "tool_calls": [{"id": "b", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]})
    # crash before the tool result of "b" was written
    history = s.history(window=5)
    assert history[0]["role"] == "user" and history[0]["content"] == "u2"
    assert all("ts" not in m for m in history)
    assert not any(m.get("tool_calls") for m in history)
    full = s.history(window=50)
    assert [m["role"] for m in full] == ["user", "assistant", "tool", "assistant", "user"]


async def test_chat_state_is_typed_and_reads_old_histories(tmp_path: Path) -> None:
    """What a chat remembers has named fields: a misspelt or mistyped setting fails in code
    at once instead of becoming silent, permanent state; old files read as before."""
    path = tmp_path / "telegram_7.jsonl"
    path.write_text('{"_meta": {"key": "telegram:7", "created": "2025-01-01T00:00:00+0000", "mode": "code"}}\n'
                    '{"role": "user", "content": "hi", "ts": "x"}\n'
                    '{"_meta": {"model": "fast", "peer": ["7", "Ann"], "retired_setting": 1}}\n'
                    '{"_meta": {"intake_started": "not a number", "consolidated_upto": true}}\n'
                    '{"_meta": {"waiting": 2}}\n{"_meta": {"waiting": [0, "x"]}}\n')  # an old count; a bad list
    s = load_session("telegram:7", path)
    # An old peer's second part may be a display name (email's From name): its id is kept, never the name.
    assert (s.meta.mode, s.meta.model, s.meta.peer) == ("code", "fast", Identity("7"))
    assert s.meta.intake_started is None and s.meta.consolidated_upto is None and s.meta.waiting == []
    with pytest.raises(AttributeError, match="modle"):
        s.set_meta(modle="fast")
    with pytest.raises(TypeError, match="intake_started"):
        s.set_meta(intake_started="12")
    with pytest.raises(TypeError, match="waiting"):
        s.set_meta(waiting=[1, True])
    s.set_meta(mode=None, voice_hint_sent=True)
    s.close()
    again = load_session("telegram:7", path)
    assert again.meta.mode is None and again.meta.voice_hint_sent and again.meta.model == "fast"


async def test_a_history_is_read_only_once_opened(tmp_path: Path) -> None:
    """The same contract as the database store: ``get`` before ``open`` is a programming error,
    so a path that forgets to open a chat fails on SQLite too, not only on PostgreSQL."""
    store = SessionStore(tmp_path)
    with pytest.raises(RuntimeError, match="used before it was opened"):
        store.get("cli:x")
    opened = await store.open("cli:x")
    assert store.get("cli:x") is opened


async def test_a_long_history_is_read_while_other_chats_go_on(tmp_path: Path) -> None:
    """Years of a busy chat are megabytes: reading them must not hold up every other chat (the
    event loop runs on while they load), and chats opening it at once share one session."""
    record = json.dumps({"role": "user", "content": "a line of an old conversation " * 4})
    (tmp_path / "telegram_7.jsonl").write_text(json.dumps({"_meta": {"key": "telegram:7"}}) + "\n"
                                                + (record + "\n") * 60_000)
    store, ticks = SessionStore(tmp_path), 0

    async def other_chats() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(other_chats())
    first, second = await asyncio.gather(store.open("telegram:7"), store.open("telegram:7"))
    ticking.cancel()
    assert first is second is store.get("telegram:7") and first.count == 60_000
    assert ticks > 100  # read in the loop, the whole load was one step: 3 ticks in all


async def test_what_waits_for_a_reader_survives_a_reload_and_a_new_conversation_clears_it(tmp_path: Path) -> None:
    """The messages kept for a reader who is away are positions in the history: read back as
    written, the newest 20 at most (an API chat's reader never marks them seen), none after /new."""
    store = SessionStore(tmp_path)
    s = await store.open("api:bob")
    for i in range(25):
        s.keep_for_reader(f"run {i}")
        s.append({"role": "user", "content": "and?"})
    store.close()
    second = SessionStore(tmp_path)
    again = await second.open("api:bob")
    assert again.waiting_messages() == [f"run {i}" for i in range(5, 25)]
    again.mark_seen(again.meta.waiting[9])
    assert again.waiting_messages() == [f"run {i}" for i in range(15, 25)]
    again.reset()
    again.keep_for_reader("after /new")
    assert again.waiting_messages() == ["after /new"]
    second.close()
    assert (await SessionStore(tmp_path).open("api:bob")).waiting_messages() == ["after /new"]
