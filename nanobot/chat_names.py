"""A chat's key as a file or folder name: ``sessions/<name>.jsonl`` and ``chats/<name>/``.

The mapping must be injective, or two chats share one history and one member folder (before,
every character outside ``[A-Za-z0-9._-]`` became ``_``, so ``api:team:admin`` and
``api:team_admin`` were one file). It stays readable: ``:`` becomes ``_`` (so the usual names,
``telegram_123`` or ``telegram_-100987``, are what they were), and every other character outside
``[A-Za-z0-9.-]`` (``_`` and ``%`` included) becomes ``%XX`` per UTF-8 byte, which ``key_of``
reverses. A leading ``.`` is escaped too (no hidden or ``..`` names). A name that would pass
``MAX_NAME`` characters is cut and ends in ``~`` and a hash of the whole key; ``~`` is escaped
everywhere else, so a cut name never equals an uncut one.

Homes made before are renamed once at start (``rename_legacy_chats``): a file or folder goes to
its key's new name when only one known key could have made its old name; a name that two known
keys could both claim is moved aside into ``.unclaimed/`` and reported in one line, never given
to either and never merged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from nanobot.database import Database, Migrations, Queries

log = logging.getLogger(__name__)

HISTORY_SUFFIX = ".jsonl"
MAX_NAME = 200  # file names are limited to 255 bytes; the suffix and the hash fit under it
UNCLAIMED = ".unclaimed"  # never a chat's name: a new name cannot start with "."
# Recorded in schema_versions once the renaming is done: from then on every name is this
# module's (the database, not a file, holds it: workers sharing a workspace share the database).
DONE: Migrations = {"sqlite": ["SELECT 1"], "postgresql": ["SELECT 1"]}
_KEEP = re.compile(r"[A-Za-z0-9.-]")


def chat_name(key: str) -> str:
    """The file and folder name of chat ``key`` (without ``.jsonl``): one per key."""
    out = []
    for i, char in enumerate(key):
        if char == ":":
            out.append("_")
        elif _KEEP.fullmatch(char) and not (i == 0 and char == "."):
            out.append(char)
        else:
            out.append("".join(f"%{b:02X}" for b in char.encode("utf-8")))
    name = "".join(out)
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME - 41] + "~" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]
    return name


TASK_MARK = "/task-"  # no chat id holds a "/": a background task's history is "<chat>/task-<id>"


def task_key(chat: str, task_id: str) -> str:
    """The history of background task ``task_id`` of ``chat`` (its own, beside the chat's)."""
    return f"{chat}{TASK_MARK}{task_id}"


def parent_chat(session_key: str) -> str:
    """The chat a session belongs to: itself, or the chat that spawned a background task."""
    return session_key.split(TASK_MARK, 1)[0]


def history_file(key: str) -> str:
    return chat_name(key) + HISTORY_SUFFIX


def key_of(name: str) -> str | None:
    """The key a name stands for, or None for a cut name (its key is in the file's first line)."""
    if "~" in name:
        return None
    parts = re.split(r"((?:%[0-9A-F]{2})+)", name.replace("_", ":"))
    return "".join(bytes.fromhex(p.replace("%", "")).decode("utf-8", "replace") if p.startswith("%") else p
                   for p in parts)


def legacy_name(key: str) -> str:
    """The name an older nanobot gave ``key`` (not injective: what the migration undoes)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


def migrate_legacy_names(folder: Path, known_keys: Iterable[str], *, suffix: str = "") -> list[str]:
    """Rename ``folder``'s entries (``<name><suffix>``) made by the old mapping; returns the
    one-line reports of names that two keys could claim (moved into ``.unclaimed/``).

    ``known_keys``: every chat key this home knows of (the histories' own first lines, the
    database's tables).
    """
    if not folder.is_dir():
        return []
    claims: dict[str, set[str]] = {}
    for key in known_keys:
        claims.setdefault(legacy_name(key), set()).add(key)
    reports = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not entry.name.endswith(suffix):
            continue
        old = entry.name[:len(entry.name) - len(suffix)] if suffix else entry.name
        keys = claims.get(old, set())
        if len(keys) > 1:
            reports.append(_set_aside(entry, folder, sorted(keys)))
        elif len(keys) == 1 and (new := chat_name(next(iter(keys))) + suffix) != entry.name:
            _rename(entry, folder / new)
    return reports


def _set_aside(entry: Path, folder: Path, keys: list[str]) -> str:
    aside = folder / UNCLAIMED
    aside.mkdir(mode=0o700, exist_ok=True)
    _rename(entry, aside / entry.name)
    report = (f"{entry} could belong to any of {', '.join(keys)}: moved to {aside / entry.name} for the owner to "
              f"give to one (by hand); neither chat reads it meanwhile")
    log.warning("%s", report)
    return report


def _rename(source: Path, target: Path) -> None:
    if target.exists():
        log.warning("%s was not renamed to %s: that name is taken", source, target.name)
        return
    try:
        os.rename(source, target)
    except FileNotFoundError:  # another worker sharing the folder renamed it first
        return
    log.info("renamed %s to %s (chat names are one per chat now)", source.name, target.name)


# Tables that name chats (a missing one is skipped: that component never ran in this home).
_KEY_QUERIES = ("SELECT DISTINCT session_key FROM model_calls", "SELECT DISTINCT session_key FROM code_state",
                "SELECT DISTINCT chat FROM inbound WHERE chat IS NOT NULL",
                "SELECT DISTINCT session_key FROM history")


def history_key(path: Path) -> str | None:
    """The key a JSONL history names in its first line (written when it was created)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            meta = json.loads(f.readline()).get("_meta")
    except (OSError, ValueError, AttributeError):
        return None
    key = meta.get("key") if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


async def known_chat_keys(db: Queries, sessions: Path | None) -> set[str]:
    """Every chat key a home knows: the JSONL histories' first lines and the database's tables."""
    keys = {key for path in (sessions.glob("*" + HISTORY_SUFFIX) if sessions else ())
            if (key := history_key(path))}
    for sql in _KEY_QUERIES:
        try:
            keys.update(row[0] for row in await db.fetch(sql))
        except Exception as exc:  # no such table (SQLite and asyncpg raise their own types)
            log.debug("chat keys: %s: %s", sql, exc)
    return keys


async def rename_legacy_chats(db: Database, sessions: Path | None, workspace: Path) -> list[str]:
    """Once per database: the JSONL histories (``sessions``, None on PostgreSQL, whose rows are
    keyed by the chat's key) and the member folders under ``workspace/chats``."""
    if await db.fetchval("SELECT version FROM schema_versions WHERE component = 'chat_names'"):
        return []  # the common case: done before (one query, no listing)
    keys = await known_chat_keys(db, sessions)
    reports = migrate_legacy_names(workspace / "chats", keys)
    if sessions is not None:
        reports += migrate_legacy_names(sessions, keys, suffix=HISTORY_SUFFIX)
    await db.migrate("chat_names", DONE)
    return reports
