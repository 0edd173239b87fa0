"""The API as a channel of the gateway: a request's message goes through the durable intake and
the dispatcher like a Telegram message (per-chat order, slots, history, /commands, /stop),
and what the dispatcher sends to the chat comes back here to the waiting request.

Each request waits on its message's own reply (the dispatcher answers it, as for
``Dispatcher.ask``: the reply, "Stopped." for ``/stop``, the stop note for a stopped turn).
Turns of one chat run one after another, so stream updates belong to the first request of the
chat still waiting. A request whose client went away stops waiting at once; its turn still
runs and its reply stays in the history.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from nanobot_channels.base import BaseChannel, ChannelContext
from nanobot.bus import REPLY_FUTURE, InboundMessage, OutboundMessage
from nanobot.config import PluginChannelConfig
from nanobot.trust import API_CHANNEL

FINAL = None  # what Reply.pieces carries after the last piece


@dataclass(eq=False)
class Reply:
    """One request's view of its turn: text pieces as they are shown, then the final text."""

    pieces: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    shown: str = ""  # what was handed out so far (streams resend the whole text each time)
    final: str = ""

    def show(self, text: str) -> None:
        """A stream update carries the whole text so far: hand out only what is new."""
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.pieces.put_nowait(text[len(self.shown):])
            self.shown = text

    def finish(self, text: str) -> None:
        self.final = text
        self.show(text)
        if not text.startswith(self.shown):  # the final text differs from what was streamed
            self.pieces.put_nowait("\n" + text)
        self.pieces.put_nowait(FINAL)


class ApiChannel(BaseChannel):
    name = "api"
    max_message_len = 1_000_000

    def __init__(self, ctx: ChannelContext, name: str = API_CHANNEL) -> None:
        super().__init__(PluginChannelConfig(enabled=True), ctx)
        self.name = name  # type: ignore[misc]  # "api", or "cli" for the terminal's socket
        self._waiting: dict[str, deque[Reply]] = {}

    async def ask(self, sender: str, chat_id: str, content: str, request_id: str, *, mode: str | None = None) -> Reply:
        """Hand the message to the gateway; the Reply fills as the turn runs."""
        reply = Reply()
        self._waiting.setdefault(chat_id, deque()).append(reply)
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        answered.add_done_callback(lambda done: self._answered(chat_id, reply, done))
        metadata: dict[str, object] = {"delivery_key": request_id, REPLY_FUTURE: answered,
                                       **({"mode": mode} if mode else {})}
        msg = InboundMessage(self.name, chat_id, sender, content, metadata=metadata)
        try:
            await self.ctx.accept([msg])
        except BaseException:
            self.forget(chat_id, reply)
            raise
        return reply

    def _answered(self, chat_id: str, reply: Reply, done: asyncio.Future[str]) -> None:
        self.forget(chat_id, reply)
        reply.finish("" if done.cancelled() else done.result())

    def forget(self, chat_id: str, reply: Reply) -> None:
        """The client went away: later replies of the chat go to the requests behind it."""
        queue = self._waiting.get(chat_id)
        if queue and reply in queue:
            queue.remove(reply)
            if not queue:
                del self._waiting[chat_id]

    async def send(self, msg: OutboundMessage) -> None:
        """The reply itself comes through the request's future; notes and notices (<say>) are
        not part of a completion."""

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far: its new part goes to the chat's running request at once."""
        queue = self._waiting.get(msg.chat_id)
        if queue:
            queue[0].show(msg.content)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for queue in self._waiting.values():
            for reply in queue:
                reply.pieces.put_nowait(FINAL)
        self._waiting.clear()

    async def send_typing(self, chat_id: str) -> None:
        return None
