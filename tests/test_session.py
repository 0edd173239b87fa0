"""JSONL histories: append-only, metadata first, torn or corrupt lines skipped, nothing else lost."""

from __future__ import annotations

import json
from pathlib import Path

from nanobot.session import SessionStore, load_session


def test_round_trip_with_metadata_first(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("telegram:42")
    s.append({"role": "user", "content": "hi"})
    s.set_meta(mode="tools")
    s.append({"role": "assistant", "content": "hello"})
    store.close()
    lines = (tmp_path / "telegram_42.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["_meta"]["key"] == "telegram:42"
    again = SessionStore(tmp_path).get("telegram:42")
    assert [m["content"] for m in again.messages] == ["hi", "hello"]
    assert again.meta["mode"] == "tools" and "created" in again.meta


def test_torn_last_line_and_corrupt_line_are_skipped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:x")
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
    s2 = SessionStore(tmp_path).get("cli:x")
    s2.append({"role": "assistant", "content": "after"})
    s2.close()
    assert [m["content"] for m in load_session("cli:x", path).messages][-1] == "after"


def test_reset_keeps_the_file_but_starts_fresh(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:r")
    s.append({"role": "user", "content": "old"})
    s.reset()
    s.append({"role": "user", "content": "new"})
    store.close()
    assert [m["content"] for m in SessionStore(tmp_path).get("cli:r").messages] == ["new"]
    assert "old" in (tmp_path / "cli_r.jsonl").read_text()


def test_history_window_starts_at_a_user_message_and_drops_unanswered_calls(tmp_path: Path) -> None:
    s = SessionStore(tmp_path).get("cli:w")
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
