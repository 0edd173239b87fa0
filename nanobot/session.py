"""Chat histories: one append-only JSONL file per session under ``$NANOBOT_HOME/sessions/``.

The first line is metadata (created, settings). Every later change is appended, never
rewritten: messages as they happen, ``{"_meta": {...}}`` lines for settings such as the
execution mode, a ``{"_reset": ...}`` line for ``/new`` and ``{"_drop": n}`` when a failed turn
takes back its messages. So a crash can at worst tear the
last line, which loading skips (as it skips any corrupt line) without losing the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from nanobot.config import private_dir
from nanobot.utf8 import clean_text

log = logging.getLogger(__name__)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class Session:
    key: str
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)  # since the last /new
    _file: TextIO | None = None

    # ---- reading ---------------------------------------------------------------------
    def history(self, window: int) -> list[dict[str, Any]]:
        """The last ``window`` messages as the model expects them, starting at a user message.

        Cutting in the middle of a tool exchange would leave tool results without the call
        that asked for them, which providers reject; so the window starts at a user turn.
        """
        recent = self.messages[-window:]
        for i, message in enumerate(recent):
            if message.get("role") == "user":
                recent = recent[i:]
                break
        else:
            recent = []
        return _merge_assistant_runs(_complete_tool_exchanges([{k: v for k, v in m.items() if k != "ts"}
                                                               for m in recent]))

    # ---- writing ---------------------------------------------------------------------
    def append(self, message: dict[str, Any]) -> None:
        """Record one message at once (flushed to the OS; fsync happens at the end of the turn)."""
        record = {**clean_text(message), "ts": _now()}
        self.messages.append(record)
        self._write(record)

    def set_meta(self, **values: Any) -> None:
        self.meta.update(values)
        self._write({"_meta": values})

    def drop_last(self, count: int) -> None:
        """Take back the last ``count`` messages (a turn that failed before doing anything)."""
        count = min(count, len(self.messages))
        if count > 0:
            del self.messages[-count:]
            self._write({"_drop": count})

    def reset(self) -> None:
        """``/new``: later turns start from an empty history; the old lines stay in the file."""
        self.messages = []
        self._write({"_reset": _now()})

    def sync(self) -> None:
        if self._file:
            self._file.flush()
            os.fsync(self._file.fileno())

    async def sync_soon(self) -> None:
        """``sync`` with the fsync in a thread: on a busy disk one can take long, and the event
        loop (every other chat, and the marks of sent replies) must not wait for it."""
        if self._file:
            self._file.flush()
            try:
                await asyncio.to_thread(os.fsync, self._file.fileno())
            except (OSError, ValueError):  # closed meanwhile: close() synced it
                pass

    def close(self) -> None:
        if self._file:
            self.sync()
            self._file.close()
            self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            private_dir(self.path.parent)
            self._file = open(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8")
            if new:
                self.meta.setdefault("created", _now())
                self._file.write(json.dumps({"_meta": {"key": self.key, **self.meta}}, ensure_ascii=False) + "\n")
            elif not _ends_with_newline(self.path):
                self._file.write("\n")  # seal a torn last line so the next record stands alone
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()


def _complete_tool_exchanges(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop tool calls whose results never came (a crash or /stop mid-turn) and orphan results.

    Providers reject a history where an assistant's tool call has no matching tool message.
    """
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    asked: set[str] = set()
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            ids = {c.get("id") for c in m["tool_calls"]}
            if ids <= answered:
                asked |= ids
            else:
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                if not m.get("content"):
                    continue
        elif m.get("role") == "tool" and m.get("tool_call_id") not in asked:
            continue
        out.append(m)
    return out


def _merge_assistant_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two plain assistant messages in a row become one (a program and the final_answer it
    gave, a reply and a stop note): chat templates of local servers insist that roles alternate."""
    out: list[dict[str, Any]] = []
    for message in messages:
        last = out[-1] if out else None
        if last and last.get("role") == message.get("role") == "assistant" \
                and not last.get("tool_calls") and not message.get("tool_calls"):
            out[-1] = {**last, "content": "\n\n".join(filter(None, [last.get("content"), message.get("content")]))}
        else:
            out.append(message)
    return out


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def session_filename(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".jsonl"


class SessionStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: dict[str, Session] = {}

    def get(self, key: str) -> Session:
        session = self._open.get(key)
        if session is None:
            session = self._open[key] = load_session(key, self.directory / session_filename(key))
        return session

    def close(self, key: str | None = None) -> None:
        keys = [key] if key else list(self._open)
        for k in keys:
            session = self._open.pop(k, None)
            if session:
                session.close()


def load_session(key: str, path: Path) -> Session:
    session = Session(key, path)
    if not path.exists():
        return session
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError:
                log.warning("%s: skipped unreadable line %d", path, number)
                continue
            if "_meta" in record:
                session.meta.update(record["_meta"])
            elif "_reset" in record:
                session.messages = []
            elif "_drop" in record and isinstance(record["_drop"], int) and record["_drop"] > 0:
                del session.messages[-record["_drop"]:]
            elif "role" in record:
                session.messages.append(record)
    session.meta.pop("key", None)
    return session
