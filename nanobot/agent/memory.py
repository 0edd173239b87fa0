"""Long-term memory: fold the old part of a chat into ``memory/MEMORY.md`` and ``memory/HISTORY.md``.

``MEMORY.md`` (lasting facts about the user and their projects) is in every system prompt.
The prompt carries at most ``memoryWindow`` recent messages of the chat, so without help
whatever fell out of the window would be forgotten. Policy:

- When a chat holds more than ``memoryWindow`` messages not yet consolidated, everything
  before its last ``memoryWindow // 2`` messages is consolidated, cut so that the kept part
  starts at a user message, and at most ``memoryWindow`` messages per call (a backlog
  left by failures is worked off over several turns).
- One model call turns that part and the current ``MEMORY.md`` into the whole new
  ``MEMORY.md`` and one dated paragraph appended to ``HISTORY.md`` (a greppable log; it is not
  in the prompt, the model can search it with its tools).
- The session meta records how far this got (``consolidated_upto`` = messages since the
  last ``/new`` that are done, with ``consolidated_ts``, the last one's timestamp, which
  tells a stale marker from before a ``/new`` apart). From then on the prompt carries only
  messages after that point (still at most ``memoryWindow``). The JSONL keeps everything.
- A malformed answer or a failed call changes nothing (MEMORY.md is never replaced by a bad
  answer); it is logged and retried once the chat has grown by half a window more (kept in the
  session meta, ``consolidation_retry_at``: a restart or a one-shot ``nanobot agent -m`` does
  not pay for the same try again; ``/new`` clears it).

Consolidation runs after the reply is produced, as a background task the ``Consolidator``
owns: the user never waits for it, and ``close()`` awaits it (bounded) at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from nanobot import beneath
from nanobot.prompts import render_prompt
from nanobot.agent.context import cache_starts_over
from nanobot.agent.markup import strip_think
from nanobot.agent.spend import metered_chat
from nanobot.providers.base import ChatRequest, ProviderError
from nanobot.trust import MEMBER, chat_scope
from nanobot.eventloop import cancel_and_wait

if TYPE_CHECKING:
    from nanobot.agent.deps import AgentDeps
    from nanobot.session import Session

log = logging.getLogger(__name__)

MEMORY_FILE = "memory/MEMORY.md"
HISTORY_FILE = "memory/HISTORY.md"
MAX_MESSAGE_CHARS = 2000  # per message in the transcript given to the consolidation call
MAX_TOOL_RESULT_CHARS = 500
SHUTDOWN_GRACE_S = 30.0


# ---------------------------------------------------------------------------------- the window


def prompt_history(session: Session, window: int) -> list[dict[str, Any]]:
    """The history the prompt carries: the last ``window`` messages, none already consolidated."""
    count = min(window, session.count - session.folded_upto())
    return session.history(count) if count > 0 else []


def plan_cut(session: Session, start: int, window: int) -> int | None:
    """Where the next consolidation ends (exclusive), or None while the rest fits the window.

    Everything before the last ``window // 2`` messages goes, at most ``window`` messages at
    a time, ending where a user message begins so the kept part starts a turn. (Positions
    count from /new; what comes after ``start`` is always held.)
    """
    total = session.count
    if total - start <= window:
        return None
    target = min(total - window // 2, start + window)
    users = [i for i in range(start + 1, total) if (session.message(i) or {}).get("role") == "user"]
    before = [i for i in users if i <= target]
    if before:
        return before[-1]
    after = [i for i in users if i > target]
    return after[0] if after else None


# ---------------------------------------------------------------------------------- files


class MemoryFiles:
    """``memory/MEMORY.md`` (replaced atomically: temp file, fsync, rename) and
    ``memory/HISTORY.md`` (appended) under a chat's root, never through a link a member made
    there (``beneath``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_memory(self) -> str:
        try:
            return beneath.read_bytes(self.root, MEMORY_FILE).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def write_memory(self, text: str) -> None:
        beneath.write_bytes(self.root, MEMORY_FILE, text.encode("utf-8"))

    def append_history(self, entry: str) -> None:
        beneath.append_text(self.root, HISTORY_FILE, entry.rstrip("\n") + "\n\n",
                            header="# Conversation history\nOne entry per consolidated part of a chat, oldest first.\n\n")


# ---------------------------------------------------------------------------------- the call


@dataclass
class Consolidation:
    memory: str
    history: str


def transcript(messages: list[dict[str, Any]]) -> str:
    """The messages as plain text for the consolidation call; long contents are shortened."""
    lines = []
    for m in (m for m in messages if not m.get("failed")):  # a failed turn's message was never answered
        stamp = f"[{m['ts'][:16].replace('T', ' ')}] " if isinstance(m.get("ts"), str) else ""
        role = m.get("role", "?")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if role == "tool":
            lines.append(f"{stamp}tool {m.get('name', '')} returned: {_shorten(content or '', MAX_TOOL_RESULT_CHARS)}")
            continue
        if content:
            lines.append(f"{stamp}{role}: {_shorten(content, MAX_MESSAGE_CHARS)}")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            lines.append(f"{stamp}{role} called {fn.get('name')}({_shorten(fn.get('arguments', ''), 300)})")
    return "\n".join(lines)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def parse_answer(text: str | None) -> Consolidation:
    """The model's ``{"memory": ..., "history": ...}``; ValueError if it is anything else."""
    text = strip_think(text)
    fenced = _FENCED.search(text)
    if fenced:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the answer")
    try:
        data = json.loads(text[start:end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the answer is not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    memory, history = data.get("memory"), data.get("history")
    if not isinstance(memory, str) or not memory.strip():
        raise ValueError("'memory' is missing or empty")
    if not isinstance(history, str) or not history.strip():
        raise ValueError("'history' is missing or empty")
    return Consolidation(memory.strip() + "\n", " ".join(history.split()))


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except Exception:  # an unknown zone is reported by config validation; never fail here
        return ZoneInfo("UTC")


def _local(ts: str | None, zone: str) -> datetime:
    """A message timestamp (or, without one, now) in the user's timezone."""
    try:
        return datetime.strptime(ts or "", "%Y-%m-%dT%H:%M:%S%z").astimezone(_zone(zone))
    except ValueError:
        return datetime.now(_zone(zone))


# ---------------------------------------------------------------------------------- the owner


class Consolidator:
    """Runs consolidations in the background, one at a time per chat, and awaits them at exit."""

    def __init__(self, deps: AgentDeps) -> None:
        self.deps = deps
        self._tasks: dict[str, asyncio.Task[bool]] = {}
        self._file_lock = asyncio.Lock()  # MEMORY.md is shared by every chat: one writer at a time

    def schedule(self, session: Session, mode: str = "tools") -> asyncio.Task[bool] | None:
        """Start a consolidation for the chat if its history passed the window; returns the task."""
        if session.key in self._tasks:
            return None  # one at a time per chat; the next turn looks again
        window = self.deps.config.agent_for(session.key).memory_window
        if plan_cut(session, session.folded_upto(), window) is None:
            return None
        if session.count < (session.meta.consolidation_retry_at or 0):
            return None
        task = asyncio.create_task(self._guarded(session, mode), name=f"memory:{session.key}")
        self._tasks[session.key] = task
        task.add_done_callback(lambda t, key=session.key: self._tasks.pop(key, None) if self._tasks.get(key) is t
                               else None)
        return task

    async def _guarded(self, session: Session, mode: str) -> bool:
        try:
            return await self.consolidate(session, mode)
        except asyncio.CancelledError:
            raise
        except Exception:  # a background task must not die silently
            log.exception("%s: memory consolidation failed", session.key)
            self._retry_later(session)  # not on every turn: each try is a model call
            return False

    def _retry_later(self, session: Session) -> None:
        window = self.deps.config.agent_for(session.key).memory_window
        session.set_meta(consolidation_retry_at=session.count + max(window // 2, 1))

    async def consolidate(self, session: Session, mode: str = "tools") -> bool:
        """Consolidate the part of the chat that is due, now; True if memory moved on."""
        settings = self.deps.config.agent_for(session.key)
        start = session.folded_upto()
        cut = plan_cut(session, start, settings.memory_window)
        if cut is None:
            return False
        part = session.messages[start - session.offset:cut - session.offset]
        first, last = session.messages[0], part[-1]
        # a member chat: its own folder
        _, root = chat_scope(self.deps.config, session.key, session.meta.peer, self.deps.api_owners)
        files = MemoryFiles(root)
        async with self._file_lock:
            for _ in range(2):
                memory = files.read_memory()
                result = await self._ask(session, mode, memory, part)
                # The agent may have edited MEMORY.md itself meanwhile: redo the merge on the new
                # text rather than overwrite the edit (once; then give up until later).
                if result is None or files.read_memory() == memory:
                    break
                result = None
            if result is None:
                self._retry_later(session)
                return False
            if session.meta.consolidation_retry_at is not None:
                session.set_meta(consolidation_retry_at=None)
            files.write_memory(result.memory)
            when = _local(part[0].get("ts"), settings.timezone)
            files.append_history(f"[{when:%Y-%m-%d %H:%M}] {session.key}: {result.history}")
        if session.messages and session.messages[0] is first and cut <= session.count:
            session.set_meta(consolidated_upto=cut, consolidated_ts=last.get("ts"))
            session.sync()
            session.forget_folded()
            cache_starts_over(session.key, f"memory fold of {len(part)} messages")
        else:  # /new while we worked: the facts are saved, but the old marker means nothing now
            log.info("%s: history reset during memory consolidation", session.key)
        log.info("%s: consolidated %d messages into memory", session.key, len(part))
        return True

    async def _ask(self, session: Session, mode: str, memory: str, part: list[dict[str, Any]]) -> Consolidation | None:
        settings = self.deps.config.agent_for(session.key)
        now = datetime.now(_zone(settings.timezone))
        system = render_prompt("memory_consolidation.md", today=f"{now:%A %Y-%m-%d}").strip()
        user = (f"<current_memory>\n{memory.strip() or '(empty)'}\n</current_memory>\n\n"
                f"<conversation session=\"{session.key}\">\n{transcript(part)}\n</conversation>")
        request = ChatRequest(messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                              model=settings.model, max_tokens=settings.max_tokens, temperature=0.0,
                              provider=settings.provider, fallbacks=settings.fallback_models())
        try:
            response = await metered_chat(self.deps, request, session_key=session.key, mode=mode, purpose="memory",
                                          member=self.deps.trust(session.key) == MEMBER)
        except ProviderError as exc:  # the budget too: consolidation waits for tomorrow
            log.warning("%s: memory consolidation call failed: %s", session.key, exc)
            return None
        try:
            return parse_answer(response.content)
        except ValueError as exc:
            log.warning("%s: memory consolidation answer unusable, MEMORY.md left as it was: %s", session.key, exc)
            return None

    async def drain(self) -> None:
        """Wait for every running consolidation (tests, and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self, timeout: float = SHUTDOWN_GRACE_S) -> None:
        """Let running consolidations finish (they save memory), cancelling them after ``timeout``."""
        if not self._tasks:
            return
        try:
            await asyncio.wait_for(self.drain(), timeout)
        except TimeoutError:
            log.warning("memory consolidation still running after %.0fs at shutdown; cancelled", timeout)
            tasks = list(self._tasks.values())
            await cancel_and_wait(*tasks)
