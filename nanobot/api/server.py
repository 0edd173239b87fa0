"""``gateway.api``: the OpenAI-compatible HTTP API, a service of the gateway.

``GET /v1/models`` and ``POST /v1/chat/completions`` (plain, or ``stream: true`` as server-sent
events), with ``Authorization: Bearer KEY``. The last user message of ``messages`` is the new
message: the server keeps the chat's history, so earlier messages in the body are not read
again. A key's chat is ``api:NAME`` (``X-Nanobot-Session: S`` selects ``api:NAME:S``); it is a
member chat unless the key was made with ``--owner``. Errors have OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
import uuid
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

from nanobot.api.admin import AdminRoutes
from nanobot.api.channel import FINAL, ApiChannel, Aside, Reply
from nanobot.api.chats import ChatRoutes
from nanobot.api.keys import ApiKeys, KeyCheck
from nanobot.listener import BadBody, Listener, read_json
from nanobot.agent.commands import is_command
from nanobot.agent.markup import FailedReply
from nanobot.providers.base import ProviderError

if TYPE_CHECKING:
    from nanobot.api.front_door import FrontDoor
    from nanobot.usage import UsageStore

log = logging.getLogger(__name__)

MODEL = "nanobot"
# A front end's own requests (a title for its list of chats, tags), when its task or title model
# is set to this: the chat's model alone, with the front end's messages, outside the chat.
ERRANDS = "nanobot-errands"
MODELS = (MODEL, ERRANDS)
OTHER_REQUESTS = 10  # a key may make this many times requestsPerMinute other requests (reads, files)
WEB = Path(__file__).resolve().parent / "web"
PAGE_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
              "style.css": "text/css; charset=utf-8", "icon.svg": "image/svg+xml",
              "vendor/markdown-it.min.js": "text/javascript; charset=utf-8",
              "vendor/purify.min.js": "text/javascript; charset=utf-8"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind

    def response(self) -> web.Response:
        return web.json_response({"error": {"message": str(self), "type": self.kind, "param": None,
                                            "code": self.code}}, status=self.status)


class ApiServer:
    """Starts after the channels (a gateway service); its turns go through the dispatcher."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.settings = door.config.gateway.api
        self.channel = ApiChannel(door)
        self.check = KeyCheck(ApiKeys(door.db), door.api_owners, refresh_s=door.key_refresh_s)
        self.app = web.Application(client_max_size=self.settings.max_body_kb * 1024, middlewares=[errors])
        self.listener = Listener(self.app, "gateway.api.listen", timeout_s=door.http_timeout_s)
        self.chats = ChatRoutes(door, self._key, lambda message: ApiError(400, message, "invalid_session"))
        self._calls: dict[tuple[str, bool], deque[float]] = {}  # (key name, messages?) -> times in the last minute
        self._running: dict[str, int] = {}  # key name -> its turns running now

    async def start(self) -> None:
        await self.check.keys.migrate()
        await self.check.refresh()
        host, port = self.settings.address()
        if not _loopback(host) and not self.check.any_active:
            raise RuntimeError(f"gateway.api.listen is {self.settings.listen}, reachable from other machines, and "
                               "no API key exists: make one first (nanobot api keys add NAME)")
        self.door.add_internal_channel(self.channel)
        app = self.app
        self.door.health().add_routes(app)  # no key: for load balancers and probes
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{id}", self.models)
        app.router.add_post("/v1/chat/completions", self.completions)
        AdminRoutes(self.door, self._owner_only).add_to(app)
        self.chats.add_to(app)
        app.router.add_get("/", self.page)
        app.router.add_get("/static/{name:.+}", self.page)
        bound = await self.listener.start(host, port)
        log.info("API on http://%s:%d/v1, the web page on http://%s:%d/", host, bound, host, bound)

    async def stop(self) -> None:
        await self.listener.stop()

    # ---- endpoints ----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """The list (``GET /v1/models``), or the one model by its id (``GET /v1/models/nanobot``)."""
        await self._key(request)
        models = {name: {"id": name, "object": "model", "created": 0, "owned_by": "nanobot"} for name in MODELS}
        if "id" not in request.match_info:
            return web.json_response({"object": "list", "data": list(models.values())})
        if request.match_info["id"] not in models:
            raise no_such_model(request.match_info["id"])
        return web.json_response(models[request.match_info["id"]])

    async def completions(self, request: web.Request) -> web.StreamResponse:
        name, owner = await self._key(request, message=True)
        body = await read_body(request, self.settings.max_body_kb)
        if (model := body.get("model", MODEL)) not in MODELS:
            raise no_such_model(model)
        chat, stream = self.chats.key_chat(name, request), bool(body.get("stream"))
        chat_id = chat.partition(":")[2]
        if model == ERRANDS:  # a front end's task or title model
            return await self._errand(request, chat, errand_messages(body.get("messages")), owner, stream)
        media = await self.chats.media_of(chat, body.get("messages"))
        text = last_user_text(body.get("messages"), files=bool(media))
        if front_end_errand(text):
            return await self._errand(request, chat, [{"role": "user", "content": text}], owner, stream)
        await self._may_start(owner, text)
        if self._running.get(name, 0) >= self.settings.concurrent_turns:
            raise ApiError(429, f"this key has {self.settings.concurrent_turns} turns running already "
                           "(gateway.api.concurrentTurns)", "rate_limit_exceeded", "requests")
        self._running[name] = self._running.get(name, 0) + 1
        try:
            options = body.get("stream_options")
            return await answer(request, self.channel, name, chat_id, text, stream=stream,
                                usage=self.door.usage, media=media,
                                include_usage=isinstance(options, dict) and options.get("include_usage") is True)
        finally:
            self._running[name] -= 1

    async def _may_start(self, owner: bool, text: str) -> None:
        """Within the key's budget (/status and /budget always answer), and not shutting down."""
        if not is_command(text):
            await self._within_budget(owner)
        if not self.door.accepting():
            raise ApiError(503, "the gateway is shutting down; try again shortly", "service_unavailable", "server_error")

    async def _errand(self, request: web.Request, chat: str, messages: list[dict[str, str]], owner: bool,
                      stream: bool) -> web.StreamResponse:
        """A front end's errand (sent to ``ERRANDS``, or ``front_end_errand``), answered by the
        model outside the chat."""
        await self._may_start(owner, "")
        try:
            response = await self.door.agent.errand(chat, messages, member=not owner)
        except ProviderError as exc:
            log.info("api: a front end's errand for %s failed: %s", chat, exc)
            raise ApiError(502, "The model could not answer; try again later", "model_error", "server_error") from None
        reply = Reply()
        reply.finish(response.content or "")
        prompt, completion = response.usage.prompt_tokens, response.usage.completion_tokens

        async def used() -> dict[str, int]:
            return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return await respond(request, self.channel, chat.partition(":")[2], reply, used, stream=stream)

    async def page(self, request: web.Request) -> web.StreamResponse:
        """The web page: three files shipped in the wheel, no build step, no CDN."""
        name = request.match_info.get("name", "index.html")
        if name not in PAGE_FILES:
            raise web.HTTPNotFound()
        return web.FileResponse(WEB / name, headers={
            "Content-Type": PAGE_FILES[name], "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer"})

    # ---- checks -------------------------------------------------------------------------
    async def _key(self, request: web.Request, *, message: bool = False) -> tuple[str, bool]:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        found = await self.check.find(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if found is None:
            raise ApiError(401, "Incorrect API key provided (Authorization: Bearer KEY; keys are made with "
                           "nanobot api keys add NAME)", "invalid_api_key")
        self._count_request(found[0], message)
        return found

    async def _owner_only(self, request: web.Request) -> None:
        _, owner = await self._key(request)
        if not owner:
            raise ApiError(403, "only an owner key sees this", "forbidden", "permission_error")

    def _count_request(self, name: str, message: bool) -> None:
        """A key's messages count toward requestsPerMinute; its other requests toward ten times that: a page
        kept open asks for news every few seconds and fetches each file a turn sends, a runaway client more."""
        limit = self.settings.requests_per_minute * (1 if message else OTHER_REQUESTS)
        now = time.monotonic()
        calls = self._calls.setdefault((name, message), deque())
        while calls and now - calls[0] > 60:
            calls.popleft()
        if len(calls) >= limit:
            raise ApiError(429, f"Rate limit reached: {limit} {'messages' if message else 'requests'} per minute "
                           "for this key (gateway.api.requestsPerMinute)", "rate_limit_exceeded", "requests")
        calls.append(now)

    async def _within_budget(self, owner: bool) -> None:
        """429 once today's budget is spent (for a member key: once member chats' share is)."""
        from nanobot.usage import start_of_today

        usage, config = self.door.usage, self.door.config
        settings = config.agents.defaults
        since = start_of_today(settings.timezone)
        share = None if owner else config.member_budget_usd()
        spent = settings.daily_budget_usd is not None and await usage.cost_since(since) >= settings.daily_budget_usd
        if spent or share is not None and await usage.cost_since(since, members=True) >= share:
            raise ApiError(429, "Today's model budget is spent; try again after midnight", "insufficient_quota",
                           "insufficient_quota")


async def answer(request: web.Request, channel: ApiChannel, sender: str, chat_id: str, text: str, *,
                 stream: bool, usage: UsageStore, mode: str | None = None, media: list[str] | None = None,
                 include_usage: bool = False, untrusted: str | None = None) -> web.StreamResponse:
    """Run ``text`` as a message of the chat and answer with its reply, whole or streamed (with
    a last chunk holding the turn's usage when ``stream_options.include_usage`` asks, as OpenAI's)."""
    started = time.time()
    reply = await channel.ask(sender, chat_id, text, f"{channel.name}-{uuid.uuid4().hex}", mode=mode, media=media,
                              untrusted=untrusted)

    async def used() -> dict[str, int]:
        prompt, completion = await usage.tokens_since(f"{channel.name}:{chat_id}", started)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return await respond(request, channel, chat_id, reply, used, stream=stream, include_usage=include_usage)


async def respond(request: web.Request, channel: ApiChannel, chat_id: str, reply: Reply,
                  used: Callable[[], Awaitable[dict[str, int]]], *, stream: bool,
                  include_usage: bool = False) -> web.StreamResponse:
    """The reply whole, or streamed as it comes (``used``: the tokens it took)."""
    if stream:
        return await _stream(request, channel, chat_id, reply, used if include_usage else None)
    try:
        while await reply.pieces.get() is not FINAL:
            pass
    finally:
        channel.forget(chat_id, reply)
    body = _completion(reply.final, await used())
    if reply.asides:  # nanobot's own field (clients of OpenAI's shape ignore it): notes and files sent
        body["nanobot"] = {"asides": [aside.as_json() for aside in reply.asides]}
    if isinstance(reply.final, FailedReply):  # the words say the turn failed: a program can tell
        body.setdefault("nanobot", {})["failed"] = True
    return web.json_response(body)


async def _stream(request: web.Request, channel: ApiChannel, chat_id: str, reply: Reply,
                  used: Callable[[], Awaitable[dict[str, int]]] | None) -> web.StreamResponse:
    # nginx, the usual proxy in front, holds a response back until it is whole unless told not to.
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    try:
        await _event(response, _chunk(ident, created, {"role": "assistant", "content": ""}))
        while (piece := await _next_piece(reply, response, channel.keepalive_s)) is not FINAL:
            if isinstance(piece, Aside):  # an empty delta with nanobot's own field beside it
                await _event(response, {**_chunk(ident, created, {}), "nanobot": piece.as_json()})
            else:
                await _event(response, _chunk(ident, created, {"content": piece}))
        failed = {"nanobot": {"failed": True}} if isinstance(reply.final, FailedReply) else {}
        await _event(response, {**_chunk(ident, created, {}, finish="stop"), **failed})
        if used is not None:
            await _event(response, {**_chunk(ident, created, {}), "choices": [], "usage": await used()})
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        # The client left: the turn goes on and its reply stays in the history.
        channel.forget(chat_id, reply)
        raise
    await response.write_eof()
    return response


async def _next_piece(reply: Reply, response: web.StreamResponse, keepalive_s: float) -> str | Aside | None:
    """The reply's next piece, with a comment line every ``keepalive_s`` while none comes."""
    while True:
        try:
            async with asyncio.timeout(keepalive_s):  # (no task per piece, as wait_for makes on 3.11)
                return await reply.pieces.get()
        except TimeoutError:
            await response.write(b": still working\n\n")


# Only the page's own files; pictures also from blob: URLs (a file the assistant sent, fetched
# with the key since the key is never a cookie).
CSP = "default-src 'self'; img-src 'self' blob:; media-src 'self' blob:; frame-ancestors 'none'"
BAD_BODY_CODES = {400: "invalid_json", 408: "request_timeout", 413: "request_too_large"}


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure in OpenAI's error shape; a bad request is one line at info, and even a bug
    is one line (its traceback only at debug): no request can fill the log with tracebacks."""
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except BadBody as exc:
        error = ApiError(exc.status, f"Bad request body: {exc}", BAD_BODY_CODES[exc.status])
    except web.HTTPException as exc:  # 404, 405, a refused upload: in OpenAI's shape too, with its text if it has one
        said = exc.text if exc.text and exc.text != f"{exc.status}: {exc.reason}" else exc.reason
        error = ApiError(exc.status, said, "not_found" if exc.status == 404 else "invalid_request")
    except Exception as exc:
        log.error("%s %s failed: %s: %s", request.method, request.path, type(exc).__name__, exc)
        log.debug("the failure's traceback", exc_info=exc)
        error = ApiError(500, "The server failed on this request (the details are in its log)", "server_error",
                         "server_error")
    if error.status in (400, 404, 408, 413):
        log.info("%s %s: %d %s", request.method, request.path, error.status, error)
    return error.response()


async def read_body(request: web.Request, max_kb: int) -> dict[str, Any]:
    """The request's JSON object (ApiError 400 for anything else)."""
    try:
        body = await read_json(request, max_kb * 1024)
    except BadBody as exc:
        if exc.status != 413:
            raise
        raise ApiError(413, f"Request body too large: over {max_kb} KB (gateway.api.maxBodyKb; a file inside a "
                       "message counts: a big one goes in with POST /v1/nanobot/upload)", "request_too_large") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The body must be a JSON object", "invalid_request")
    return body


def last_user_text(messages: Any, *, files: bool = False) -> str:
    """The new message: the last one with role "user" (content as text, or text parts); with
    ``files`` it may have none (a picture alone)."""
    for message in reversed(_listed(messages)):
        if isinstance(message, dict) and message.get("role") == "user":
            content = _text(message.get("content"))
            if isinstance(content, str) and (content.strip() or files):
                return content
            break
    raise ApiError(400, "'messages' must end with a user message that has text", "invalid_messages")


def errand_messages(messages: Any) -> list[dict[str, str]]:
    """A front end's own request as it wrote it: its system, user and assistant messages' text."""
    kept = [{"role": m["role"], "content": text} for m in _listed(messages) if isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant") and (text := _text(m.get("content")))]
    if not kept:
        raise ApiError(400, "'messages' has no text", "invalid_messages")
    return kept


def _listed(messages: Any) -> list[Any]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "invalid_messages")
    return messages


def _text(content: Any) -> str | None:
    """A message's content as text: a string, or its text parts joined."""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
                         and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else None


def no_such_model(name: Any) -> ApiError:
    return ApiError(404, f"The model {name!r} does not exist; this server offers {MODEL!r} (and {ERRANDS!r} for "
                         "a front end's titles and tags)", "model_not_found")


def front_end_errand(text: str) -> bool:
    """Whether a message is a chat front end's errand rather than its reader's: Open WebUI asks
    the model it talks to for a title for its list of chats, tags and follow-up questions, each
    a "### Task:" over a copy of the chat. As turns they cost a full prompt with tools, and their
    words went into the chat's history and every later prompt."""
    return text.lstrip().startswith("### Task:") and "<chat_history>" in text


def _completion(text: str, usage: dict[str, int]) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL, "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def _chunk(ident: str, created: int, delta: dict[str, str], *, finish: str | None = None) -> dict[str, Any]:
    return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def _event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode())


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
