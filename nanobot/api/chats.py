"""The page's view of chats: a key's conversations (its ``X-Nanobot-Session`` values), each
chat's history, mode and model, files in and out. An owner key also sees every chat of every
channel and reads any one's history (read-only: it writes only to its own conversations).

- ``GET /v1/nanobot/conversations``: the key's conversations, newest first (title: the first
  message; last: the time of the last one); for an owner key also ``chats``: every chat.
- ``GET /v1/nanobot/history`` (``?chat=KEY`` for owners): the chat as it was seen live, and
  ``upto``: where the last message kept for its reader is (a task's result, a job's output).
- ``GET /v1/nanobot/news?after=UPTO``: what was kept for the reader since (the open page shows it).
- ``GET /v1/nanobot/chat``: its mode and model, and the choices its trust allows.
- ``POST /v1/nanobot/upload?name=FILE``: a file into the chat's ``inbox/``; its id goes into a
  message as ``{"type": "file", "file": {"file_id": ID}}`` and through the media pipeline. A
  file inside a message (``nanobot.api.inline_files``) is kept there the same way.
- ``GET /v1/nanobot/files?path=PATH``: a file of the chat's ``inbox/`` or ``sent/``.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

from nanobot import beneath
from nanobot.agent.commands import MODES
from nanobot.api.inline_files import inline_file
from nanobot.chat_names import is_task
from nanobot.listener import read_whole
from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.trust import API_CHANNEL, MEMBER
from nanobot.workspace_quota import WorkspaceFull, check_room

if TYPE_CHECKING:
    from nanobot.api.front_door import FrontDoor

KeyOf = Callable[[web.Request], Awaitable[tuple[str, bool]]]  # (key name, owner?)
SESSION = re.compile(r"[A-Za-z0-9_.-]{1,64}")
FILE_FOLDERS = ("inbox/", "sent/")  # what the page may download: what came in, what the assistant sent
MAX_LISTED = 100
# An upload from a phone may take minutes, holding a connection all along: a key has so many
# open at once, each for so long (20 MB at 33 KB/s), or a slow body could hold connections for ever.
UPLOADS_PER_KEY = 4
UPLOAD_TIME_S = 600.0


class ChatRoutes:
    def __init__(self, door: FrontDoor, key_of: KeyOf, bad_request: Callable[[str], Exception]) -> None:
        self.door = door
        self.key_of = key_of
        self.bad_request = bad_request  # the API's 400 in OpenAI's shape
        self._uploading: Counter[str] = Counter()  # key name -> uploads being read

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/nanobot/history", self.history)
        app.router.add_get("/v1/nanobot/news", self.news)
        app.router.add_get("/v1/nanobot/conversations", self.conversations)
        app.router.add_get("/v1/nanobot/chat", self.settings)
        app.router.add_post("/v1/nanobot/upload", self.upload)
        app.router.add_get("/v1/nanobot/files", self.file)

    # ---- which chat ------------------------------------------------------------------
    def key_chat(self, name: str, request: web.Request) -> str:
        """The key's chat this request is about: ``api:NAME`` or ``api:NAME:SESSION``; Open WebUI
        names its chat in ``X-OpenWebUI-Chat-Id`` when told to forward it (a temporary chat's
        "local:…" is no session: the key's own chat)."""
        session = request.headers.get("X-Nanobot-Session")
        if session is None and SESSION.fullmatch(front_end := request.headers.get("X-OpenWebUI-Chat-Id", "")):
            session = front_end
        if session is None:
            return f"{API_CHANNEL}:{name}"
        if not SESSION.fullmatch(session):
            raise self.bad_request("X-Nanobot-Session must be 1 to 64 letters, digits, '.', '_' or '-'")
        return f"{API_CHANNEL}:{name}:{session}"

    async def _readable_chat(self, request: web.Request) -> tuple[str, bool]:
        """The chat the request reads, and whether its key is an owner's."""
        name, owner = await self.key_of(request)
        other = request.query.get("chat")
        if other is None:
            return self.key_chat(name, request), owner
        if not owner:
            raise web.HTTPForbidden(reason="only an owner key reads other chats")
        return other, owner

    # ---- endpoints -------------------------------------------------------------------
    async def history(self, request: web.Request) -> web.Response:
        chat, _ = await self._readable_chat(request)
        session = await self.door.open_chat(chat)
        return web.json_response({"chat": chat, "messages": shown_history(session.messages)[-200:],
                                  "upto": session.waiting_since("")[1]})

    async def news(self, request: web.Request) -> web.Response:
        """What reached the chat with nobody asking past position ``?after=`` (not marked seen:
        the page keeps its own place); for an owner, how many notices came after
        ``?noticesAfter=`` (the ``id`` of the newest the page showed)."""
        chat, owner = await self._readable_chat(request)
        session = await self.door.open_chat(chat)
        messages, upto = session.waiting_since(request.query.get("after", ""))
        news: dict[str, Any] = {"messages": messages, "upto": upto}
        if owner:
            news["notices"] = await self.door.notices.count_after(_number(request.query.get("noticesAfter")))
        return web.json_response(news)

    async def conversations(self, request: web.Request) -> web.Response:
        name, owner = await self.key_of(request)
        mine = [k for k in await self.door.chats(f"{API_CHANNEL}:{name}", MAX_LISTED)
                if k == f"{API_CHANNEL}:{name}" or k.startswith(f"{API_CHANNEL}:{name}:")]
        listed: dict[str, Any] = {"conversations": [await self._summary(k, session_of=name) for k in mine],
                                  "owner": owner}  # the page shows the owner's views only to an owner key
        if owner:
            every = [k for k in await self.door.chats("", MAX_LISTED) if not is_task(k)]
            listed["chats"] = [await self._summary(k) for k in every]
        return web.json_response(listed)

    async def _summary(self, chat: str, session_of: str | None = None) -> dict[str, Any]:
        session = await self.door.open_chat(chat)
        summary: dict[str, Any] = {"chat": chat, "title": " ".join(session.opening.split())[:60] or "(empty)",
                                   "last": session.messages[-1].get("ts") if session.messages else session.meta.created}
        if session_of is not None:
            summary["session"] = chat[len(f"{API_CHANNEL}:{session_of}:"):] or None
        else:
            agent = self.door.agent
            summary.update(trust=agent.deps.trust(chat), mode=agent.mode_name(session),
                           model=self.door.config.chat_model(chat, session.meta.model,
                                                                member=agent.deps.trust(chat) == MEMBER)[1])
        return summary

    async def settings(self, request: web.Request) -> web.Response:
        chat, _ = await self._readable_chat(request)
        session = await self.door.open_chat(chat)
        agent, config = self.door.agent, self.door.config
        member = agent.deps.trust(chat) == MEMBER
        models = config.agents.member_models if member else list(config.agents.models)
        return web.json_response({"chat": chat, "mode": agent.mode_name(session), "modes": list(MODES),
                                  "model": session.meta.model if session.meta.model in models else "default",
                                  "models": ["default", *models],
                                  "uses": "/".join(config.chat_model(chat, session.meta.model, member=member))})

    async def upload(self, request: web.Request) -> web.Response:
        name, _ = await self.key_of(request)
        chat = self.key_chat(name, request)
        data = await self._received(name, request)
        safe = safe_name(request.query.get("name", "file"))
        relative = await self._keep(await self.door.chat_folder(chat), safe, data)
        return web.json_response({"id": relative, "name": safe, "bytes": len(data)})

    async def _keep(self, root: Path, name: str, data: bytes) -> str:
        """A file (``name`` made safe: ``safe_name``) into the chat's ``inbox/``, never through a link
        the chat made; its id there."""
        relative, config = f"inbox/page_{secrets.token_hex(4)}_{name}", self.door.config
        if len(data) > (limit := config.channels.max_media_mb * 1024 * 1024):  # (an upload was held to it as read)
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(data))
        try:
            await asyncio.to_thread(check_room, config.workspace_path, config.tools.max_workspace_mb, len(data))
            await asyncio.to_thread(beneath.write_bytes, root, relative, data)
        except WorkspaceFull as exc:
            raise web.HTTPInsufficientStorage(text=f"not stored: {exc}") from None
        except (beneath.LinkRefused, NotADirectoryError) as exc:
            raise web.HTTPForbidden(text=f"not stored: {exc}") from None
        return relative

    async def _received(self, name: str, request: web.Request) -> bytes:
        """An upload's body, whole (never cut short): refused over ``maxMediaMb``, over
        ``UPLOADS_PER_KEY`` under way, or slower than ``UPLOAD_TIME_S``."""
        limit = self.door.config.channels.max_media_mb * 1024 * 1024
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        if self._uploading[name] >= UPLOADS_PER_KEY:
            raise web.HTTPTooManyRequests(text=f"this key has {UPLOADS_PER_KEY} uploads under way already")
        self._uploading[name] += 1
        try:
            async with asyncio.timeout(UPLOAD_TIME_S):
                return await read_whole(request.content, limit)
        except TimeoutError:
            raise web.HTTPRequestTimeout(text=f"the file did not arrive within {UPLOAD_TIME_S:.0f} s") from None
        finally:
            self._uploading[name] -= 1

    async def file(self, request: web.Request) -> web.StreamResponse:
        name, _ = await self.key_of(request)
        chat = self.key_chat(name, request)
        path = request.query.get("path", "")
        root = await self.door.chat_folder(chat)
        if not path.startswith(FILE_FOLDERS):
            raise web.HTTPNotFound()
        try:  # checked and served through one descriptor, reached without links: no swap in between
            fd = await asyncio.to_thread(beneath.open_file, root, path)
        except (OSError, ValueError):
            raise web.HTTPNotFound() from None
        with os.fdopen(fd, "rb") as file:
            name = re.sub(r"[^\w.-]", "_", PurePosixPath(path).name)
            response = web.StreamResponse(headers={"Content-Disposition": f'attachment; filename="{name}"',
                                                   "Content-Type": "application/octet-stream",
                                                   "X-Content-Type-Options": "nosniff"})
            response.content_length = os.fstat(fd).st_size
            await response.prepare(request)
            while chunk := await asyncio.to_thread(file.read, 1 << 16):
                await response.write(chunk)
        await response.write_eof()
        return response

    async def media_of(self, chat: str, messages: Any) -> list[str]:
        """The files of the last user message: uploaded ones it names (``file`` parts), checked to
        be this chat's, and ones inside it (``nanobot.api.inline_files``), kept in its inbox."""
        named, inline = [], []
        for part in last_user_parts(messages):
            file_id = (part.get("file") or {}).get("file_id") if isinstance(part, dict) else None
            if isinstance(file_id, str) and file_id.startswith("inbox/") and "/" not in file_id[6:]:
                named.append(file_id)
            try:
                inline += [kept] if (kept := inline_file(part)) else []
            except ValueError as exc:
                raise web.HTTPBadRequest(text=str(exc)) from None
        if not named and not inline:
            return []  # most messages: no need to open the chat here
        root = await self.door.chat_folder(chat)
        kept = [file_id for file_id in named if await asyncio.to_thread(beneath.is_link_free, root, file_id)]
        return kept + [await self._keep(root, safe_name(name), data) for name, data in inline]


def safe_name(name: str) -> str:
    """A file name a sender gave, as the chat's inbox keeps it: its last part, plain characters."""
    return re.sub(r"[^\w.-]", "_", Path(name).name)[-100:] or "file"


def last_user_parts(messages: Any) -> list[Any]:
    """The parts of the last user message (none when its content is a plain string)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message.get("content") if isinstance(message.get("content"), list) else []
    return []


STEP_RESULTS = ("<python_result>", "<tool_result")


def shown_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat as its reader saw it live: each user message and the reply it got, not the steps
    in between (code mode's programs and results, tool calls): the last assistant text before
    the next user message is the reply (``failed`` when it says the turn failed); what was kept
    for the reader since (a cron job's output, a task's result) follows it."""
    shown: list[dict[str, Any]] = []
    reply: dict[str, Any] | None = None
    for m in messages:
        text = m.get("content") if isinstance(m.get("content"), str) else None
        if m.get("role") == "user" and text and (text.startswith(STEP_RESULTS) or text == RESUMED_NOTE):
            continue  # what a program or a text tool call gave back, or the restart note: steps too
        if (m.get("role") == "user" or m.get("kept")) and text:
            shown += [reply] if reply else []
            shown.append({"role": m["role"], "content": as_written(text) if m["role"] == "user" else text})
            reply = None
        elif m.get("role") == "assistant" and text and not m.get("tool_calls"):
            reply = {"role": "assistant", "content": text, **({"failed": True} if m.get("failed") else {})}
    return shown + ([reply] if reply else [])


# The lines the media pipeline added after a message for the model ("[document inbox/a.pdf: 1,234
# characters of text; read it with ... It begins:]" and its preview, "[photo: inbox/b.jpg]"):
# everything from the first of them on is notes about the files the reader sent.
_ATTACHMENT_NOTE = re.compile(r"^\[(?:document|photo:|attached file:|voice note) (?:[^\s\]:]*/)?([^\s\]:]+)[:\]]",
                              re.MULTILINE)
_UPLOADED = re.compile(r"^page_[0-9a-f]{8}_")  # the page's uploads, named in the chat's inbox (upload above)


def as_written(text: str) -> str:
    """A user message as its writer sees it: the notes made for the model about its attached
    files become "📎 name, ..." (as the page shows them live), not prompt text."""
    first = _ATTACHMENT_NOTE.search(text)
    if first is None:
        return text
    names = [_UPLOADED.sub("", name) for name in _ATTACHMENT_NOTE.findall(text, first.start())]
    return f"{text[:first.start()].strip()}\n📎 {', '.join(names)}".strip()


def _number(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0
