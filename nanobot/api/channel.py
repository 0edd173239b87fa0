"""The API as a channel of the gateway: a request's message goes through the durable intake and
the dispatcher like a Telegram message (per-chat order, slots, history, /commands, /stop),
and what the dispatcher sends to the chat comes back here to the waiting request.

Each request waits on its message's own reply (the dispatcher answers it, as for
``Dispatcher.ask``: the reply, "Stopped." for ``/stop``, the stop note for a stopped turn).
Turns of one chat run one after another, so stream updates belong to the first request of the
chat still waiting. A request whose client went away stops waiting at once; its turn still
runs and its reply stays in the history.

Notes (``<say>``, notices) and files the turn sends come to the request as ``Aside``s, beside
its text; a file is kept in the chat's ``sent/`` folder for the page to download. They go
through the outbox, so the last ones may land just after the turn's answer: where the chat's
messages are delivered by this process (alone on its store, or holding the chat among workers),
a request closes on the turn's own reply message
(sent after all of them, however long they take); only if that never comes, ``CLOSE_GRACE_S``
after the answer or after the last of them. A note or file while no request waits (a job's
turn, a reader who left) is kept in the chat's history for its reader, as a job's output is.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanobot import beneath
from nanobot.channel_plugin import BaseChannel
from nanobot.bus import InboundMessage, OutboundMessage, OutgoingFile
from nanobot.config import PluginChannelConfig
from nanobot.trust import API_CHANNEL

if TYPE_CHECKING:
    from nanobot.api.front_door import FrontDoor

FINAL = None  # what Reply.pieces carries after the last piece
CLOSE_GRACE_S = 5.0  # a request's wait for a reply message that may never come, after the last thing that did
# A stream says nothing while a tool runs: proxies and load balancers end a connection quiet for
# 60 s (nginx, AWS), so a comment line goes out after this long (clients skip it).
KEEPALIVE_S = 15.0
REQUEST = "request"  # the key of a request's id in its message's reply_context
UNASKED = "unasked"  # the sender of a message kept for a chat's reader: sent there while no request waited


@dataclass(frozen=True)
class Aside:
    """Something a turn sent beside its reply text: a note, or a file (``path`` in the chat's folder)."""

    note: str = ""
    path: str = ""
    name: str = ""
    photo: bool = False

    def as_json(self) -> dict[str, Any]:
        if self.path:
            return {"file": {"path": self.path, "name": self.name, "photo": self.photo, "caption": self.note}}
        return {"note": self.note}


@dataclass(eq=False)
class Reply:
    """One request's view of its turn: text pieces and asides as they come, then the final text."""

    pieces: asyncio.Queue[str | Aside | None] = field(default_factory=asyncio.Queue)
    shown: str = ""  # what was handed out so far (streams resend the whole text each time)
    final: str = ""
    asides: list[Aside] = field(default_factory=list)
    finished: bool = False
    closer: asyncio.TimerHandle | None = None  # closes it if the turn's last message is late
    request_id: str = ""
    ended: bool = False  # its turn's last message came before its answer (/stop's does)

    def show(self, text: str) -> None:
        """A stream update carries the whole text so far: hand out only what is new."""
        if self.finished:
            return
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.pieces.put_nowait(text[len(self.shown):])
            self.shown = text

    def aside(self, aside: Aside) -> None:
        if self.finished:
            return
        self.asides.append(aside)
        self.pieces.put_nowait(aside)

    def finish(self, text: str) -> None:
        if self.finished:
            return
        self.final = text
        self.show(text)
        self.finished = True
        if not text.startswith(self.shown):  # the final text differs from what was streamed
            self.pieces.put_nowait("\n" + text)
        self.pieces.put_nowait(FINAL)


class ApiChannel(BaseChannel):
    name = "api"
    max_message_len = 1_000_000

    def __init__(self, door: FrontDoor, name: str = API_CHANNEL) -> None:
        super().__init__(PluginChannelConfig(enabled=True), door.channel_context())
        self.name = name  # type: ignore[misc]  # "api", or "cli" for the terminal's socket
        self.keepalive_s = door.keepalive_s  # a stream quiet this long gets a comment line (a proxy would end it)
        self.chat_folder = door.chat_folder  # a chat's folder (by its key): where files it is sent are kept
        # Whether a chat's messages come to this process (among workers, another's chat's never do)
        self.held_here = door.held_here
        self._waiting: dict[str, deque[Reply]] = {}
        self._closing: dict[str, Reply] = {}  # answered, waiting for the turn's reply message

    async def ask(self, sender: str, chat_id: str, content: str, request_id: str, *, mode: str | None = None,
                  media: list[str] | None = None, untrusted: str | None = None) -> Reply:
        """Hand the message to the gateway; the Reply fills as the turn runs."""
        reply = Reply(request_id=request_id)
        self._waiting.setdefault(chat_id, deque()).append(reply)
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        answered.add_done_callback(lambda done: self._answered(chat_id, reply, done))
        msg = InboundMessage(self.name, chat_id, sender, content, media=list(media or ()), delivery_key=request_id,
                             mode=mode, reply_future=answered, untrusted=untrusted,
                             reply_context={REQUEST: request_id})  # its reply message names the request
        try:
            await self.ctx.accept([msg])
        except BaseException:
            self.forget(chat_id, reply)
            raise
        return reply

    def _answered(self, chat_id: str, reply: Reply, done: asyncio.Future[str]) -> None:
        self.forget(chat_id, reply)
        text = "" if done.cancelled() else done.result()
        if not text or reply.ended or not self.held_here(f"{self.name}:{chat_id}"):
            return reply.finish(text)
        if (earlier := self._closing.pop(chat_id, None)) is not None:
            earlier.finish(earlier.final)
        reply.final = text
        reply.show(text)  # the text at once: what still comes (its voice note) follows it
        self._closing[chat_id] = reply
        self._close_in(CLOSE_GRACE_S, chat_id, reply)

    def _close_in(self, seconds: float, chat_id: str, reply: Reply) -> None:
        """Close ``reply`` ``seconds`` from now, unless it was to close later already."""
        loop = asyncio.get_running_loop()
        if reply.closer is not None:
            if reply.closer.when() >= loop.time() + seconds:
                return
            reply.closer.cancel()
        reply.closer = loop.call_later(seconds, self._close, chat_id, reply)

    def _aside(self, chat_id: str, reply: Reply, aside: Aside) -> None:
        """A note or file for the request; after its answer, more may follow before the turn's
        reply message (a long trail of files on a busy machine): the wait starts again."""
        reply.aside(aside)
        if self._closing.get(chat_id) is reply:
            self._close_in(CLOSE_GRACE_S, chat_id, reply)

    def _close(self, chat_id: str, reply: Reply) -> None:
        if self._closing.get(chat_id) is reply:
            del self._closing[chat_id]
        reply.finish(reply.final)

    def _delivered(self, chat_id: str) -> Reply | None:
        """A message for the chat came here: the request it belongs to (the one closing first)."""
        queue = self._waiting.get(chat_id)
        return self._closing.get(chat_id) or (queue[0] if queue else None)

    def forget(self, chat_id: str, reply: Reply) -> None:
        """The client went away: later replies of the chat go to the requests behind it."""
        queue = self._waiting.get(chat_id)
        if queue and reply in queue:
            queue.remove(reply)
            if not queue:
                del self._waiting[chat_id]

    async def send(self, msg: OutboundMessage) -> None:
        """The reply itself comes through the request's future (its message here closes the
        request); notes and notices (<say>) are asides of the request."""
        reply = self._delivered(msg.chat_id)
        if msg.turn_reply:
            self._turn_ended(msg, reply)
        elif reply is not None and msg.content:
            self._aside(msg.chat_id, reply, Aside(note=msg.content))
        elif msg.content:
            await self._keep(msg, msg.content)

    async def _keep(self, msg: OutboundMessage, text: str) -> None:
        """Sent while no request waits (a job's turn; a reader who left): kept in the chat's
        history for its reader, once per outbox record, as a job's output is."""
        if msg.durable:
            await self.ctx.accept([InboundMessage(self.name, msg.chat_id, UNASKED, text, source="task",
                                                  delivery_key=f"outbox-{msg.outbox_id}" if msg.outbox_id else None)])

    def _turn_ended(self, msg: OutboundMessage, reply: Reply | None) -> None:
        """The turn's last message came: close its request, or, when the reply's voice note
        follows (``voice_follows``), wait for that one."""
        # /stop's answer comes after its reply is sent (a terminal in process leaves once
        # answered): that request closes as soon as it is answered, not a grace later.
        asked = (msg.reply_context or {}).get(REQUEST)
        for waiting in self._waiting.get(msg.chat_id, ()):
            waiting.ended = waiting.ended or waiting.request_id == asked
        if reply is None or self._closing.get(msg.chat_id) is not reply:
            return
        if msg.voice_follows:
            self._close_in(msg.voice_follows, msg.chat_id, reply)
        else:
            self._close(msg.chat_id, reply)

    async def send_file(self, msg: OutboundMessage) -> None:
        """Kept in the chat's ``sent/`` folder; the request gets where, to show or download it."""
        assert msg.file is not None
        reply = self._delivered(msg.chat_id)
        relative = await keep_sent(await self.chat_folder(f"{self.name}:{msg.chat_id}"), msg.file)
        if reply is not None:
            self._aside(msg.chat_id, reply, Aside(note=msg.content, path=relative, name=relative.partition("_")[2],
                                                  photo=msg.file.photo))
        elif not msg.file.voice:  # (a reply's voice note: its words are kept already)
            await self._keep(msg, f"📎 {relative}{f': {msg.content}' if msg.content else ''}")
        if msg.turn_reply:  # the reply's voice note
            self._turn_ended(msg, reply)

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far: its new part goes to the chat's running request at once."""
        reply = self._delivered(msg.chat_id)
        if reply is not None:
            reply.show(msg.content)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for queue in self._waiting.values():
            for reply in queue:
                reply.pieces.put_nowait(FINAL)
        self._waiting.clear()
        for reply in self._closing.values():
            reply.finish(reply.final)
        self._closing.clear()

    async def send_typing(self, chat_id: str) -> None:
        return None


async def keep_sent(folder: Path, file: OutgoingFile) -> str:
    """``file`` kept in the chat's ``folder`` under ``sent/``, by a name no other file takes:
    its path there (``sent/1a2b3c4d_chart.png``)."""
    safe = re.sub(r"[^\w.-]", "_", file.name)[-100:] or "file"
    relative = f"sent/{secrets.token_hex(4)}_{safe}"
    await asyncio.to_thread(beneath.write_bytes, folder, relative, file.data)
    return relative
