"""Signal adapter: through a ``signal-cli daemon --http`` the user runs for ``account`` (a
linked device or a registered number), as OpenClaw and Hermes do.

Events come from its Server-Sent Events stream (``GET /api/v1/events``), read by one worker at
a time and read again after a drop; messages go out through JSON-RPC (``POST /api/v1/rpc``,
``send``); ``GET /api/v1/check`` says whether the daemon is up. With ``--receive-mode
on-connection`` signal-cli takes messages from Signal only while a stream is open, so what is
sent while nanobot is away waits at Signal's server (by default signal-cli takes them at once
and, with no stream open, they are gone); a repeat (the same sender and timestamp) is dropped
by the intake.

Chats: ``signal:<number>`` (or the sender's account UUID when their number is hidden, or when
the number's chat is another account's: ``NumberChats``) and ``signal:group.<group id>``; what
goes to a number's chat is sent to its account. Identity is the number Signal delivered the
message from, with the account UUID as its handle; ``sourceName`` is the sender's own profile
name and never counts. Attachments are read from signal-cli's attachments folder without following links.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import mimetypes
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from nanobot import beneath
from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.channel_plugin import BaseChannel, ChannelContext, SendFailed, Sender, safe_filename, send_parts
from nanobot.message_context import noting_lost, shared_poll, with_quote
from nanobot.config import SignalConfig
from nanobot_channels.number_chats import NumberChats
from nanobot_channels.signal_format import signal_message
from nanobot_channels.text import split_message, tables_as_lists

log = logging.getLogger(__name__)

EVENTS = "signal events"  # the singleton: one worker reads the stream
CHECK_S = 10.0  # the daemon is on this machine or next to it: it answers at once or not at all
QUIET_S = 60.0  # signal-cli sends a keep-alive every 15 s: this long without a line is a dead stream
GROUP = "group."  # a group chat's id starts with this
MENTION_MARK = "\ufffc"  # where Signal's text had a mention


class SignalChannel(BaseChannel):
    name = "signal"
    max_message_len = 4000
    moves = "id"  # a number is recycled to a stranger; the handle, the account's UUID, stays with it

    def __init__(self, config: SignalConfig, ctx: ChannelContext) -> None:
        super().__init__(config, ctx)
        self.config: SignalConfig = config
        self.base = config.rpc_url.rstrip("/")
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, connect=CHECK_S))
        self._ids = itertools.count(1)
        self._chats = NumberChats(self.name, ctx.store)  # a number's chat is its first account's (its UUID)

    async def start(self) -> None:
        try:
            async with self._http.get(f"{self.base}/api/v1/check",
                                      timeout=aiohttp.ClientTimeout(total=CHECK_S)) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
        except (aiohttp.ClientError, OSError, TimeoutError, RuntimeError) as exc:
            await self.stop()
            raise RuntimeError(f"signal: signal-cli is not answering at {self.base} ({_reason(exc)}); start it with: "
                               f"{self.config.daemon_command()}") from None
        self.read_while_held(EVENTS, self._events)

    async def stop(self) -> None:
        await self.stop_receiving()
        await self._http.close()

    # -- incoming ------------------------------------------------------------------------
    async def _events(self) -> None:
        """The event stream until it ends: each message recorded before the next is read."""
        timeout = aiohttp.ClientTimeout(total=None, connect=CHECK_S, sock_read=QUIET_S)
        async with self._http.get(f"{self.base}/api/v1/events", params={"account": self.config.account},
                                  timeout=timeout) as response:
            if response.status != 200:
                raise RuntimeError(f"GET /api/v1/events answered HTTP {response.status}")
            self._report(None)
            async for event, data in _server_sent_events(response.content):
                if event == "receive":
                    await self._on_event(data)

    async def _on_event(self, data: str) -> None:
        try:
            envelope = json.loads(data)["envelope"]
            message = envelope.get("dataMessage")
        except (ValueError, KeyError, TypeError, AttributeError):
            log.info("signal: skipped an event that is not a message envelope")
            return
        number, uuid = envelope.get("sourceNumber"), envelope.get("sourceUuid")
        if not isinstance(message, dict) or not (number or uuid) or number == self.config.account:
            return  # receipts, typing, our own messages from another device
        who = Identity(str(number or uuid), str(uuid) if number and uuid else None, envelope.get("sourceName"))
        group = (message.get("groupInfo") or {}).get("groupId")
        chat_id = f"{GROUP}{group}" if group else await self._chats.chat_of(who, await self._vouched(who))
        mentioned = any(m.get("number") == self.config.account for m in message.get("mentions") or []) or \
            (message.get("quote") or {}).get("authorNumber") == self.config.account
        if not self._addressed(not group, mentioned):  # before any attachment is read: kept for the next that is
            return await self._overhear(chat_id, who, _words(message), shown=who.id)
        attachments = message.get("attachments") or []
        media = await self._attachments(attachments, Sender(self.name, chat_id, who, not group)) \
            if attachments and await self._may_download(who) else []
        quote = message.get("quote") or {}  # the message this one replies to: its words, its author
        text, quoted = with_quote(_words(message).replace(MENTION_MARK, "").strip(), quote.get("text"),
                                  quote.get("authorNumber") or quote.get("authorUuid"), who.id, self.config.account)
        sent_at = str(envelope.get("timestamp"))  # with its author, what a quote of it names
        went = await self._handle(InboundMessage(
            self.name, chat_id, who.id, noting_lost(text, len(attachments), media), sender_name=who.name,
            sender_handle=who.handle, media=media, is_private=not group, delivery_key=f"{who.id}:{sent_at}",
            untrusted=quoted, reply_context={"message_id": sent_at, "author": who.id} if group else None),
            mentioned=mentioned)  # in a group, answered quoting the question
        if went:  # (in a group too: its number's chat is theirs from then on)
            await self._chats.admitted(who, await self._vouched(who))

    async def _attachments(self, attachments: list[dict[str, Any]], sender: Sender) -> list[str]:
        """What signal-cli saved, copied into the chat's inbox (never through a link in its folder)."""
        folder, kept = Path(self.config.attachments_dir).expanduser(), []
        for attachment in attachments:
            stored = str(attachment.get("id") or "")
            try:
                data = await asyncio.to_thread(beneath.read_bytes, folder, stored, self.ctx.max_media_bytes)
            except (OSError, ValueError) as exc:
                log.warning("signal: could not read attachment %s: %s", stored, exc)
                continue
            name = attachment.get("filename") or stored + (mimetypes.guess_extension(
                attachment.get("contentType") or "") or "")
            kept.append(await self._keep(await self.chat_root(sender), stored[:12], name, data))
        return [path for path in kept if path]

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        answers, author = msg.answers, (msg.reply_context or {}).get("author")
        quote = {"quoteTimestamp": int(answers), "quoteAuthor": author} if answers and answers.isdigit() and author \
            else {}  # a group's answer quotes its question
        first, *rest = [partial(self._rpc, "send", msg.chat_id, **signal_message(chunk))
                        for chunk in split_message(tables_as_lists(msg.content), self.max_message_len)]
        await send_parts(msg, [partial(first, **quote), *rest])

    async def send_stream(self, msg: OutboundMessage) -> None:
        return None  # a Signal message is not edited as it grows: the final text is sent whole

    async def send_file(self, msg: OutboundMessage) -> None:
        if msg.file is None:
            return
        kind = mimetypes.guess_type(msg.file.name)[0] or "application/octet-stream"
        data = base64.b64encode(msg.file.data).decode()
        name = safe_filename(msg.file.name)  # a "," or ";" in it would end the data URI's part early
        await self._rpc("send", msg.chat_id, **signal_message(msg.content),
                        attachments=[f"data:{kind};filename={name};base64,{data}"])

    async def send_typing(self, chat_id: str) -> None:
        try:
            await self._rpc("sendTyping", chat_id)
        except SendFailed as exc:
            log.debug("signal: typing in %s: %s", chat_id, exc)

    async def _rpc(self, method: str, chat_id: str, **params: Any) -> Any:
        """One JSON-RPC call for ``chat_id``. SendFailed when it did not go: retry while the
        daemon cannot be reached or fails; not when Signal refused it (an unknown number)."""
        target = {"groupId": chat_id[len(GROUP):]} if chat_id.startswith(GROUP) else \
            {"recipient": [await self._chats.account_of(chat_id)]}
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method,
                "params": {"account": self.config.account, **target, **params}}
        if self._http.closed:
            raise SendFailed("signal: stopped", retry=True)
        try:
            async with self._http.post(f"{self.base}/api/v1/rpc", json=body) as response:
                if response.status >= 500:
                    raise SendFailed(f"signal: {method} answered HTTP {response.status}", retry=True)
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise SendFailed(f"signal: {method} to {chat_id} failed: {_reason(exc)}", retry=True) from None
        error = answer.get("error") if isinstance(answer, dict) else {"message": "not a JSON-RPC answer"}
        if error:
            raise SendFailed(f"signal: {method} to {chat_id} refused: {error.get('message')}", retry=False)
        return answer.get("result")


def _words(message: dict[str, Any]) -> str:
    """What a message says: its text, or the poll it starts (signal-cli's ``pollCreate``) as words."""
    poll = message.get("pollCreate")
    if isinstance(poll, dict) and isinstance(poll.get("question"), str):
        options = poll.get("options") if isinstance(poll.get("options"), list) else []
        return shared_poll(poll["question"], [option for option in options if isinstance(option, str)])
    return message.get("message") or ""


async def _server_sent_events(content: aiohttp.StreamReader) -> AsyncIterator[tuple[str, str]]:
    """(event, data) for each event of a text/event-stream; comments (keep-alives) skipped."""
    event, data = "message", []
    async for raw in content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


def _reason(exc: BaseException) -> str:
    """An HTTP status we raised says it all; a library's error needs its kind too."""
    if isinstance(exc, RuntimeError) or not str(exc):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
