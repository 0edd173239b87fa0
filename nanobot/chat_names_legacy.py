"""Homes named before chat names were one per chat, renamed once at start.

A file or folder goes to its key's new name (``chat_names.chat_name``) when only one known key
could have made its old name; a name that two known keys could both claim is moved aside into
``.unclaimed/`` and reported in one line, never given to either and never merged.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from nanobot.chat_names import HISTORY_SUFFIX, chat_name, history_key

if TYPE_CHECKING:
    from nanobot.database import Database, Migrations, Queries

log = logging.getLogger(__name__)

UNCLAIMED = ".unclaimed"  # never a chat's name: a new name cannot start with "."
# Recorded in schema_versions once the renaming is done: from then on every name is the new
# mapping's (the database, not a file, holds it: workers sharing a workspace share the database).
DONE: Migrations = {"sqlite": ["SELECT 1"], "postgresql": ["SELECT 1"]}


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
