"""Chat histories: an append-only journal of JSON records per session.

The first record is metadata (key, created, settings). Every later change is appended, never
rewritten: messages as they happen, ``{"_meta": {...}}`` records for settings such as the
execution mode, a ``{"_reset": ...}`` record for ``/new`` and ``{"_failed": 1}`` when a turn
failed before doing anything (its message stays for the reader, out of the prompts; older
histories took it back with ``{"_drop": n}``). Loading replays them.

Two journals hold them: a JSONL file per session (``session_files``, the default), or one
database row per record (``session_rows``, ``database.url`` PostgreSQL), the same JSON as a
JSONL line.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

from nanobot.chat_state import ChatState
from nanobot.utf8 import clean_text


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# Messages of a chat held in memory past what memory has folded (the page shows the last 200).
KEEP_IN_MEMORY = 200
MAX_WAITING = 20  # messages a reader who was away is shown at their return (Session.wait_for_reader)


class Journal(Protocol):
    """Where a session's records go, in order."""

    @property
    def empty(self) -> bool:
        """Nothing recorded yet (the next record is the first)."""

    @property
    def writing(self) -> bool:
        """Records are queued and not in the store yet (the database's): until they are, the
        session stays loaded, or the chat's next load and the shutdown's flush would miss them."""

    def write(self, record: dict[str, Any]) -> None:
        """Record at once, in order (handed to the OS, or queued for the database)."""

    def sync(self) -> None:
        """Make what was written durable (the JSONL file: fsync now)."""

    async def sync_soon(self) -> None:
        """``sync`` without holding up the event loop; returns once it is durable."""

    def close(self) -> None: ...

    def abandon(self) -> None:
        """Drop what is not written yet, and write nothing more (``Histories.discard``)."""


@dataclass
class Session:
    key: str
    journal: Journal
    meta: ChatState = field(default_factory=ChatState)
    # Since the last /new, but the first ``offset`` of them: those memory has folded are let go
    # (``forget_folded``), so a chat that runs for months holds a bounded tail in memory.
    messages: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0
    opening: str = ""  # its first user message since /new (a conversation's title), kept when let go
    _started: bool = False

    # ---- positions since /new (what ``meta`` counts in) -----------------------------------
    @property
    def count(self) -> int:
        """Messages since the last /new, those let go included."""
        return self.offset + len(self.messages)

    def message(self, index: int) -> dict[str, Any] | None:
        """The ``index``-th message since /new, if it is still held."""
        return self.messages[index - self.offset] if self.offset <= index < self.count else None

    def folded_upto(self) -> int:
        """How many messages since /new memory consolidation has covered: 0 if unknown. A
        marker from before a /new (or otherwise out of step) fails its timestamp check and
        counts as 0, so nothing is hidden from the prompt by mistake."""
        upto = self.meta.consolidated_upto
        last = self.message(upto - 1) if upto else None
        return upto if upto and last is not None and last.get("ts") == self.meta.consolidated_ts else 0

    def forget_folded(self) -> None:
        """Let go of the messages memory has folded, all but the newest ``KEEP_IN_MEMORY`` (the
        last folded one stays: its timestamp checks the marker), never the current turn's."""
        started = self.meta.intake_started_at
        limit = min(self.count - KEEP_IN_MEMORY, self.folded_upto() - 1,
                    started if started is not None else self.count)
        if limit > self.offset:
            del self.messages[:limit - self.offset]
            self.offset = limit

    # ---- reading ---------------------------------------------------------------------
    def history(self, window: int) -> list[dict[str, Any]]:
        """The last ``window`` messages as the model expects them, starting at a user message.

        Cutting in the middle of a tool exchange would leave tool results without the call
        that asked for them, which providers reject; so the window starts at a user turn.
        """
        recent = [m for m in self.messages[-window:] if not m.get("failed")]  # kept for the reader only
        for i, message in enumerate(recent):
            if message.get("role") == "user":
                recent = recent[i:]
                break
        else:
            recent = []
        return _merge_assistant_runs(_complete_tool_exchanges([as_sent(m) for m in recent]))

    # ---- writing ---------------------------------------------------------------------
    def append(self, message: dict[str, Any]) -> None:
        """Record one message at once (flushed to the OS; fsync happens at the end of the turn)."""
        record = {**clean_text(message), "ts": _now()}
        self.hold(record)
        self._write(record)

    def hold(self, record: dict[str, Any]) -> None:
        self.messages.append(record)
        if not self.opening and record.get("role") == "user" and isinstance(record.get("content"), str):
            self.opening = record["content"]

    def set_meta(self, **values: Any) -> None:
        """Change fields of the chat's ``ChatState`` and record the change."""
        self.meta.check(values)
        for name, value in values.items():
            setattr(self.meta, name, value)
        self._write({"_meta": values})

    def mark_failed(self) -> None:
        """The last message (a turn's, which failed before doing anything) stays for its reader
        but is left out of later prompts: the next turn does not answer it again."""
        if self.messages:
            self.messages[-1]["failed"] = True
            self._write({"_failed": 1})

    def reset(self) -> None:
        """``/new``: later turns start from an empty history; the old lines stay in the file."""
        self.messages, self.offset, self.opening = [], 0, ""
        self._write({"_reset": _now()})
        if self.meta.waiting:  # positions in the history left behind
            self.set_meta(waiting=[])
        if self.meta.consolidation_retry_at is not None:  # a count of the history left behind
            self.set_meta(consolidation_retry_at=None)

    def keep_for_reader(self, text: str) -> None:
        """A message for a chat nobody can be sent to (the terminal, an API conversation): kept
        in the history for the reader who comes back (``waiting_messages``); marked ``kept``, so a
        history shown to its reader tells it from the reply before it."""
        self.append({"role": "assistant", "content": text, "kept": True})
        self.wait_for_reader(self.count - 1)

    def wait_for_reader(self, position: int) -> None:
        """The message at ``position`` is shown to the reader when they come back (the newest
        ``MAX_WAITING``: an API chat's reader never marks them, and a month away is in the history)."""
        self.set_meta(waiting=[*self.meta.waiting, position][-MAX_WAITING:])

    def waiting_messages(self, after: int = -1) -> list[str]:
        """What waits for the reader past position ``after``, oldest first (``mark_seen`` once
        shown): not the replies to what they typed meanwhile; what memory folded away is gone."""
        return [m["content"] for m in (self.message(p) for p in self.meta.waiting if p > after) if m is not None]

    def waiting_since(self, shown: str) -> tuple[list[str], int]:
        """For a reader who showed what waited up to position ``shown`` (as a query gives it): what
        waits past it, and the last position that waits (-1: none). A position past the end means
        a /new since: all that waits is new then."""
        after = int(shown) if shown.isdigit() and int(shown) < self.count else -1
        return self.waiting_messages(after), self.meta.waiting[-1] if self.meta.waiting else -1

    def mark_seen(self, upto: int) -> None:
        """What waited, up to position ``upto``, was shown (what came since still waits)."""
        if any(position <= upto for position in self.meta.waiting):
            self.set_meta(waiting=[position for position in self.meta.waiting if position > upto])

    def sync(self) -> None:
        self.journal.sync()

    async def sync_soon(self) -> None:
        """``sync`` off the event loop: on a busy disk an fsync can take long, and every other
        chat (and the marks of sent replies) must not wait for it."""
        await self.journal.sync_soon()

    def close(self) -> None:
        self.journal.close()

    def _write(self, record: dict[str, Any]) -> None:
        if not self._started:
            self._started = True
            if self.journal.empty:  # a new history begins with the chat's key and settings
                self.meta.created = self.meta.created or _now()
                self.journal.write({"_meta": {"key": self.key, **self.meta.record()}})
        self.journal.write(record)


def as_sent(message: dict[str, Any]) -> dict[str, Any]:
    """A history record as the model is sent it, the same way every time: without the record's
    own marks (``ts``, ``kept``), and a user message's ``sent`` time at the end of its text."""
    sent = {k: v for k, v in message.items() if k not in ("ts", "sent", "kept")}
    if isinstance(message.get("sent"), str):
        content = sent.get("content")
        if isinstance(content, str):
            sent["content"] = f"{content}\n\n{message['sent']}"
        elif isinstance(content, list):
            sent["content"] = [*content, {"type": "text", "text": message["sent"]}]
    return sent


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


class Histories(Protocol):
    """Where every chat's history lives: JSONL files (SessionStore) or a database table."""

    def get(self, key: str) -> Session:
        """The chat's session, once ``open`` loaded it (RuntimeError before: on both stores)."""

    async def open(self, key: str) -> Session:
        """The chat's session, loaded if it was not."""

    async def exists(self, key: str) -> bool: ...

    async def records(self, key: str) -> list[dict[str, Any]]: ...

    async def chats(self, prefix: str = "", limit: int = 100) -> list[str]:
        """The chats with a history whose key starts with ``prefix``, most recently written first."""

    async def flush(self) -> None:
        """Wait until what every open session wrote is durable."""

    def close(self, key: str | None = None) -> None: ...

    def discard(self, key: str) -> None:
        """Forget the chat without writing what it has not written yet: among workers, a chat
        this worker was cut off from is another's now, which runs its unfinished turns again."""


MAX_OPEN = 1000  # sessions a store keeps loaded (OpenSessions)


class OpenSessions:
    """The sessions a store has loaded (the base of both stores): the ``max_open`` most recently
    used are kept, so chats that are gone (or 100,000 made-up API sessions) do not pile up in
    memory for months. One still in use (a running turn holds it) is found again through a weak
    reference, so a chat never has two ``Session`` objects at once."""

    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._alive: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()

    def get(self, key: str) -> Session:
        """The chat's session, which ``open`` loaded: the same contract on both stores (a file
        store that loaded it here would hide, in every SQLite test, a path that forgot to open)."""
        session = self._cached(key)
        if session is None:  # a programming error: every path into a chat opens it first
            raise RuntimeError(f"session {key!r} used before it was opened (await sessions.open(key))")
        return session

    def _cached(self, key: str) -> Session | None:
        session = self._open.get(key)
        if session is not None:
            self._open.move_to_end(key)
            return session
        session = self._alive.get(key)
        if session is not None:
            self._keep(key, session)
        return session

    def _keep(self, key: str, session: Session) -> Session:
        self._open[key] = self._alive[key] = session
        # Over the bound the least recently used go first; one whose records still wait for the
        # database stays until they are in (its next load and the shutdown's flush need them).
        excess = len(self._open) - self.max_open
        if excess > 0:
            for old in list(self._open):
                if excess == 0:
                    break
                if not self._open[old].journal.writing:
                    self._open.pop(old).close()  # its file is reopened if a turn still holding it writes again
                    excess -= 1
        return session

    async def flush(self) -> None:
        await asyncio.gather(*(session.sync_soon() for session in list(self._alive.values())))

    def close(self, key: str | None = None) -> None:
        keys = [key] if key else list(self._alive)
        for k in keys:
            self._open.pop(k, None)
            session = self._alive.pop(k, None)
            if session:
                session.close()

    def discard(self, key: str) -> None:
        self._open.pop(key, None)
        session = self._alive.pop(key, None)
        if session:
            session.journal.abandon()


def replay(session: Session, records: Iterable[dict[str, Any]]) -> None:
    """Rebuild a session's state from its records, in order."""
    for record in records:
        if "_meta" in record and isinstance(record["_meta"], dict):
            session.meta.merge(record["_meta"])
        elif "_reset" in record:
            session.messages, session.offset, session.opening = [], 0, ""
        elif "_failed" in record and session.messages:
            session.messages[-1]["failed"] = True
        elif "_drop" in record and isinstance(record["_drop"], int) and record["_drop"] > 0:  # older histories
            del session.messages[-record["_drop"]:]
        elif "role" in record:
            session.hold(record)
            if len(session.messages) > 2 * KEEP_IN_MEMORY:
                session.forget_folded()  # a long history is read in bounded memory too
    session.forget_folded()
