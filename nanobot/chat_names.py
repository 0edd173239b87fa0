"""A chat's key as a file or folder name: ``sessions/<name>.jsonl`` and ``chats/<name>/``.

The mapping must be injective, or two chats share one history and one member folder (before,
every character outside ``[A-Za-z0-9._-]`` became ``_``, so ``api:team:admin`` and
``api:team_admin`` were one file). It stays readable: ``:`` becomes ``_`` (so the usual names,
``telegram_123`` or ``telegram_-100987``, are what they were), and every other character outside
``[A-Za-z0-9.-]`` (``_`` and ``%`` included) becomes ``%XX`` per UTF-8 byte, which ``key_of``
reverses. A leading ``.`` is escaped too (no hidden or ``..`` names). A name that would pass
``MAX_NAME`` characters is cut and ends in ``~`` and a hash of the whole key; ``~`` is escaped
everywhere else, so a cut name never equals an uncut one.

Homes named by the older mapping are renamed once at start: ``chat_names_legacy``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

HISTORY_SUFFIX = ".jsonl"
MAX_NAME = 200  # file names are limited to 255 bytes; the suffix and the hash fit under it
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


# A background task's history is "task:<id>:<chat>": its own channel, which no adapter has, so
# no chat id a platform (or a sender) chooses can name one. (A suffix once could: an email
# address holding "/task-zz" ran in another chat's folder.)
TASK_CHANNEL = "task"


def task_key(chat: str, task_id: str) -> str:
    """The history of background task ``task_id`` of ``chat`` (its own, beside the chat's)."""
    return f"{TASK_CHANNEL}:{task_id}:{chat}"


def is_task(session_key: str) -> bool:
    return session_key.startswith(TASK_CHANNEL + ":")


def parent_chat(session_key: str) -> str:
    """The chat a session belongs to: itself, or the chat that spawned a background task."""
    return session_key.split(":", 2)[2] if is_task(session_key) else session_key


def history_file(key: str) -> str:
    return chat_name(key) + HISTORY_SUFFIX


def key_of(name: str) -> str | None:
    """The key a name stands for, or None for a cut name (its key is in the file's first line)."""
    if "~" in name:
        return None
    parts = re.split(r"((?:%[0-9A-F]{2})+)", name.replace("_", ":"))
    return "".join(bytes.fromhex(p.replace("%", "")).decode("utf-8", "replace") if p.startswith("%") else p
                   for p in parts)


def history_key(path: Path) -> str | None:
    """The key a JSONL history names in its first line (written when it was created)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            meta = json.loads(f.readline()).get("_meta")
    except (OSError, ValueError, AttributeError):
        return None
    key = meta.get("key") if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None
