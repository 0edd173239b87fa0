"""The system prompt: who the assistant is (workspace files), when and where it is, and how
its chosen execution mode works. Prompt text lives in ``nanobot/prompts/``, not in code."""

from __future__ import annotations

import logging
import re
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from nanobot import beneath
from nanobot.filecache import StampedCache
from nanobot.prompts import render_prompt

cache_log = logging.getLogger("nanobot.prompt_cache")

# The assistant's steering files, from the workspace root: every chat gets who the assistant is;
# only owner chats get USER.md (about the owner). Memory comes from the chat's own root.
PERSONA_FILES = ("AGENTS.md", "SOUL.md", "TOOLS.md")
OWNER_FILES = ("USER.md",)
MEMORY_FILE = "memory/MEMORY.md"


_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def _read_stripped(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return _stripped(file.read())


def _stripped(text: str) -> str:
    """A file's text for the prompt: without ``<!-- -->`` notes to the human, and empty when
    nothing but headings is left (an untouched template costs no prompt)."""
    text = _COMMENT.sub("", text).strip()
    has_content = any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())
    return text if has_content else ""


_steering = StampedCache(_read_stripped)  # the files above, read again only when they change


def workspace_sections(workspace: Path, chat_root: Path | None = None, *, owner: bool = True) -> str:
    """The steering files' text; a member chat (``owner=False``) gets its own memory, not the owner's."""
    root = chat_root or workspace
    names = [*PERSONA_FILES, *(OWNER_FILES if owner else ())]
    files = [(name, workspace / name) for name in names] + ([(MEMORY_FILE, root / MEMORY_FILE)] if owner else [])
    parts = []
    for name, path in files:
        try:
            text = _steering.get(path)
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            parts.append(f"## {name}\n{text}")
    if not owner and (memory := member_memory(root)):
        parts.append(f"## {MEMORY_FILE}\n{memory}")
    return "\n\n".join(parts)


def member_memory(root: Path) -> str:
    """A member chat's own memory, read without following a link the chat made (``beneath``)."""
    try:
        return _stripped(beneath.read_bytes(root, MEMORY_FILE, 1 << 20).decode("utf-8"))
    except (OSError, ValueError):
        return ""


def now_line(timezone: str) -> str:
    try:
        zone = ZoneInfo(timezone)
    except Exception:  # an unknown zone must not break every turn; config validation reports it
        zone = ZoneInfo("UTC")
    now = datetime.now(zone)
    return f"{now:%A %Y-%m-%d %H:%M} ({timezone})"


# What a chat is, said to the model: where it is, and where what it schedules will arrive.
_CHAT_KINDS = {"cli": "the terminal: what arrives waits for the user", "api": "an API conversation",
               "heartbeat": "the heartbeat"}


# The terminal without a gateway: nothing runs jobs, so run_cron cannot test one (a call the
# model paid in every mode to find out).
NO_GATEWAY = "no gateway runs now: jobs wait; test one by running its code, not run_cron"


def chat_line(session_key: str, *, gateway: bool = True) -> str:
    channel = session_key.partition(":")[0]
    kind = _CHAT_KINDS.get(channel, f"on {channel.capitalize()}")
    return f"Chat: {session_key} ({kind}{'' if gateway else '; ' + NO_GATEWAY}); scheduled output comes here."


def sent_at(timezone: str) -> str:
    """When a user message is sent, as it ends that message. The time goes there, not into the
    system prompt: a new minute then changes nothing sent before, and the provider's prompt
    cache reuses every earlier byte of the chat (a time up front missed it on every turn)."""
    return f"(sent {now_line(timezone)})"


def build_system_prompt(workspace: Path, mode_section: str, extra: str = "", *,
                        chat_root: Path | None = None, owner: bool = True, chat: str = "", gateway: bool = True) -> str:
    """What every chat of a mode shares first (identity, rules, functions, skills, the persona
    files), then what is the chat's own (its memory, name and folder): two chats share the
    longest prefix a prompt cache can reuse."""
    root = chat_root or workspace
    text = render_prompt("system.md", chat=chat_line(chat, gateway=gateway) if chat else "", workspace=root,
                         workspace_files=workspace_sections(workspace, root, owner=owner), extra=extra,
                         mode_section=mode_section)
    return re.sub(r"\n{3,}", "\n\n", text).strip().replace("\n\n Workspace", "\n\nWorkspace") + "\n"


def cache_starts_over(session_key: str, why: str) -> None:
    """One of the few changes that rewrite bytes a provider's prompt cache holds (``/new``, a
    memory fold, a model or mode switch): said once each, at debug, so a cache miss is explained."""
    cache_log.debug("[%s] the prompt cache starts over: %s", session_key, why)
