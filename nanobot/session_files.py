"""Chat histories as JSONL files, the default: one file per session under
``$NANOBOT_HOME/sessions/``, each record a line, appended and flushed at once (fsync at the end
of a turn). A crash can at worst tear the last line, which loading skips (as it skips any
corrupt line) without losing the rest; the next record seals it first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, TextIO

from nanobot.chat_names import HISTORY_SUFFIX, history_file, history_key, key_of
from nanobot.config import private_dir
from nanobot.session import MAX_OPEN, OpenSessions, Session, replay

log = logging.getLogger(__name__)


class SessionStore(OpenSessions):
    """The default: one JSONL file per session in ``directory``."""

    def __init__(self, directory: Path, *, max_open: int = MAX_OPEN) -> None:
        super().__init__(max_open)
        self.directory = directory

    async def open(self, key: str) -> Session:
        session = self._cached(key)
        if session is None:  # read off the event loop: a history of years is megabytes, and every chat would wait
            loaded = await asyncio.to_thread(load_session, key, self.directory / history_file(key))
            session = self._cached(key) or self._keep(key, loaded)  # another task may have opened it meanwhile
        return session

    async def exists(self, key: str) -> bool:
        """Whether this chat has a history (it has talked to the bot)."""
        return key in self._alive or (self.directory / history_file(key)).exists()

    async def records(self, key: str) -> list[dict[str, Any]]:
        """Every record of the chat's history, in order (``nanobot history export``)."""
        return await asyncio.to_thread(lambda: list(_read_records(self.directory / history_file(key))))

    async def chats(self, prefix: str = "", limit: int = 100) -> list[str]:
        paths = sorted(self.directory.glob("*" + HISTORY_SUFFIX), key=lambda p: p.stat().st_mtime, reverse=True)
        found = []
        for path in paths:  # the names say the key, unless cut (then the first line does)
            key = key_of(path.stem) or history_key(path)
            if key and key.startswith(prefix):
                found.append(key)
                if len(found) == limit:
                    break
        return found

    def keys(self) -> list[str]:
        """The chats with a history (``nanobot db migrate``): from each file's first record."""
        return [history_key(path) or key_of(path.stem) or path.stem
                for path in sorted(self.directory.glob("*" + HISTORY_SUFFIX))]


def load_session(key: str, path: Path) -> Session:
    session = Session(key, JsonlJournal(path))
    replay(session, _read_records(path))
    return session


def _read_records(path: Path) -> Iterable[dict[str, Any]]:
    if not path.exists():
        return
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
            yield record


class JsonlJournal:
    """A session's records as lines of one file (0600), appended and flushed at once."""

    writing = False  # each record is handed to the OS as it comes

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._abandoned = False  # written at once, so nothing waits to be dropped

    @property
    def empty(self) -> bool:
        return not self.path.exists() or self.path.stat().st_size == 0

    def write(self, record: dict[str, Any]) -> None:
        if self._abandoned:
            return
        if self._file is None:
            torn = not self.empty and not _ends_with_newline(self.path)
            private_dir(self.path.parent)
            self._file = open(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8")
            if torn:
                self._file.write("\n")  # seal a torn last line so the next record stands alone
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def sync(self) -> None:
        if self._file:
            self._file.flush()
            os.fsync(self._file.fileno())

    async def sync_soon(self) -> None:
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

    def abandon(self) -> None:
        self._abandoned = True
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
