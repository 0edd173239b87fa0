"""A stand-in Telegram Bot API server on loopback, for driving the real python-telegram-bot.

Usage::

    async with FakeTelegram() as tg:            # listens on 127.0.0.1, a random port
        config = TelegramConfig(enabled=True, token=tg.token, api_base=tg.api_base, ...)
        ...start the channel...
        tg.push_text(42, 42, "hi")               # chat_id, user_id, text: the next getUpdates gets it
        sent = await tg.wait_sent(1)             # [{"chat_id": 42, "text": ..., "parse_mode": ...}]

Users: ``push_text`` (adds /command and @mention entities; ``chat_type="group"``,
``reply_to_bot=True``, ``username=``), ``push_document``, ``push_photo``, ``push_message``
(any Message fields), ``push_update`` (a raw Update).
Trouble: ``fail_sends(2, retry_after=1)`` (the next two sendMessage calls answer 429),
``fail_all(calls=3)`` / ``fail_all(seconds=0.5)`` (502 to every Bot API call; ``fail_all()``
ends it). Like Telegram, sendMessage answers 400 to badly nested HTML ("can't parse
entities") and to text over 4096 UTF-16 units after parsing.
Drafts (sendMessageDraft, private chats only) are recorded in ``drafts``; ``drafts_served =
False`` answers them 404, as a Bot API server from before them does.
Buttons: ``push_button(sent_message, user, data)`` presses one of an inline keyboard (a
callback query); ``answered_buttons`` holds the queries answered.
Recorded: ``sent`` (sendMessage params plus ``message_id``), ``edits``, ``actions``
(sendChatAction), ``calls`` (every method name, in order), ``failed`` (502s answered),
``conflicts`` (a getUpdates while another was open: 409, as Telegram), ``webhook``
(setWebhook's parameters; getUpdates is refused while one is set).
Waiting, event-driven: ``wait_sent(n)``, ``wait_calls(method, n)``, ``wait_until(predicate)``.
Parameters arrive form-encoded (PTB JSON-encodes non-string values) or as JSON; both are
decoded to Python values.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.fakes.loopback import serve

_STRING_PARAMS = {"text", "caption", "parse_mode", "action", "file_id", "inline_message_id"}


class FakeTelegram:
    def __init__(self, token: str = "123456:TEST-TOKEN", bot_id: int = 123456,
                 bot_username: str = "nanobot_test_bot") -> None:
        self.token, self.bot_id, self.bot_username = token, bot_id, bot_username
        self.sent: list[dict[str, Any]] = []
        self.edits: list[dict[str, Any]] = []
        self.drafts: list[dict[str, Any]] = []  # sendMessageDraft params
        self.answered_buttons: list[str] = []  # answerCallbackQuery's ids: a pressed button answered
        self.drafts_served = True
        self.files: list[dict[str, Any]] = []  # sendPhoto / sendDocument / sendVoice: method, chat_id, caption, filename, data
        self.confirm_updates = True
        self.pushed_at: dict[int, float] = {}  # update_id -> when it was queued (for latency figures)
        self.held: dict[str, asyncio.Event] = {}  # method -> answers wait until the event is set
        self.holding: dict[str, int] = {}  # method -> answers held so far
        self._hold_when: dict[str, Callable[[dict[str, Any]], bool]] = {}  # method -> which calls are held
        self.actions: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.polling = 0  # getUpdates calls open now
        self.conflicts = 0  # getUpdates while another was open: real Telegram answers 409 Conflict
        self.handed_out: set[int] = set()  # update ids a getUpdates has returned
        self.webhook: dict[str, Any] | None = None  # setWebhook's parameters (url, secret_token, ...)
        self.commands: list[dict[str, str]] = []  # setMyCommands': the menu shown when "/" is typed
        self._updates: list[dict[str, Any]] = []
        self._next_update_id = 1
        self._next_message_id = 1000
        self._files: dict[str, tuple[str, bytes]] = {}  # file_id -> (file_path, content)
        self._chat_types: dict[int, str] = {}
        self._send_429: list[float] = []  # retry_after for each of the next failing sendMessage calls
        self._fail_calls = 0
        self.failed = 0  # how many calls were answered 502
        self._fail_until = 0.0
        self._tick = asyncio.Event()  # set and replaced on every change, so waiters re-check
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle ------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        """What goes into ``channels.telegram.apiBase``."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        # A client that hangs up (a killed poller) ends its long poll here too, as at Telegram.
        self._runner, self.port = await serve(app, shutdown_timeout=0.5, handler_cancellation=True)
        return self

    async def stop(self) -> None:
        self._closing = True  # releases pending long polls
        for held in self.held.values():
            held.set()
        self._notify()
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- what users "do" ------------------------------------------------------------
    def push_update(self, update: dict[str, Any]) -> dict[str, Any]:
        """Queue a raw Update (``update_id`` is assigned) for the bot's next getUpdates."""
        update = {"update_id": self._next_update_id, **update}
        self.pushed_at[update["update_id"]] = time.monotonic()
        self._next_update_id += 1
        self._updates.append(update)
        self._notify()
        return update

    def push_message(self, chat_id: int, user_id: int, *, username: str | None = "alice",
                     chat_type: str = "private", reply_to_bot: bool = False, **fields: Any) -> dict[str, Any]:
        """Queue a message update with any Message fields (text, caption, document, photo...)."""
        self._chat_types[chat_id] = chat_type
        chat = {"id": chat_id, "type": chat_type}
        chat.update({"username": username} if chat_type == "private" else {"title": "Test group"})
        sender = {"id": user_id, "is_bot": False, "first_name": (username or "user").title()}
        if username:
            sender["username"] = username
        message = {"message_id": self._new_message_id(), "date": int(time.time()), "chat": chat,
                   "from": sender, **fields}
        if reply_to_bot:
            message["reply_to_message"] = self._bot_message(chat_id, "an earlier reply")
        return self.push_update({"message": message})

    def push_button(self, under: dict[str, Any], user_id: int, data: str, *,
                    username: str | None = "alice") -> dict[str, Any]:
        """A button of the inline keyboard under ``under`` (a message the bot sent) pressed."""
        sender = {"id": user_id, "is_bot": False, "first_name": (username or "user").title(),
                  **({"username": username} if username else {})}
        message = {**self._bot_message(under["chat_id"], under["text"]), "message_id": under["message_id"]}
        return self.push_update({"callback_query": {"id": f"q{self._next_update_id}", "from": sender,
                                                    "message": message, "chat_instance": "c", "data": data}})

    def push_text(self, chat_id: int, user_id: int, text: str, **kw: Any) -> dict[str, Any]:
        """A text message; @mentions and a leading /command get entities, as Telegram adds them."""
        return self.push_message(chat_id, user_id, text=text, entities=_entities(text), **kw)

    def push_document(self, chat_id: int, user_id: int, content: bytes, file_name: str = "notes.txt",
                      caption: str | None = None, file_size: int | None = None, **kw: Any) -> dict[str, Any]:
        """A document; its bytes are served by getFile + /file/bot<token>/<path>."""
        doc = {**self.add_file(content, f"documents/{file_name}"), "file_name": file_name}
        if file_size is not None:  # lie about the size, e.g. to test the cap without big data
            doc["file_size"] = file_size
        extra = {"caption": caption} if caption else {}
        return self.push_message(chat_id, user_id, document=doc, **extra, **kw)

    def push_photo(self, chat_id: int, user_id: int, content: bytes, caption: str | None = None,
                   **kw: Any) -> dict[str, Any]:
        size = {**self.add_file(content, "photos/photo.jpg"), "width": 640, "height": 480}
        extra = {"caption": caption} if caption else {}
        return self.push_message(chat_id, user_id, photo=[size], **extra, **kw)

    def push_voice(self, chat_id: int, user_id: int, content: bytes, duration: int = 3, **kw: Any) -> dict[str, Any]:
        """A voice note (OGG/Opus on the real Telegram; any bytes here)."""
        voice = {**self.add_file(content, "voice/file_0.oga"), "duration": duration, "mime_type": "audio/ogg"}
        return self.push_message(chat_id, user_id, voice=voice, **kw)

    def push_audio(self, chat_id: int, user_id: int, content: bytes, file_name: str = "song.mp3",
                   duration: int = 30, **kw: Any) -> dict[str, Any]:
        audio = {**self.add_file(content, f"music/{file_name}"), "duration": duration, "file_name": file_name}
        return self.push_message(chat_id, user_id, audio=audio, **kw)

    def add_file(self, content: bytes, file_path: str) -> dict[str, Any]:
        file_id = f"file{len(self._files) + 1}"
        self._files[file_id] = (f"{file_id}/{file_path}", content)
        return {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(content)}

    # ---- scripted failures ----------------------------------------------------------
    def fail_sends(self, count: int, retry_after: float = 1) -> None:
        """The next ``count`` sendMessage calls answer 429 with ``parameters.retry_after``."""
        self._send_429.extend([retry_after] * count)

    def fail_all(self, calls: int = 0, seconds: float = 0.0) -> None:
        """Answer 502 Bad Gateway to every Bot API call, for ``calls`` calls or ``seconds``."""
        self._fail_calls = calls
        self._fail_until = time.monotonic() + seconds

    # ---- waiting for the bot --------------------------------------------------------
    def hold(self, method: str, when: Callable[[dict[str, Any]], bool] = lambda params: True) -> asyncio.Event:
        """From now on, ``method`` (the calls ``when`` picks by their parameters) does its work but
        answers only once the returned event is set."""
        self.held[method], self._hold_when[method] = asyncio.Event(), when
        return self.held[method]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait (event-driven) until ``predicate()`` holds after some request; TimeoutError if not."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._tick.wait()

    async def wait_sent(self, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until at least ``count`` messages were sent; return the first ``count``."""
        await self.wait_until(lambda: len(self.sent) >= count, timeout)
        return self.sent[:count]

    async def wait_calls(self, method: str, count: int = 1, timeout: float = 5.0) -> None:
        await self.wait_until(lambda: self.calls.count(method) >= count, timeout)

    # ---- the server -----------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls.append(method)
        self._notify()  # a long poll answers late: waiters on calls must not wait for its answer
        try:
            if request.match_info["token"] != self.token:
                return _error(401, "Unauthorized")
            if self._fail_calls > 0 or time.monotonic() < self._fail_until:
                self._fail_calls = max(0, self._fail_calls - 1)
                self.failed += 1
                return _error(502, "Bad Gateway")
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                return _error(404, "Not Found: method not found")
            params = await _params(request)
            response = await handler(params)
            held = self.held.get(method)
            if held is not None and self._hold_when[method](params):  # done on our side, but the answer waits (to kill the client meanwhile)
                self.holding[method] = self.holding.get(method, 0) + 1
                self._notify()
                await held.wait()
            return response
        finally:
            self._notify()

    async def _m_getMe(self, p: dict) -> web.Response:
        return _ok({"id": self.bot_id, "is_bot": True, "first_name": "Nanobot", "username": self.bot_username,
                    "can_join_groups": True, "can_read_all_group_messages": False,
                    "supports_inline_queries": False})

    async def _m_answerCallbackQuery(self, p: dict) -> web.Response:
        self.answered_buttons.append(p["callback_query_id"])
        return _ok(True)

    async def _m_setMyCommands(self, p: dict) -> web.Response:
        self.commands = p["commands"]
        return _ok(True)

    async def _m_deleteWebhook(self, p: dict) -> web.Response:
        self.webhook = None
        return _ok(True)

    async def _m_setWebhook(self, p: dict) -> web.Response:
        self.webhook = p
        return _ok(True)

    async def _m_getUpdates(self, p: dict) -> web.Response:
        if self.webhook is not None:
            return _error(409, "Conflict: can't use getUpdates method while webhook is active")
        if self.polling:
            self.conflicts += 1
            return _error(409, "Conflict: terminated by other getUpdates request; make sure that only one bot "
                               "instance is running")
        self.polling += 1
        try:
            return await self._long_poll(p)
        finally:
            self.polling -= 1

    async def _long_poll(self, p: dict) -> web.Response:
        offset = int(p.get("offset") or 0)
        if self.confirm_updates:  # off: as if every confirmation were lost, so everything comes again
            self._updates = [u for u in self._updates if u["update_id"] >= offset]  # offset confirms
        else:
            return _ok(list(self._updates))
        timeout = float(p.get("timeout") or 0)
        if timeout > 0:
            try:
                await self.wait_until(lambda: bool(self._allowed(p)) or self._closing, timeout)
            except TimeoutError:
                pass
        handed = self._allowed(p)[: int(p.get("limit") or 100)]
        self.handed_out.update(u["update_id"] for u in handed)
        return _ok(handed)

    def _allowed(self, p: dict) -> list[dict[str, Any]]:
        """The updates of the kinds getUpdates asked for (``allowed_updates``); Telegram drops the rest."""
        if kinds := p.get("allowed_updates"):
            self._updates = [u for u in self._updates if set(u) - {"update_id"} <= set(kinds)]
        return self._updates

    async def _m_sendMessage(self, p: dict) -> web.Response:
        if self._send_429:
            retry_after = self._send_429.pop(0)
            return _error(429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after})
        if not str(p.get("chat_id", "")).lstrip("-").isdigit():
            return _error(400, "Bad Request: chat not found")
        problem = _check_text(p.get("text", ""), p.get("parse_mode"))
        if problem:
            return _error(400, f"Bad Request: {problem}")
        message = self._bot_message(p["chat_id"], p["text"])
        self.sent.append({**p, "message_id": message["message_id"], "at": time.monotonic()})
        return _ok(message)

    async def _m_sendMessageDraft(self, p: dict) -> web.Response:
        if not self.drafts_served:  # an older Bot API server
            return _error(404, "Not Found: method not found")
        if not str(p.get("chat_id", "")).isdigit() or not int(p.get("draft_id") or 0):
            return _error(400, "Bad Request: TEXTDRAFT_PEER_INVALID")
        self.drafts.append({**p, "at": time.monotonic()})
        return _ok(True)

    async def _m_sendPhoto(self, p: dict) -> web.Response:
        return self._file_sent("photo", p)

    async def _m_sendDocument(self, p: dict) -> web.Response:
        return self._file_sent("document", p)

    async def _m_sendVoice(self, p: dict) -> web.Response:
        return self._file_sent("voice", p)

    def _file_sent(self, field: str, p: dict) -> web.Response:
        upload = p.get(field)
        if not hasattr(upload, "file"):
            return _error(400, f"Bad Request: there is no {field} in the request")
        message = self._bot_message(p["chat_id"], "")
        self.files.append({"method": field, "chat_id": p["chat_id"], "caption": p.get("caption"),
                           "message_thread_id": p.get("message_thread_id"),
                           "filename": upload.filename, "data": upload.file.read(),
                           "message_id": message["message_id"], "at": time.monotonic()})
        return _ok(message)

    async def _m_editMessageText(self, p: dict) -> web.Response:
        self.edits.append(p)
        return _ok({**self._bot_message(p["chat_id"], p["text"]), "message_id": p["message_id"]})

    async def _m_sendChatAction(self, p: dict) -> web.Response:
        self.actions.append(p)
        return _ok(True)

    async def _m_getFile(self, p: dict) -> web.Response:
        if p.get("file_id") not in self._files:
            return _error(400, "Bad Request: invalid file_id")
        path, content = self._files[p["file_id"]]
        return _ok({"file_id": p["file_id"], "file_unique_id": f"u{p['file_id']}",
                    "file_size": len(content), "file_path": path})

    async def _download(self, request: web.Request) -> web.Response:
        for path, content in self._files.values():
            if request.match_info["token"] == self.token and path == request.match_info["path"]:
                return web.Response(body=content)
        return web.Response(status=404)

    # ---- helpers --------------------------------------------------------------------
    def _new_message_id(self) -> int:
        self._next_message_id += 1
        return self._next_message_id

    def _bot_message(self, chat_id: Any, text: str) -> dict[str, Any]:
        chat_type = self._chat_types.get(chat_id, "private")
        return {"message_id": self._new_message_id(), "date": int(time.time()), "text": text,
                "chat": {"id": chat_id, "type": chat_type},
                "from": {"id": self.bot_id, "is_bot": True, "first_name": "Nanobot",
                         "username": self.bot_username}}

    def _notify(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        return await request.json()
    form = await request.post()
    return {k: v if k in _STRING_PARAMS or not isinstance(v, str) else _json_or_str(v) for k, v in form.items()}


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _entities(text: str) -> list[dict[str, Any]]:
    """The entities Telegram would attach: a leading /command and @mentions (UTF-16 offsets)."""
    def span(kind: str, m: re.Match[str]) -> dict[str, Any]:
        return {"type": kind, "offset": _utf16(text[:m.start()]), "length": _utf16(m.group(0))}

    command = re.match(r"/\w+(@\w+)?", text)
    found = [span("bot_command", command)] if command else []
    start = command.end() if command else 0
    return found + [span("mention", m) for m in re.finditer(r"@\w{3,}", text) if m.start() >= start]


_HTML_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a",
              "blockquote", "tg-spoiler", "span"}


def _check_text(text: str, parse_mode: str | None) -> str | None:
    """Telegram's own checks: HTML must nest properly, and 4096 UTF-16 units after parsing."""
    if parse_mode == "HTML":
        stack: list[str] = []
        for m in re.finditer(r"<(/?)([^\s>/]*)[^>]*>?", text):
            closing, tag = m.group(1), m.group(2).lower()
            if not m.group(0).endswith(">") or tag not in _HTML_TAGS:
                return f"can't parse entities: Unsupported start tag \"{tag}\" at offset {m.start()}"
            if not closing:
                stack.append(tag)
            elif not stack or stack.pop() != tag:
                return f"can't parse entities: Unmatched end tag \"{tag}\""
        if stack:
            return f"can't parse entities: Can't find end tag corresponding to start tag \"{stack[-1]}\""
        text = html.unescape(re.sub(r"<[^>]*>", "", text))
    if not text.strip():
        return "message text is empty"
    return "message is too long" if _utf16(text) > 4096 else None


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(status: int, description: str, parameters: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=status)
