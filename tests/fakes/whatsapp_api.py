"""A stand-in WhatsApp Cloud API on 127.0.0.1: the Graph API the adapter calls, and Meta's
side of the webhook (signed posts, retried until answered 200).

Usage::

    async with FakeWhatsApp() as wa:
        section = wa.section(webhook_port)           # phoneNumberId, accessToken, appSecret, ...
        await wa.deliver("15550002222", "hi")          # a signed webhook post; returns its status
        sent = await wa.wait_sent(1)                    # bodies of POST /{phone}/messages

- ``deliver(wa_id, text, *, media=None, profile_name="Someone", message_id=None, signature=None)``
  posts one message (``media``: (type, bytes, mime) uploaded to the stand-in, named by id); a
  reply other than 200 is retried as Meta does (``retries`` times, at once here) unless
  ``retry=False``. ``posts`` lists (status, message id) of every attempt. A ``wa_id`` that is no
  number ("US.1349…") is a business-scoped user id: the message comes as from a user who hides
  their number behind a username (``from_user_id``, no ``from``); ``bsuid=`` gives a number's
  message that id too.
- The Graph API answers only ``accessToken``; ``closed_window`` (wa_ids) makes a send to them
  fail with error 131047; ``media_url_base`` changes where media URLs point (another host).
- Recorded: ``sent`` (message bodies), ``uploads`` (name, mime, bytes), ``media_fetches``
  (the Authorization header of each media download), ``typing``.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.ticks import Ticks
from tests.fakes.loopback import serve

PHONE_ID = "1098765"


class FakeWhatsApp(Ticks):
    def __init__(self) -> None:
        super().__init__()
        self.token, self.secret, self.verify_token = "EAAG-test-token", "app-secret-for-tests", "verify-me"
        self.sent: list[dict[str, Any]] = []
        self.sent_ids: list[str] = []  # the id Meta gave each of them, in order
        self.typing: list[dict[str, Any]] = []
        self.uploads: list[tuple[str, str, bytes]] = []
        self.media_fetches: list[str | None] = []
        self.posts: list[tuple[int, str]] = []
        self.closed_window: set[str] = set()
        self.automation: dict[str, Any] = {}  # conversational components as last POSTed (the "/" menu)
        self.media_url_base: str | None = None
        self.webhook_url = ""
        self._media: dict[str, tuple[bytes, str]] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v21.0"

    def section(self, webhook_port: int, **more: Any) -> dict[str, Any]:
        self.webhook_url = f"http://127.0.0.1:{webhook_port}/whatsapp"
        return {"enabled": True, "phoneNumberId": PHONE_ID, "accessToken": self.token, "appSecret": self.secret,
                "verifyToken": self.verify_token, "apiBase": self.api_base,
                "webhook": {"listen": f"127.0.0.1:{webhook_port}", "path": "/whatsapp"}, **more}

    async def __aenter__(self) -> FakeWhatsApp:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_get("/v21.0/{node}", self._node)
        app.router.add_post("/v21.0/{phone}/messages", self._messages)
        app.router.add_post("/v21.0/{phone}/media", self._upload)
        app.router.add_post("/v21.0/{phone}/conversational_automation", self._automation)
        app.router.add_get("/media-bytes/{media_id}", self._media_bytes)
        self._runner, self.port = await serve(app, access_log=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- Meta's side of the webhook ----------------------------------------------------
    def payload(self, wa_id: str, text: str, *, media: tuple[str, bytes, str] | None = None,
                profile_name: str = "Someone", message_id: str | None = None, bsuid: str | None = None,
                phone_number_id: str = PHONE_ID, context: dict[str, Any] | None = None,
                picked: str | None = None) -> dict[str, Any]:
        # A wa_id that is no number is a business-scoped user id: a user who hides their number
        # behind a username is named by it alone.
        sender = {"from": wa_id, **({"from_user_id": bsuid} if bsuid else {})} if wa_id.isdigit() else \
            {"from_user_id": wa_id}
        message: dict[str, Any] = {**sender, "id": message_id or f"wamid.{next(self._ids)}",
                                   "timestamp": str(int(time.time())), "type": "text", "text": {"body": text}}
        if context is not None:  # {"forwarded": true}: what Meta marks a forwarded message with
            message["context"] = context
        if picked is not None:  # a row of an interactive list the business sent, picked: its id comes back
            del message["text"]
            message.update(type="interactive", interactive={"type": "list_reply", "list_reply": {
                "id": picked, "title": picked.rpartition(" ")[2]}})
        if media is not None:
            kind, data, mime = media
            media_id = f"media{next(self._ids)}"
            self._media[media_id] = (data, mime)
            del message["text"]
            message["type"] = kind
            message[kind] = {"id": media_id, "mime_type": mime, "caption": text,
                             **({"filename": "notes.txt"} if kind == "document" else {})}
        return {"object": "whatsapp_business_account", "entry": [{"id": "WABA1", "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550001111", "phone_number_id": phone_number_id},
            "contacts": [{"profile": {"name": profile_name}, "wa_id" if wa_id.isdigit() else "user_id": wa_id,
                          **({"user_id": bsuid} if bsuid else {})}],
            "messages": [message]}}]}]}

    async def deliver(self, wa_id: str, text: str, *, retries: int = 3, signature: str | None = None,
                      **payload: Any) -> int:
        """Post a message as Meta does, again while it is not answered 200; the last status."""
        body = json.dumps(self.payload(wa_id, text, **payload)).encode()
        return await self.post_raw(body, retries=retries, signature=signature)

    async def post_raw(self, body: bytes, *, retries: int = 0, signature: str | None = None) -> int:
        sign = signature if signature is not None else self.sign(body)
        message_id = ""
        try:
            message_id = json.loads(body)["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            pass
        status = 0
        async with aiohttp.ClientSession() as http:
            for _ in range(retries + 1):
                try:
                    async with http.post(self.webhook_url, data=body, headers={
                            "Content-Type": "application/json", "X-Hub-Signature-256": sign}) as response:
                        status = response.status
                except aiohttp.ClientError:
                    status = 0
                self.posts.append((status, message_id))
                if status == 200:
                    break
        return status

    def sign(self, body: bytes) -> str:
        return "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()

    async def wait_sent(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        await self.wait_until(lambda: len(self.sent) >= count, timeout)
        return self.sent

    def texts(self, wa_id: str | None = None) -> list[str]:
        return [m["text"]["body"] for m in self.sent if m["type"] == "text" and wa_id in (None, to(m))]

    def _ticked(self) -> None:
        self._tick.set()

    # ---- the Graph API -----------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    @staticmethod
    def _error(status: int, code: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "OAuthException", "code": code,
                                            "fbtrace_id": "trace"}}, status=status)

    async def _node(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token - Cannot parse access token")
        node = request.match_info["node"]
        if node == PHONE_ID:
            return web.json_response({"id": PHONE_ID, "display_phone_number": "+1 555-000-1111"})
        if node in self._media:
            data, mime = self._media[node]
            base = self.media_url_base or f"http://127.0.0.1:{self.port}"
            return web.json_response({"messaging_product": "whatsapp", "url": f"{base}/media-bytes/{node}",
                                      "mime_type": mime, "file_size": len(data), "id": node})
        return self._error(400, 100, "Unsupported get request")

    async def _messages(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token")
        body = await request.json()
        if body.get("status") == "read":
            self.typing.append(body)
            self.ticked()
            return web.json_response({"success": True})
        if to(body) in self.closed_window:
            self.ticked()
            return self._error(400, 131047, "Re-engagement message")
        if body.get("type") == "interactive" and (problem := _list_trouble(body["interactive"])):
            return self._error(400, 131009, f"Parameter value is not valid: {problem}")
        self.sent.append(body)
        self.sent_ids.append(f"wamid.out{next(self._ids)}")
        self.ticked()
        return web.json_response({"messaging_product": "whatsapp", "contacts": [{"input": to(body), "wa_id": to(body)}],
                                  "messages": [{"id": self.sent_ids[-1]}]})

    async def _automation(self, request: web.Request) -> web.Response:
        """Meta's conversational components: up to 30 commands, a name of at most 32 characters."""
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token")
        body = await request.json()
        commands = body.get("commands") or []
        if len(commands) > 30 or any(len(c["command_name"]) > 32 or len(c["command_description"]) > 256
                                     for c in commands):
            return self._error(400, 100, "(#100) Param commands must have at most 30 elements")
        self.automation.update(body)
        self.ticked()
        return web.json_response({"success": True})

    async def _upload(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token")
        form = await request.post()
        file = form["file"]
        assert isinstance(file, web.FileField) and form.get("messaging_product") == "whatsapp"
        self.uploads.append((file.filename, file.content_type, file.file.read()))
        return web.json_response({"id": f"upload{next(self._ids)}"})

    async def _media_bytes(self, request: web.Request) -> web.Response:
        self.media_fetches.append(request.headers.get("Authorization"))
        self.ticked()
        if not self._authorized(request):
            return web.Response(status=401)
        data, mime = self._media[request.match_info["media_id"]]
        return web.Response(body=data, content_type=mime.split(";")[0])


def _list_trouble(interactive: dict[str, Any]) -> str | None:
    """What Meta refuses in an interactive list: a body over 4,096 characters, a button label
    over 20, over ten rows, a row's title over 24 or its id over 200."""
    rows = [row for section in interactive["action"]["sections"] for row in section["rows"]]
    if len(interactive["body"]["text"]) > 4096 or len(interactive["action"]["button"]) > 20 or len(rows) > 10:
        return "body, button or rows"
    return next((f"row {row['id']}" for row in rows if len(row["title"]) > 24 or len(row["id"]) > 200), None)


def to(message: dict[str, Any]) -> str:
    """Whom a sent message went to: a number (``to``) or a business-scoped user id (``recipient``)."""
    return message.get("to") or message["recipient"]
