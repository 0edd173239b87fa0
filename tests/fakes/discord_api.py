"""A stand-in Discord (gateway websocket + REST API) on 127.0.0.1, for the real discord.py.

Usage::

    async with FakeDiscord() as fake:                    # binds a random loopback port
        config.api_base, config.gateway_url = fake.api_base, fake.gateway_url
        config.token = fake.token                        # any other token gets 401 at login
        ... start the channel ...
        await fake.push_message(channel_id=5, author_id=42, content="hi")   # a DM
        await fake.push_message(7, 42, f"<@{fake.bot_id}> hi", guild_id=9, mentions_bot=True)
        sent = await fake.wait_sent(2, timeout=5)        # the bot's messages, in order

API (everything else is private):
- ``bot_id`` / ``bot_user``: the bot's user id and user object; ``token``; ``api_base``
  (``http://127.0.0.1:PORT/api/v10``); ``gateway_url`` (``ws://127.0.0.1:PORT/gateway``).
- ``await push_message(channel_id, author_id, content, *, username="user<id>", guild_id=None,
  mentions_bot=False, bot=False, attachments=None, reply_to=None) -> dict``: dispatch a
  MESSAGE_CREATE (waits, up to 5 s, for a live gateway session). No ``guild_id`` = a DM.
  ``mentions_bot`` only fills ``mentions``; put ``<@bot_id>`` in ``content`` yourself.
  ``attachments`` maps filename -> bytes, served under ``/attachments/``. ``reply_to`` is a
  message object (e.g. one of ``sent``) that this message replies to.
- ``sent``: message objects the bot posted (``channel_id``, ``content``, ``author``, ...).
  ``send_attempts``: every POST to /messages, including refused ones. ``typing``: channel
  ids of POST /channels/{id}/typing.
- ``await wait_sent(count, timeout=5) -> list[dict]``: until ``len(sent) >= count``.
- ``rate_limit_next(n, retry_after=0.05)``: the next n sends get 429 (with ``Via`` and
  ``retry_after``, so discord.py retries them). ``fail_next(n, status=503)``: the next n
  sends get that status (503 is not retried by discord.py itself; 500/502/504 are, slowly).
- ``await drop_connection(resumable=True)``: close the gateway socket with 4000, as a network
  blip would. discord.py reconnects at once and RESUMEs (missed events are replayed); with
  ``resumable=False`` the RESUME gets INVALID_SESSION and discord.py IDENTIFYs afresh.
- ``await wait_connected(timeout=5)``; counters ``identifies``, ``resumes``; ``intents``
  (the value from the last IDENTIFY).
- Slash commands: ``commands`` (the application's, as last PUT; ``command_puts`` counts the
  PUTs); ``await push_command(channel_id, user_id, name, value=None, *, guild_id=None,
  context=None, token=None) -> dict``: an INTERACTION_CREATE (context 0 in a server, else 1, the DM with
  the bot; 2 is someone else's DM); ``callbacks`` (the bodies of
  POST /interactions/{id}/{token}/callback), ``followups`` (POST /webhooks/{app}/{token}:
  ``token``, ``content``, ``message``), ``deleted`` (tokens whose original response was deleted);
  ``await push_button(shown, user_id, custom_id, *, guild_id=None)``: a press of a button under
  ``shown`` (a message or a follow-up's ``message``); buttons beyond Discord's limits are a 400;
  ``expire(token)`` makes the token's webhook answer 404, as after 15 minutes.
  ``wait_until(predicate)``, ``wait_followups(count)``; ``command_gets`` counts the GETs.

Gateway: HELLO (``heartbeat_ms``, default 1000), HEARTBEAT -> ACK, IDENTIFY -> READY (bot
user, no guilds: guild messages reach discord.py as PartialMessageable channels), RESUME ->
replay + RESUMED (unknown session -> INVALID_SESSION, so the client re-identifies). Frames are
uncompressed JSON text, which discord.py accepts even though it asks for zlib-stream. REST:
GET /users/@me, GET /oauth2/applications/@me (both needed by ``Client.login``), GET
/channels/{id}, POST /channels/{id}/messages, GET /channels/{id}/messages (``after``: the history
pushes and sends made, ``push_message(away=True)`` only there), PATCH
/channels/{id}/messages/{id} (``edits``), POST /channels/{id}/typing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from datetime import datetime, timezone
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.loopback import serve

_ids = itertools.count(100_000)


def _user(uid: int, name: str, bot: bool = False) -> dict[str, Any]:
    return {"id": str(uid), "username": name, "discriminator": "0", "global_name": None,
            "avatar": None, "bot": bot}


async def _message_body(request: web.Request) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """A message's JSON, and its uploads ((filename, bytes)) when it came as multipart."""
    if request.content_type != "multipart/form-data":
        return await request.json(), []
    body: dict[str, Any] = {}
    uploads = []
    async for part in await request.multipart():
        if part.name == "payload_json":
            body = json.loads(await part.text())
        else:
            uploads.append((part.filename or "file", bytes(await part.read())))
    return body, uploads


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Exactly "application/json": discord.py treats anything else (even "; charset=utf-8")
    # as text, and a text 429 as a Cloudflare ban.
    return web.Response(body=json.dumps(body).encode(), status=status,
                        headers={"Content-Type": "application/json", **(headers or {})})


MESSAGE_CONTENT_INTENT = 1 << 15  # in IDENTIFY's intents
MESSAGE_CONTENT_LIMITED = 1 << 19  # an application's flag: the switch on, for a bot in under 100 servers

class FakeDiscord:
    def __init__(self, *, bot_id: int = 1000, token: str = "fake-token", heartbeat_ms: int = 1000) -> None:
        self.bot_id, self.token, self.heartbeat_ms = bot_id, token, heartbeat_ms
        self.bot_user = _user(bot_id, "nanobot", bot=True)
        self.sent: list[dict[str, Any]] = []
        self.files: list[dict[str, Any]] = []  # uploads: channel_id, filename, data, content
        self.edits: list[dict[str, Any]] = []  # PATCHed messages: channel_id, message_id, content
        self.send_attempts = 0
        self.typing: list[str] = []
        self.identifies = self.resumes = 0
        self.connections = 0  # gateway connections open now
        self.most_connections = 0  # the most ever open at once (one bot, one shard: should be 1)
        self._nonces: dict[str, dict[str, Any]] = {}  # enforce_nonce: a repeat gets the first message back
        self.intents: int | None = None
        self.message_content_intent = True  # the Developer Portal's switch: off, an IDENTIFY asking for it is closed
        self.commands: list[dict[str, Any]] = []
        self.command_puts = self.command_gets = 0
        self.callbacks: list[dict[str, Any]] = []
        self.followups: list[dict[str, Any]] = []
        self._interaction_channels: dict[str, str] = {}  # an interaction's token -> its channel (its follow-ups')
        self.deleted: list[str] = []
        self._expired: set[str] = set()
        self._sent_changed = asyncio.Condition()
        self._connected = asyncio.Event()
        self._ws: web.WebSocketResponse | None = None
        self._session_id: str | None = None
        self._events: list[dict[str, Any]] = []  # this session's dispatches, for RESUME replay
        self._files: dict[str, bytes] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}  # channel -> its messages, oldest first
        self._refuse: list[tuple[int, float]] = []  # scripted (status, retry_after) per send
        self._runner: web.AppRunner | None = None
        self.base = ""

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> FakeDiscord:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/api/v10/users/@me", lambda r: self._rest(r, self.bot_user))
        app.router.add_get("/api/v10/oauth2/applications/@me", lambda r: self._rest(r, self._app()))
        app.router.add_get("/api/v10/channels/{cid}", self._get_channel)
        app.router.add_post("/api/v10/channels/{cid}/messages", self._post_message)
        app.router.add_get("/api/v10/channels/{cid}/messages", self._get_messages)
        app.router.add_post("/api/v10/channels/{cid}/typing", self._post_typing)
        app.router.add_patch("/api/v10/channels/{cid}/messages/{mid}", self._patch_message)
        app.router.add_get("/attachments/{aid}/{name}", self._attachment)
        app.router.add_get("/api/v10/applications/{app}/commands", self._get_commands)
        app.router.add_put("/api/v10/applications/{app}/commands", self._put_commands)
        app.router.add_post("/api/v10/interactions/{iid}/{token}/callback", self._callback)
        app.router.add_post("/api/v10/webhooks/{app}/{token}", self._followup)
        app.router.add_delete("/api/v10/webhooks/{app}/{token}/messages/@original", self._delete_original)
        self._runner, port = await serve(app)
        self.base = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def connect(self, config: Any, *allowed: int | str) -> Any:
        """``config.channels.discord`` enabled and pointed here, ``allowed`` users admitted; the
        section is returned for the test's other settings."""
        d = config.channels.discord
        d.enabled, d.token, d.api_base, d.gateway_url = True, self.token, self.api_base, self.gateway_url
        d.allow_from = [str(user) for user in allowed]
        return d

    @property
    def api_base(self) -> str:
        return f"http://{self.base}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self.base}/gateway"

    # -- test controls -------------------------------------------------------------------
    async def push_message(self, channel_id: int | str, author_id: int | str, content: str, *,
                           username: str | None = None, guild_id: int | str | None = None,
                           mentions_bot: bool = False, bot: bool = False,
                           attachments: dict[str, bytes] | None = None,
                           reply_to: dict[str, Any] | None = None,
                           voice_seconds: float | None = None, forwarded: bool = False,
                           away: bool = False, poll: tuple[str, list[str]] | None = None) -> dict[str, Any]:
        """``poll``: the message starts a poll (question, answers). ``voice_seconds``: the attachments are a voice message of that length. ``forwarded``:
        the content and attachments are a message forwarded from elsewhere (a snapshot).
        ``away``: sent while the bot is not connected (only the channel's history has it)."""
        msg = self._message(channel_id, _user(int(author_id), username or f"user{author_id}", bot), content)
        msg["mentions"] = [self.bot_user] if mentions_bot else []
        if guild_id is not None:
            msg["guild_id"] = str(guild_id)
        for name, data in (attachments or {}).items():
            aid = next(_ids)
            self._files[f"{aid}/{name}"] = data
            url = f"http://{self.base}/attachments/{aid}/{name}"
            msg["attachments"].append({"id": str(aid), "filename": name, "size": len(data),
                                       "url": url, "proxy_url": url})
            if voice_seconds is not None:
                msg["attachments"][-1].update(duration_secs=voice_seconds, waveform="AAAA")
        if poll is not None:
            msg["poll"] = {"question": {"text": poll[0]}, "expiry": "2099-01-01T00:00:00+00:00", "layout_type": 1,
                           "allow_multiselect": False,
                           "answers": [{"answer_id": i, "poll_media": {"text": a}} for i, a in enumerate(poll[1], 1)]}
        if reply_to is not None:
            msg["message_reference"] = {"message_id": reply_to["id"], "channel_id": reply_to["channel_id"]}
            msg["referenced_message"], msg["type"] = reply_to, 19  # REPLY
        if forwarded:  # as Discord: the forward itself is empty, the message it carries a snapshot
            snapshot = {k: msg[k] for k in ("content", "attachments", "embeds", "timestamp", "edited_timestamp",
                                            "flags", "mentions", "mention_roles", "type")}
            msg.update(content="", attachments=[], message_snapshots=[{"message": snapshot}],
                       message_reference={"type": 1, "message_id": str(next(_ids)), "channel_id": "777"})
        self._history.setdefault(str(channel_id), []).append(msg)
        if not away:
            await self.wait_connected()
            await self._dispatch("MESSAGE_CREATE", msg)
        return msg

    async def wait_sent(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        async with self._sent_changed:
            await asyncio.wait_for(self._sent_changed.wait_for(lambda: len(self.sent) >= count), timeout)
        return list(self.sent)

    async def wait_connected(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    def rate_limit_next(self, n: int, retry_after: float = 0.05) -> None:
        self._refuse += [(429, retry_after)] * n

    def fail_next(self, n: int, status: int = 503) -> None:
        self._refuse += [(status, 0.0)] * n

    async def drop_connection(self, *, resumable: bool = True) -> None:
        ws, self._ws = self._ws, None
        if not resumable:  # forget the session: the RESUME is refused, the client re-identifies
            self._session_id = None
        self._connected.clear()
        if ws is not None:
            await ws.close(code=4000, message=b"dropped by test")

    async def push_command(self, channel_id: int | str, user_id: int | str, name: str, value: str | None = None, *,
                           guild_id: int | str | None = None, context: int | None = None,
                           token: str | None = None) -> dict[str, Any]:
        return await self._interact(channel_id, user_id, 2, {
            "id": str(next(_ids)), "name": name, "type": 1,
            "options": [] if value is None else [{"name": "argument", "type": 3, "value": value}]},
            guild_id=guild_id, context=context, token=token)

    async def push_button(self, shown: dict[str, Any], user_id: int | str, custom_id: str, *,
                          guild_id: int | str | None = None) -> dict[str, Any]:
        """``user_id`` presses the button ``custom_id`` under ``shown`` (a message or a follow-up
        the bot sent, in ``shown["channel_id"]``): a component interaction."""
        return await self._interact(shown["channel_id"], user_id, 3, {"custom_id": custom_id, "component_type": 2},
                                    guild_id=guild_id, message=shown)

    async def _interact(self, channel_id: int | str, user_id: int | str, kind: int, data: dict[str, Any], *,
                        guild_id: int | str | None, context: int | None = None, token: str | None = None,
                        message: dict[str, Any] | None = None) -> dict[str, Any]:
        user = _user(int(user_id), f"user{user_id}")
        channel: dict[str, Any] = {"id": str(channel_id), "type": 1, "recipients": [user], "last_message_id": None,
                                   "flags": 0}
        interaction: dict[str, Any] = {
            "id": str(next(_ids)), "application_id": str(self.bot_id), "type": kind,
            "token": token or f"tok{next(_ids)}", "version": 1, "channel_id": str(channel_id), "channel": channel,
            "locale": "en-US", "app_permissions": "0", "entitlements": [], "attachment_size_limit": 10 * 1024 * 1024,
            "context": context if context is not None else (0 if guild_id is not None else 1), "data": data}
        if message is not None:
            interaction["message"] = message
        self._interaction_channels[interaction["token"]] = str(channel_id)
        if guild_id is not None:
            channel.update(type=0, name="general", guild_id=str(guild_id), position=0, permission_overwrites=[],
                           nsfw=False, parent_id=None, topic=None, rate_limit_per_user=0)
            del channel["recipients"]
            interaction.update(guild_id=str(guild_id), authorizing_integration_owners={"0": str(guild_id)},
                               member={"user": user, "roles": [], "joined_at": "2026-01-01T00:00:00+00:00",
                                       "deaf": False, "mute": False, "flags": 0, "permissions": "0"})
        else:
            interaction.update(user=user, authorizing_integration_owners={"0": str(user_id)})
        await self.wait_connected()
        await self._dispatch("INTERACTION_CREATE", interaction)
        return interaction

    def expire(self, token: str) -> None:
        self._expired.add(token)

    # -- gateway -------------------------------------------------------------------------
    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws = ws
        self.connections += 1
        self.most_connections = max(self.most_connections, self.connections)
        try:
            await ws.send_json({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}})
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    break
                payload = json.loads(frame.data)
                op, data = payload.get("op"), payload.get("d")
                if op == 1:
                    await ws.send_json({"op": 11})
                elif op == 2:
                    await self._identify(ws, data)
                elif op == 6:
                    await self._resume(ws, data)
        finally:
            self.connections -= 1
        if self._ws is ws:
            self._ws = None
            self._connected.clear()
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        if data.get("token") != self.token:
            await ws.close(code=4004, message=b"Authentication failed.")
            return
        if int(data.get("intents") or 0) & MESSAGE_CONTENT_INTENT and not self.message_content_intent:
            await ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self.identifies += 1
        self.intents = data.get("intents")
        self._session_id, self._events = f"session-{next(_ids)}", []
        await self._dispatch("READY", {
            "v": 10, "user": self.bot_user, "guilds": [], "session_id": self._session_id,
            "resume_gateway_url": self.gateway_url, "application": {"id": str(self.bot_id), "flags": 0}})
        self._connected.set()

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        if data.get("token") != self.token or data.get("session_id") != self._session_id:
            await ws.send_json({"op": 9, "d": False})  # discord.py then re-identifies
            return
        self.resumes += 1
        for event in self._events:
            if event["s"] > (data.get("seq") or 0):
                await ws.send_json(event)
        await self._dispatch("RESUMED", {})
        self._connected.set()

    async def _dispatch(self, event: str, data: dict[str, Any]) -> None:
        payload = {"op": 0, "t": event, "s": len(self._events) + 1, "d": data}
        self._events.append(payload)
        if self._ws is not None and not self._ws.closed:
            await self._ws.send_json(payload)

    # -- REST ----------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    def _rest(self, request: web.Request, body: Any) -> web.Response:
        if not self._authorized(request):
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        return _json(body)

    def _app(self) -> dict[str, Any]:
        return {"id": str(self.bot_id), "name": "nanobot", "description": "", "icon": None,
                "bot_public": True, "bot_require_code_grant": False, "verify_key": "0" * 64,
                "owner": _user(1, "owner"), "flags": MESSAGE_CONTENT_LIMITED if self.message_content_intent else 0}

    async def _get_channel(self, request: web.Request) -> web.Response:
        cid = request.match_info["cid"]
        return self._rest(request, {"id": cid, "type": 1, "recipients": [], "last_message_id": None})

    async def _post_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        self.send_attempts += 1
        body, uploads = await _message_body(request)
        if self._refuse:
            status, retry_after = self._refuse.pop(0)
            if status == 429:  # Via marks it as Discord's own limit, not a Cloudflare ban
                return _json({"message": "You are being rate limited.", "retry_after": retry_after,
                                          "global": False}, status=429, headers={"Via": "1.1 google"})
            return _json({"message": "scripted failure", "code": 0}, status=status)
        if not _components_fit(body):
            return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
        nonce = body.get("nonce") if body.get("enforce_nonce") else None
        if nonce is not None and nonce in self._nonces:  # as Discord: the message sent before, not a new one
            return _json(self._nonces[nonce])
        msg = self._message(request.match_info["cid"], self.bot_user, body.get("content", ""))
        if nonce is not None:
            msg["nonce"] = nonce
            self._nonces[nonce] = msg
        if body.get("message_reference"):
            msg["message_reference"] = body["message_reference"]
        msg["flags"] = int(body.get("flags") or 0)  # 4: SUPPRESS_EMBEDS (no link previews)
        msg["components"] = body.get("components") or []
        msg["mentions"] = _pinged(msg["content"], body.get("allowed_mentions"))
        for name, data in uploads:
            aid = next(_ids)
            url = f"http://{self.base}/attachments/{aid}/{name}"
            msg["attachments"].append({"id": str(aid), "filename": name, "size": len(data), "url": url,
                                       "proxy_url": url})
            self.files.append({"channel_id": request.match_info["cid"], "filename": name, "data": data,
                               "content": body.get("content")})
        self._history.setdefault(request.match_info["cid"], []).append(msg)
        async with self._sent_changed:
            self.sent.append(msg)
            self._sent_changed.notify_all()
        return _json(msg)

    async def _get_messages(self, request: web.Request) -> web.Response:
        """A channel's history after a message, as Discord pages it: the ``limit`` oldest of
        those after ``after``, newest first."""
        after, limit = int(request.query.get("after", 0)), int(request.query.get("limit", 50))
        later = [m for m in self._history.get(request.match_info["cid"], []) if int(m["id"]) > after][:limit]
        return self._rest(request, later[::-1])

    async def _patch_message(self, request: web.Request) -> web.Response:
        """An edit of one of the bot's messages (a streamed reply growing): recorded in ``edits``."""
        if not self._authorized(request):
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        body = await request.json()
        self.edits.append({"channel_id": request.match_info["cid"], "message_id": request.match_info["mid"],
                           "content": body.get("content", "")})
        msg = self._message(request.match_info["cid"], self.bot_user, body.get("content", ""))
        msg["id"] = request.match_info["mid"]
        return _json(msg)

    async def _get_commands(self, request: web.Request) -> web.Response:
        self.command_gets += 1
        await self._note()
        return self._rest(request, self.commands)

    async def _put_commands(self, request: web.Request) -> web.Response:
        self.commands = [{**c, "id": str(next(_ids)), "application_id": str(self.bot_id), "version": "1"}
                         for c in await request.json()]
        self.command_puts += 1
        await self._note()
        return self._rest(request, self.commands)

    async def _callback(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.callbacks.append({**body, "token": request.match_info["token"]})
        await self._note()
        return _json({"interaction": {"id": request.match_info["iid"], "type": 2,
                                      "response_message_loading": body.get("type") == 5,
                                      "response_message_ephemeral": bool((body.get("data") or {}).get("flags"))}})

    async def _followup(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        if token in self._expired:
            return _json({"message": "Unknown Webhook", "code": 10015}, status=404)
        body, _ = await _message_body(request)
        if not _components_fit(body):
            return _json({"message": "Invalid Form Body", "code": 50035}, status=400)
        msg = self._message(self._interaction_channels.get(token, "0"), self.bot_user, body.get("content", ""))
        msg.update(webhook_id=request.match_info["app"], components=body.get("components") or [])
        self.followups.append({"token": token, "content": body.get("content", ""), "message": msg,
                               "mentions": _pinged(msg["content"], body.get("allowed_mentions"))})
        await self._note()
        return _json(msg)

    async def _delete_original(self, request: web.Request) -> web.Response:
        self.deleted.append(request.match_info["token"])
        await self._note()
        return web.Response(status=204)

    async def _note(self) -> None:
        async with self._sent_changed:
            self._sent_changed.notify_all()

    async def wait_until(self, predicate: Any, timeout: float = 5.0) -> None:
        async with self._sent_changed:
            await asyncio.wait_for(self._sent_changed.wait_for(predicate), timeout)

    async def wait_followups(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        await self.wait_until(lambda: len(self.followups) >= count, timeout)
        return list(self.followups)

    async def _post_typing(self, request: web.Request) -> web.Response:
        self.typing.append(request.match_info["cid"])
        return web.Response(status=204)

    async def _attachment(self, request: web.Request) -> web.Response:
        data = self._files.get(f"{request.match_info['aid']}/{request.match_info['name']}")
        return web.Response(body=data) if data is not None else web.Response(status=404)

    @staticmethod
    def _message(channel_id: int | str, author: dict[str, Any], content: str) -> dict[str, Any]:
        return {"id": str(next(_ids)), "channel_id": str(channel_id), "author": author, "content": content,
                "timestamp": datetime.now(timezone.utc).isoformat(), "edited_timestamp": None,
                "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [],
                "attachments": [], "embeds": [], "pinned": False, "type": 0, "flags": 0}


def _components_fit(body: dict[str, Any]) -> bool:
    """Buttons within Discord's limits: five rows of five, 80-character labels, 100-character ids."""
    rows = body.get("components") or []
    buttons = [b for row in rows for b in row.get("components") or []]
    return len(rows) <= 5 and all(len(row.get("components") or []) <= 5 for row in rows) and all(
        len(b.get("label") or "") <= 80 and len(b.get("custom_id") or "") <= 100 for b in buttons)


def _pinged(content: str, allowed: dict[str, Any] | None) -> list[dict[str, str]]:
    """Whom a message notifies, as Discord decides: each user its text names (``<@id>``) that
    ``allowed_mentions`` lets through (no ``allowed_mentions``: everyone named)."""
    parse = (allowed or {"parse": ["users"]}).get("parse") or []
    listed = (allowed or {}).get("users") or []
    return [{"id": uid} for uid in re.findall(r"<@!?(\d+)>", content) if "users" in parse or uid in listed]
