"""A stand-in Slack (Web API + Socket Mode WebSocket) on 127.0.0.1, for the real slack-bolt
and slack_sdk clients.

Usage::

    async with FakeSlack() as slack:                  # a random loopback port
        config.bot_token, config.app_token = slack.bot_token, slack.app_token
        config.api_base = slack.api_base              # http://127.0.0.1:PORT/api/
        ... start the channel ...
        await slack.push_message("D1", "U42", "hi")   # over the Socket Mode connection
        posted = await slack.wait_posted(1)           # chat.postMessage calls, in order

- ``push_message(channel, user, text, *, thread_ts=None, files=None, mention=False,
  channel_type=None, retry=False, away=False)``: an ``events_api`` envelope on the open
  WebSocket (waits up to 5 s for one; ``away``: none, only the channel's history has it, which
  ``conversations.history`` (top level) and ``conversations.replies`` (a thread) serve after
  ``oldest``, newest first); ``mention`` sends the ``app_mention`` event too (as Slack does when
  the app subscribes to both); ``files`` maps name -> bytes, served at ``/files/`` to the bot
  token only; returns the event. ``retry=True`` resends the last envelope (a new envelope
  id, the same event), as Slack does when an ack is late. ``acks``: envelope ids acknowledged.
- ``signed_event(event, secret, *, timestamp=None, retry_num=None) -> (body, headers)``: an
  Events API request for the HTTP mode, signed as Slack signs (``v0:ts:body``, HMAC-SHA256).
- ``push_command(command, text, *, user="U42", channel=None) -> envelope id``: a slash command
  typed in ``channel`` (the user's DM with the bot by default), as a ``slash_commands``
  envelope; ``command_form(...)`` the same payload as the HTTP mode's form body; what the app
  answered it with is in ``ack_payloads``. ``conversations.open`` gives ``dm_of(user)``.
- ``push_action(under, user, value)``: a button of the Block Kit message ``under`` (one of
  ``posted``) pressed, as an ``interactive`` envelope (``block_actions``).
- ``reactions``: (``add``/``remove``, channel, ts, name) as reactions.add/.remove came;
  ``reactions_allowed = False`` refuses them (``missing_scope``).
- ``shown()``: the messages as a reader sees them (edits applied); ``wait_shown(text)``.
- Recorded: ``posted`` (chat.postMessage arguments plus ``ts``), ``updates`` (chat.update),
  ``uploads`` (files.completeUploadExternal: channel, thread_ts, initial_comment, name,
  data), ``calls`` (method names), ``connections`` (WebSockets opened; ``open_sockets`` now).
- Trouble: ``fail_next(n, error="ratelimited", status=429)`` for the next n chat.postMessage;
  ``drop_sockets()`` closes the WebSockets, ``refuse_connections`` makes apps.connections.open fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import WSMsgType, web

from tests.fakes.loopback import serve

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "slack-app-manifest.json"  # the app as we tell people to make it


class FakeSlack:
    def __init__(self) -> None:
        self.bot_token, self.app_token = "xoxb-test-token", "xapp-test-token"
        self.bot_user, self.team = "UBOT", "T1"
        self.scopes = json.loads(MANIFEST.read_text())["oauth_config"]["scopes"]["bot"]  # the bot token's
        self.posted: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.uploads: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.acks: list[str] = []
        self.reactions: list[tuple[str, str, str, str]] = []  # (added/removed, channel, ts, name)
        self.reactions_allowed = True  # False: the app lacks reactions:write
        self.ack_payloads: dict[str, Any] = {}  # envelope id -> the payload the app acknowledged it with
        self.connections = 0
        self.refuse_connections = False
        self.open_sockets: list[web.WebSocketResponse] = []
        self._failures: list[tuple[str, int]] = []
        self._files: dict[str, bytes] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}  # channel -> its messages, oldest first
        self._uploading: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._last_envelope: dict[str, Any] | None = None
        self._tick = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle ------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    async def __aenter__(self) -> FakeSlack:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # conversations.history and .replies are GETs
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files/{name}", self._file)
        self._runner, self.port = await serve(app, access_log=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for socket in list(self.open_sockets):
            await socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _changed(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def wait_until(self, predicate: Any, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._tick.wait()

    async def wait_posted(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        await self.wait_until(lambda: len(self.posted) >= count, timeout)
        return self.posted

    def shown(self) -> list[dict[str, Any]]:
        """Each posted message as a reader sees it now: its arguments, ``text`` as last edited."""
        latest = {u["ts"]: u["text"] for u in self.updates}
        return [{**m, "text": latest.get(m["ts"], m["text"])} for m in self.posted]

    async def wait_shown(self, text: str, timeout: float = 5.0) -> dict[str, Any]:
        """The message that shows ``text`` (whole), once one does: a streamed reply ends edited."""
        await self.wait_until(lambda: any(m["text"] == text for m in self.shown()), timeout)
        return next(m for m in self.shown() if m["text"] == text)

    # ---- what users do ------------------------------------------------------------------
    async def push_message(self, channel: str, user: str, text: str, *, thread_ts: str | None = None,
                           files: dict[str, bytes] | None = None, mention: bool = False,
                           channel_type: str | None = None, retry: bool = False, away: bool = False) -> dict[str, Any]:
        if retry:
            assert self._last_envelope is not None
            await self._send_envelope(self._last_envelope["payload"])
            return self._last_envelope["payload"]["event"]
        event = self.message_event(channel, user, text, thread_ts=thread_ts, files=files, channel_type=channel_type)
        self._history.setdefault(channel, []).append(event)
        if away:  # no app connected: only the channel's history has it
            return event
        await self._send_envelope(self._callback(event))
        if mention:
            await self._send_envelope(self._callback({**event, "type": "app_mention"}))
        return event

    def message_event(self, channel: str, user: str, text: str, *, thread_ts: str | None = None,
                      files: dict[str, bytes] | None = None, channel_type: str | None = None) -> dict[str, Any]:
        event: dict[str, Any] = {"type": "message", "channel": channel, "user": user, "text": text,
                                 "ts": f"{time.time():.6f}", "event_ts": f"{time.time():.6f}",
                                 "channel_type": channel_type or ("im" if channel.startswith("D") else "channel")}
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["subtype"] = "file_share"
            event["files"] = []
            for name, data in files.items():
                file_id = f"F{next(self._ids)}"
                self._files[f"{file_id}-{name}"] = data
                event["files"].append({"id": file_id, "name": name, "size": len(data), "mimetype": "text/plain",
                                       "url_private_download": f"http://127.0.0.1:{self.port}/files/{file_id}-{name}"})
        return event

    @staticmethod
    def dm_of(user: str) -> str:
        return f"D{user}"

    def command_payload(self, command: str, text: str, *, user: str = "U42",
                        channel: str | None = None) -> dict[str, Any]:
        return {"token": "legacy", "team_id": self.team, "team_domain": "test", "api_app_id": "A1",
                "channel_id": channel or self.dm_of(user), "channel_name": "directmessage", "user_id": user,
                "user_name": "ada", "command": command, "text": text, "is_enterprise_install": "false",
                "response_url": f"http://127.0.0.1:{self.port}/commands/1", "trigger_id": f"tr{next(self._ids)}"}

    async def push_command(self, command: str, text: str, *, user: str = "U42", channel: str | None = None) -> str:
        return await self._send_envelope(self.command_payload(command, text, user=user, channel=channel),
                                         "slash_commands")

    async def push_action(self, under: dict[str, Any], user: str, value: str) -> str:
        """``user`` presses the button of ``value`` under the message ``under`` (over Socket Mode)."""
        return await self._send_envelope(self._action(under, user, value), "interactive")

    def action_form(self, under: dict[str, Any], user: str, value: str, secret: str) -> tuple[bytes, dict[str, str]]:
        """The same press as Slack posts it to an app's Request URL: a signed form with a payload."""
        body = urlencode({"payload": json.dumps(self._action(under, user, value))}).encode()
        return body, {"Content-Type": "application/x-www-form-urlencoded", **self._signed(body, secret)}

    def _action(self, under: dict[str, Any], user: str, value: str) -> dict[str, Any]:
        button = next((e for block in under.get("blocks") or [] if block["type"] == "actions"
                       for e in block["elements"] if e["value"] == value),
                      {"action_id": "pick-x", "value": value})  # no such button: what a forged request says
        message = {"type": "message", "user": self.bot_user, "ts": under["ts"], "text": under["text"],
                   **({"thread_ts": under["thread_ts"]} if under.get("thread_ts") else {})}
        return {"type": "block_actions", "user": {"id": user, "team_id": self.team}, "api_app_id": "A1",
                "token": "legacy", "team": {"id": self.team, "domain": "test"}, "trigger_id": f"tr{next(self._ids)}",
                "container": {"type": "message", "message_ts": under["ts"], "channel_id": under["channel"]},
                "channel": {"id": under["channel"]}, "message": message,
                "actions": [{"type": "button", "block_id": "b", "action_id": button["action_id"], "value": value,
                             "action_ts": str(time.time())}]}

    def _callback(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"token": "legacy", "team_id": self.team, "api_app_id": "A1", "type": "event_callback",
                "event_id": f"Ev{next(self._ids)}", "event_time": int(time.time()), "event": event,
                "authorizations": [{"team_id": self.team, "user_id": self.bot_user, "is_bot": True}]}

    def signed_event(self, event: dict[str, Any], secret: str, *, timestamp: int | None = None,
                     retry_num: int | None = None) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(self._callback(event)).encode()
        headers = self._signed(body, secret, timestamp)
        if retry_num is not None:
            headers.update({"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"})
        return body, {"Content-Type": "application/json", **headers}

    def command_form(self, command: str, text: str, secret: str, **where: Any) -> tuple[bytes, dict[str, str]]:
        body = urlencode(self.command_payload(command, text, **where)).encode()
        return body, {"Content-Type": "application/x-www-form-urlencoded", **self._signed(body, secret)}

    @staticmethod
    def _signed(body: bytes, secret: str, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(timestamp if timestamp is not None else int(time.time()))
        signature = "v0=" + hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature}

    async def _send_envelope(self, payload: dict[str, Any], kind: str = "events_api") -> str:
        await self.wait_until(lambda: bool(self.open_sockets))
        envelope = {"envelope_id": f"env-{next(self._ids)}", "type": kind, "payload": payload,
                    "accepts_response_payload": kind != "events_api", "retry_attempt": 0, "retry_reason": ""}
        self._last_envelope = envelope
        await self.open_sockets[-1].send_str(json.dumps(envelope))
        return envelope["envelope_id"]

    def section(self, allow_from: list[str] | None = None) -> dict[str, Any]:
        """``channels.slack`` (as config.json spells it) over Socket Mode to this stand-in."""
        return {"enabled": True, "botToken": self.bot_token, "appToken": self.app_token, "apiBase": self.api_base,
                "allowFrom": allow_from or ["U42"]}

    async def drop_sockets(self) -> None:
        """Close every open WebSocket from Slack's side (a restart of theirs, a network cut)."""
        for socket in list(self.open_sockets):
            await socket.close()

    def fail_next(self, count: int, *, error: str = "ratelimited", status: int = 429) -> None:
        self._failures += [(error, status)] * count

    # ---- the Web API ----------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls.append(method)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        wanted = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != wanted:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        args = await _arguments(request)
        try:
            answer = await self._answer(method, args)
            answer.headers["X-OAuth-Scopes"] = ",".join(self.scopes)  # as Slack says with every answer
            return answer
        finally:
            self._changed()

    async def _answer(self, method: str, args: dict[str, Any]) -> web.Response:
        if method == "auth.test":
            return web.json_response({"ok": True, "user_id": self.bot_user, "team_id": self.team, "user": "nanobot",
                                      "bot_id": "B1", "url": "https://test.slack.com/"})
        if method == "apps.connections.open":
            if self.refuse_connections:  # Slack having trouble: no new WebSocket URL
                return web.json_response({"ok": False, "error": "internal_error"})
            return web.json_response({"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket"})
        if method == "chat.postMessage":
            if self._failures:
                error, status = self._failures.pop(0)
                return web.json_response({"ok": False, "error": error}, status=status,
                                         headers={"Retry-After": "0"} if status == 429 else None)
            ts = f"{time.time():.6f}"
            self.posted.append({**args, "ts": ts})
            self._history.setdefault(args.get("channel"), []).append(
                {"type": "message", "user": self.bot_user, "bot_id": "B1", "text": args.get("text"), "ts": ts,
                 **({"thread_ts": args["thread_ts"]} if args.get("thread_ts") else {})})
            return web.json_response({"ok": True, "channel": args.get("channel"), "ts": ts})
        if method in ("reactions.add", "reactions.remove"):
            if not self.reactions_allowed:
                return web.json_response({"ok": False, "error": "missing_scope", "needed": "reactions:write"})
            self.reactions.append((method.split(".")[1], args["channel"], args["timestamp"], args["name"]))
            return web.json_response({"ok": True})
        if method == "conversations.open":
            return web.json_response({"ok": True, "channel": {"id": self.dm_of(args.get("users", ""))}})
        if method in ("conversations.history", "conversations.replies"):  # after ``oldest``, newest first
            thread, oldest = args.get("ts"), float(args.get("oldest") or 0)
            found = [m for m in self._history.get(args.get("channel"), []) if float(m["ts"]) > oldest
                     and m.get("thread_ts", m["ts"]) == (thread or m["ts"])]  # a thread's, or top-level ones
            found = found if thread else found[::-1]  # a thread oldest first (its parent first), a channel newest
            return web.json_response({"ok": True, "messages": found[:int(args.get("limit") or 100)],
                                      "has_more": False})
        if method == "chat.update":
            self.updates.append(args)
            return web.json_response({"ok": True, "channel": args.get("channel"), "ts": args.get("ts")})
        if method == "files.getUploadURLExternal":
            file_id = f"F{next(self._ids)}"
            self._uploading[file_id] = {"name": args.get("filename"), "length": int(args.get("length", 0))}
            return web.json_response({"ok": True, "file_id": file_id,
                                      "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}"})
        if method == "files.completeUploadExternal":
            files = args.get("files")
            for file in json.loads(files) if isinstance(files, str) else files:
                done = self._uploading.pop(file["id"])
                self.uploads.append({"channel": args.get("channel_id"), "thread_ts": args.get("thread_ts"),
                                     "initial_comment": args.get("initial_comment"), **done})
            return web.json_response({"ok": True, "files": [{"id": f} for f in self._uploading]})
        return web.json_response({"ok": False, "error": "unknown_method"})

    async def _upload(self, request: web.Request) -> web.Response:
        upload = self._uploading[request.match_info["file_id"]]
        reader = await request.multipart() if request.content_type.startswith("multipart/") else None
        if reader is not None:
            part = await reader.next()
            upload["data"] = await part.read()  # type: ignore[union-attr]
        else:
            upload["data"] = await request.read()
        return web.Response(text="OK - 200")

    async def _file(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.bot_token}":
            return web.Response(status=302, headers={"Location": "https://slack.com/signin"})
        return web.Response(body=self._files[request.match_info["name"]])

    # ---- Socket Mode ------------------------------------------------------------------------
    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoping=True)
        await socket.prepare(request)
        self.connections += 1
        self.open_sockets.append(socket)
        await socket.send_str(json.dumps({"type": "hello", "num_connections": len(self.open_sockets),
                                          "debug_info": {"host": "fake"}, "connection_info": {"app_id": "A1"}}))
        self._changed()
        try:
            async for message in socket:
                if message.type == WSMsgType.TEXT:
                    ack = json.loads(message.data)
                    if envelope_id := ack.get("envelope_id"):
                        self.acks.append(envelope_id)
                        self.ack_payloads[envelope_id] = ack.get("payload")
                        self._changed()
        finally:
            self.open_sockets.remove(socket)
            self._changed()
        return socket


async def _arguments(request: web.Request) -> dict[str, Any]:
    """Web API arguments: JSON, form or query (slack_sdk uses each for different methods)."""
    args: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        args.update(await request.json())
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        args.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
    return args
