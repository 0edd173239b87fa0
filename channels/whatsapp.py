"""WhatsApp adapter: the Cloud API. Meta posts each message to our webhook (any worker); we
send through the Graph API at ``apiBase``.

- The webhook's set-up handshake (``GET`` with ``hub.verify_token``) echoes ``hub.challenge``
  only for ``verifyToken``. Every ``POST`` must carry ``X-Hub-Signature-256``: ``sha256=`` and
  the HMAC-SHA256 of the raw body with ``appSecret`` (compared in constant time); anything else
  gets 401 and is never parsed.
- A message is answered 200 only once it is recorded, so a crash or a database outage (503)
  makes Meta post it again; its id (``wamid``) drops the repeat.
- Only changes for ``phoneNumberId`` are read (the app's other numbers are not ours to answer).
- Identity is the ``wa_id`` Meta delivered the message from; the contact's profile name (and
  username) is the sender's own to write and is only shown. A user with a WhatsApp username may
  hide their number: Meta then names them by their business-scoped user id alone (BSUID,
  ``US.1349…``; it never passes to another person), their id here. Where both come, the BSUID is
  the handle, so a config entry naming it matches either way, and an admitted user's pair is kept
  (``store.keep_position``): one who hides their number later is still that number's person and
  chat. Chats are ``whatsapp:<wa_id>``, else ``whatsapp:<BSUID>`` (one-to-one; also when the
  number's chat is another account's: ``NumberChats``); a BSUID is written to as ``recipient``, a
  number as ``to``, and a number's chat whose account is known goes to that account.
- Media in: fetched by id (the Graph API names a download URL); the access token goes only to
  ``apiBase``'s origin and to Meta's media host over https. Media out: uploaded, then sent.
- Outside the 24-hour customer-service window WhatsApp refuses free-form messages (error
  131047): the reply is marked failed (``status`` counts it) and not retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import mimetypes
from collections.abc import Sequence
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from nanobot.bus import Identity, InboundMessage, OutboundMessage, OutgoingFile
from nanobot.channel_plugin import BaseChannel, ChannelContext, SendFailed, Sender, send_parts
from nanobot.chat_commands import COMMANDS, picked, shown
from nanobot.message_context import noting_lost, shared_contact, shared_place, with_quote
from nanobot.config import WhatsAppConfig
from nanobot.listener import BadBody, Listener, read_body, read_whole
from nanobot.sqlite_file import StoreUnavailable
from nanobot_channels.number_chats import NumberChats
from nanobot_channels.text import names_itself, split_message, tables_as_lists, to_marks

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"
MAX_BODY_BYTES = 1024 * 1024  # a webhook post is a few KB; media are fetched separately
MEDIA_HOSTS = ("lookaside.fbsbx.com",)  # where Meta's media download URLs point
OUTSIDE_WINDOW = 131047  # "more than 24 hours have passed since the recipient last replied"
MEDIA_TYPES = ("image", "audio", "document", "video", "sticker")
API_TIMEOUT_S = 30.0


class WhatsAppChannel(BaseChannel):
    name = "whatsapp"
    max_message_len = 4096
    moves = "id"  # a number is recycled to a stranger; the handle, the BSUID, is the account's

    def __init__(self, config: WhatsAppConfig, ctx: ChannelContext) -> None:
        super().__init__(config, ctx)
        self.config: WhatsAppConfig = config
        self.api = config.api_base.rstrip("/")
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=API_TIMEOUT_S),
                                           headers={"Authorization": f"Bearer {config.access_token}"})
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get(config.webhook.path, self._verify)
        app.router.add_post(config.webhook.path, self._post)
        self.webhook = Listener(app, "channels.whatsapp.webhook.listen", timeout_s=ctx.http_timeout_s)
        self._last_message: dict[str, str] = {}  # wa_id -> the id of their latest message (typing, read)
        self._numbers: dict[str, str] = {}  # an admitted user's business-scoped id -> their number
        self._chats = NumberChats(self.name, ctx.store)  # a number's chat is its first account's (its BSUID)

    async def start(self) -> None:
        try:
            await self._graph("GET", self.config.phone_number_id, params={"fields": "id"})
        except SendFailed as exc:  # retry: no answer (a refusal is not worth another try)
            await self.stop()
            trouble = f"the Graph API at {self.config.api_base} did not answer" if exc.retry else \
                f"the Graph API did not accept the access token for phone number {self.config.phone_number_id}"
            raise RuntimeError(f"whatsapp: {trouble} ({exc})") from None
        try:
            await self.webhook.start(*self.config.webhook.address())
        except BaseException:
            await self.stop()
            raise
        log.info("whatsapp: taking webhook posts on %s%s (signed requests only)", self.config.webhook.listen,
                 self.config.webhook.path)
        await self._offer_commands()

    async def _offer_commands(self) -> None:
        """The menu WhatsApp shows when "/" is typed: the chat commands (Meta's conversational
        components; best effort, as Telegram's)."""
        commands = [{"command_name": name, "command_description": what} for name, _, what in COMMANDS]
        try:
            await self._graph("POST", f"{self.config.phone_number_id}/conversational_automation",
                              json={"commands": commands})
        except SendFailed as exc:
            log.warning("whatsapp: the command menu was not set: %s", exc)

    async def stop(self) -> None:
        await self.webhook.stop()
        await self._http.close()

    # -- the webhook ---------------------------------------------------------------------
    async def _verify(self, request: web.Request) -> web.Response:
        """Meta's subscription handshake: the challenge back, for our verify token only."""
        query = request.query
        token = query.get("hub.verify_token", "").encode("utf-8", "surrogateescape")
        if query.get("hub.mode") != "subscribe" or not hmac.compare_digest(token, self.config.verify_token.encode()):
            return web.Response(status=403, text="forbidden")
        return web.Response(text=query.get("hub.challenge", ""))

    async def _post(self, request: web.Request) -> web.Response:
        try:
            raw = await read_body(request, MAX_BODY_BYTES)
        except BadBody as exc:  # too large, or too slow: a stalled body must not hold the connection
            return web.Response(status=exc.status, text=str(exc))
        signature = request.headers.get(SIGNATURE_HEADER, "").encode("utf-8", "surrogateescape")
        expected = b"sha256=" + hmac.new(self.config.app_secret.encode(), raw, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(signature, expected):
            log.info("whatsapp webhook: refused a post from %s without a valid signature", request.remote)
            return web.Response(status=401, text="unauthorized")
        try:
            await self._take(_json(raw))
        except BadBody as exc:
            return web.Response(status=exc.status, text=str(exc))
        except StoreUnavailable as exc:  # not recorded: Meta posts it again later
            log.warning("whatsapp webhook: not recorded (%s); Meta will retry it", exc)
            return web.Response(status=503, text="try again")
        return web.Response(text="ok")

    async def _take(self, body: Any) -> None:
        """The post's messages, admitted ones recorded together (before the 200)."""
        admitted: list[InboundMessage] = []
        for change in (c for e in _list(body, "entry") for c in _list(e, "changes")):
            value = change.get("value") if isinstance(change, dict) else None
            if not isinstance(value, dict) or not self._ours(value):
                continue
            names = {key: (c.get("profile") or {}).get("name") for c in _list(value, "contacts")
                     for key in (c.get("wa_id"), c.get("user_id")) if key}
            for message in _list(value, "messages"):
                if (msg := await self._message(message, names)) is not None:
                    admitted.append(msg)
            for status in _list(value, "statuses"):
                self._status(status)
        await self.ctx.accept(admitted)

    def _ours(self, value: dict[str, Any]) -> bool:
        """Whether a change is for our number: an app's webhook gets every number of its business
        account, and a message to another one (its staff's, say) is not ours to answer."""
        metadata = value.get("metadata")
        number = str(metadata.get("phone_number_id") or "") if isinstance(metadata, dict) else ""
        if number != self.config.phone_number_id:
            log.debug("whatsapp webhook: passed over a change for phone number %s", number or "(none)")
        return number == self.config.phone_number_id

    async def _message(self, message: dict[str, Any], names: dict[str, str | None]) -> InboundMessage | None:
        bsuid, kind = str(message.get("from_user_id") or ""), message.get("type")
        number = str(message.get("from") or "") or await self._number_of(bsuid)
        wa_id = number or bsuid  # a username's holder may hide their number: then the BSUID names them
        if not wa_id or not message.get("id"):
            return None
        who = Identity(wa_id, bsuid if number and bsuid else None, names.get(number) or names.get(bsuid))
        chat = await self._chats.chat_of(who, vouched := await self._vouched(who))
        part = message.get(kind) if isinstance(message.get(kind), dict) else {}
        text = _words(kind, part, message)
        media: list[str] = []
        if kind in MEDIA_TYPES and part.get("id") and await self._may_download(who):
            kept = await self._download(part, Sender(self.name, chat, who, True))
            media = [kept] if kept else []
        context = message.get("context") if isinstance(message.get("context"), dict) else {}
        forwarded = context.get("forwarded") or context.get("frequently_forwarded")  # someone else's words
        # A reply names only the id of what it answers: the words are ours to know, if we sent it.
        answered = await self.ctx.store.kept(f"{self.name}:{chat}", str(context["id"])) \
            if context.get("id") and not forwarded and await self._may_download(who) else None
        text, _ = with_quote(noting_lost((text or "").strip(), int(kind in MEDIA_TYPES), media), answered,
                             self.config.phone_number_id, who.id, self.config.phone_number_id)
        msg = InboundMessage(self.name, chat, who.id, text, sender_name=who.name, sender_handle=who.handle, media=media,
                             is_private=True, delivery_key=str(message["id"]),
                             untrusted="a forwarded message" if forwarded else None)
        if (admitted := await self._admit(msg)) is not None:  # a stranger's id is not kept
            self._last_message[chat] = str(message["id"])
            await self._chats.admitted(who, vouched)
            if number and bsuid and self._numbers.get(bsuid) != number:
                await self.ctx.store.keep_position(self._number_key(bsuid), number)
                self._numbers[bsuid] = number
        return admitted

    async def _number_of(self, bsuid: str) -> str:
        """The number Meta named with this business-scoped user id before (kept for admitted
        users), so one who hides it later is the same person and chat; "" if none."""
        if bsuid and bsuid not in self._numbers and (number := await self.ctx.store.position(self._number_key(bsuid))):
            self._numbers[bsuid] = number
        return self._numbers.get(bsuid, "")

    def _number_key(self, bsuid: str) -> str:
        return f"{self.name} number of {bsuid}"  # in the store's positions: kept until it changes

    def _status(self, status: dict[str, Any]) -> None:
        """What became of a message we sent: a refusal after the fact is logged, once."""
        if status.get("status") == "failed":
            errors = status.get("errors") or [{}]
            log.warning("whatsapp: a message to %s was not delivered: %s (%s)", status.get("recipient_id"),
                        errors[0].get("title") or errors[0].get("message"), errors[0].get("code"))

    async def _download(self, part: dict[str, Any], sender: Sender) -> str | None:
        """A media file, by id: the Graph API names its URL, fetched with the token (there only)."""
        media_id = str(part["id"])
        try:
            found = await self._graph("GET", media_id)
            url = str(found.get("url") or "")
            if int(found.get("file_size") or 0) > self.ctx.max_media_bytes or not self._token_may_go(url):
                raise ValueError(f"over {self.ctx.max_media_bytes} bytes, or not on Meta's media host")
            async with self._http.get(url, allow_redirects=False) as response:
                response.raise_for_status()
                data = await read_whole(response.content, self.ctx.max_media_bytes)
        except (SendFailed, aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
            log.warning("whatsapp: could not download media %s: %s", media_id, exc)
            return None
        kind = part.get("mime_type") or found.get("mime_type") or ""
        name = part.get("filename") or ("voice.ogg" if part.get("voice") or kind.startswith("audio/ogg")
                                        else "media" + (mimetypes.guess_extension(kind.split(";")[0]) or ""))
        return await self._keep(await self.chat_root(sender), media_id[:16], name, data)

    def _token_may_go(self, url: str) -> bool:
        parts, api = urlsplit(url), urlsplit(self.api)
        return (parts.scheme, parts.netloc) == (api.scheme, api.netloc) or \
            (parts.scheme == "https" and parts.hostname in MEDIA_HOSTS and parts.port in (None, 443))

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        await send_parts(msg, self._text_parts(msg.chat_id, msg.content, msg.offer))

    def _text_parts(self, chat_id: str, text: str, offer: Sequence[str] = ()) -> list[partial[Any]]:
        bodies = [whatsapp_marks(chunk) for chunk in split_message(tables_as_lists(text), self.max_message_len)]
        parts = [partial(self._send, chat_id, "text", {"body": body, "preview_url": False}) for body in bodies]
        if rows := shown(offer, most=10, label_chars=24, sends_bytes=200):  # the last part with a list to pick from
            parts[-1] = partial(self._send, chat_id, "interactive", _pick_list(rows, bodies[-1]))
        return parts

    async def send_stream(self, msg: OutboundMessage) -> None:
        return None  # WhatsApp messages cannot be edited: the final text is sent whole

    async def send_file(self, msg: OutboundMessage) -> None:
        """Uploaded, then sent: a photo as an image, a spoken reply as a voice note, else a document."""
        if msg.file is None:
            return
        # A voice note takes no caption: the text follows it as messages of its own.
        rest = self._text_parts(msg.chat_id, msg.content) if msg.file.voice and msg.content.strip() else []
        await send_parts(msg, [partial(self._send_file, msg.chat_id, msg.file, "" if rest else msg.content), *rest])

    async def _send_file(self, chat_id: str, file: OutgoingFile, caption: str) -> None:
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        form = aiohttp.FormData({"messaging_product": "whatsapp", "type": kind})
        form.add_field("file", file.data, filename=file.name, content_type=kind)
        uploaded = await self._graph("POST", f"{self.config.phone_number_id}/media", data=form)
        shown_as = "image" if file.photo else "audio" if file.voice else "document"
        media: dict[str, Any] = {"id": uploaded["id"]}
        if caption:
            media["caption"] = whatsapp_marks(caption)[:1024]
        if shown_as == "document":
            media["filename"] = file.name
        await self._send(chat_id, shown_as, media)

    async def send_typing(self, chat_id: str) -> None:
        """The typing indicator (it marks their latest message read, as WhatsApp requires)."""
        message = self._last_message.get(chat_id)
        if message is None:
            return
        try:
            await self._graph("POST", f"{self.config.phone_number_id}/messages", json={
                "messaging_product": "whatsapp", "status": "read", "message_id": message,
                "typing_indicator": {"type": "text"}})
        except SendFailed as exc:
            log.debug("whatsapp: typing for %s: %s", chat_id, exc)

    async def _send(self, wa_id: str, kind: str, part: dict[str, Any]) -> None:
        answer = await self._graph("POST", f"{self.config.phone_number_id}/messages", json={
            "messaging_product": "whatsapp", "recipient_type": "individual",
            **_addressed_to(await self._chats.account_of(wa_id)), "type": kind,
            kind: part})
        sent, words = _list(answer, "messages"), part.get("body") or part.get("caption")
        words = words.get("text") if isinstance(words, dict) else words  # an interactive message's body
        if words and sent and sent[0].get("id"):  # kept, so a reply to it can be read with what it answers
            try:
                await self.ctx.store.keep(f"{self.name}:{wa_id}", str(sent[0]["id"]), words)
            except Exception as exc:  # the message went; only a later reply's quote is lost
                log.warning("whatsapp: could not keep what was sent to %s: %s", wa_id, exc)

    async def _graph(self, method: str, path: str, **request: Any) -> dict[str, Any]:
        """One Graph API call; SendFailed (retry: no connection, 5xx, 429) when it did not go."""
        if self._http.closed:
            raise SendFailed("whatsapp: stopped", retry=True)
        try:
            async with self._http.request(method, f"{self.api}/{path}", allow_redirects=False, **request) as response:
                answer = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise SendFailed(f"whatsapp: {method} {path}: {type(exc).__name__}: {exc}", retry=True) from None
        if status < 300 and isinstance(answer, dict):
            return answer
        error = answer.get("error") if isinstance(answer, dict) and isinstance(answer.get("error"), dict) else {}
        if error.get("code") == OUTSIDE_WINDOW:
            raise SendFailed("whatsapp: outside the 24-hour window (the person has not written for a day; "
                             "only a template message may reach them)", retry=False)
        raise SendFailed(f"whatsapp: {method} {path}: HTTP {status}: {error.get('message') or 'no reason given'}",
                         retry=status >= 500 or status == 429)


def whatsapp_marks(text: str) -> str:
    """Markdown as models write it -> WhatsApp's own marks (``*bold*``, ``_italic_``, ``~strike~``;
    it showed ``**`` and ``#`` as they are). A link is its words, then its address: WhatsApp
    links addresses it sees, and has no hidden targets. A table is a list per row (a caption's too)."""
    return to_marks(tables_as_lists(text), lambda plain: plain,
                    lambda words, url: words if names_itself(words, url) else f"{words} ({url})")


def _addressed_to(chat_id: str) -> dict[str, str]:
    """Whom a message goes to: a number as ``to``, a business-scoped user id as ``recipient``."""
    return {"to": chat_id} if chat_id.isdigit() else {"recipient": chat_id}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadBody(400, f"the body is not valid JSON: {exc}") from None


def _list(node: Any, key: str) -> list[Any]:
    """``node[key]`` if it is a list of objects, else empty (Meta's payloads, or anyone's)."""
    found = node.get(key) if isinstance(node, dict) else None
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def _pick_list(rows: list[tuple[str, str]], text: str) -> dict[str, Any]:
    """``text`` with a list to pick from (Meta's interactive list: up to ten rows, titles of 24
    characters), under the command's name; a pick comes back as the row's id, ``/mode code``
    (``_words``)."""
    command = rows[0][1].partition(" ")[0]
    return {"type": "list", "body": {"text": text}, "action": {"button": "Choose", "sections": [
        {"title": command, "rows": [{"id": sends, "title": word} for word, sends in rows]}]}}


def _words(kind: Any, part: dict[str, Any], message: dict[str, Any]) -> str:
    """What a message says: its text or a file's caption; a shared place or contact cards as
    words the model can use; a pick from a list we sent as the command it stands for."""
    if kind == "interactive":
        reply = part.get(str(part.get("type"))) if part.get("type") in ("list_reply", "button_reply") else None
        return picked(str(reply.get("id") or "")) if isinstance(reply, dict) else ""
    if kind == "location" and isinstance(part.get("latitude"), (int, float)):
        return shared_place(part["latitude"], part.get("longitude") or 0.0,
                            ", ".join(str(part[k]) for k in ("name", "address") if part.get(k)) or None)
    if kind == "contacts":
        cards = [c for c in _list(message, "contacts") if isinstance(c.get("name"), dict)]
        return "\n".join(shared_contact(str(c["name"].get("formatted_name") or ""),
                                        [str(p["phone"]) for p in _list(c, "phones") if p.get("phone")]) for c in cards)
    return str(part.get("body") if kind == "text" else part.get("caption") or "")
