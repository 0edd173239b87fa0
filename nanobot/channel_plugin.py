"""The channel plugin interface: what every channel adapter is (start, stop, send, typing),
what it is given (``ChannelContext``), and the shared intake rules. The adapters in
``channels/`` and any installed one (entry point group ``nanobot.channels``) build on this and
the foundation modules only; the core never imports an adapter.

Adapters turn a platform's events into ``_handle_message`` calls and OutboundMessages into
platform sends. Who may talk (allowFrom, pairing, group policy) is decided here, once, so no
adapter can forget it: nothing from an unknown sender reaches the bus, let alone the model.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar, Coroutine, Protocol, Sequence

import logging

from nanobot import beneath
from nanobot.bus import Identity, InboundMessage, Moves, OutboundMessage
from nanobot.config import ChannelSection
from nanobot.coordination import Alone, Singletons, run_while_held
from nanobot.eventloop import Background
from nanobot.message_context import HEARD_CHARS, Heard, after_heard
from nanobot.workspace_quota import check_room

log = logging.getLogger(__name__)

RECONNECT_FIRST_S, RECONNECT_MAX_S = 1.0, 60.0  # a dropped event stream is read again after these


class SendFailed(Exception):
    """The platform did not take a message. ``retry``: it may later (no connection, 5xx, a
    network timeout); otherwise the message itself was refused (blocked by the user, a bad
    request) and sending it again would fail the same way."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


# Awaited after each part of a message that went, but the last (``send_parts``): set by the
# gateway's Outbound for a send from the outbox, which writes the count on the message's row.
PART_WENT: ContextVar[Callable[[OutboundMessage], Awaitable[None]] | None] = ContextVar("part_went", default=None)


async def send_parts(msg: OutboundMessage, parts: Sequence[Callable[[], Awaitable[Any]]]) -> None:
    """Send a message that goes out in parts (a long reply split; a file, then the rest of its
    caption) in order, from the first the platform has not taken at an earlier attempt
    (``msg.parts_sent``). Each part that goes is counted on ``msg`` and, before the next one
    goes, on its outbox row: after a failure or a crash part way through, the next attempt goes
    on from there (a crash may repeat only the part that was going out)."""
    went = PART_WENT.get()
    for i in range(msg.parts_sent, len(parts)):
        await parts[i]()
        msg.parts_sent = i + 1
        if went is not None and msg.parts_sent < len(parts):
            await went(msg)


class Intake(Protocol):
    async def accept(self, messages: list[InboundMessage]) -> None:
        """Record messages durably, then hand the new ones (not repeats) to the agent."""


class AccessGate(Protocol):
    async def check(self, channel: str, who: Identity, allow_from: list[str], is_private: bool,
                    chat_id: str | None = None) -> tuple[bool, str | None]:
        """Return (admitted, reply); the reply (e.g. a pairing code) goes to the sender if not admitted."""

    async def is_allowed(self, channel: str, who: Identity, allow_from: list[str]) -> bool:
        """The same verdict as ``check`` for an admitted sender, without side effects (no code issued)."""

    async def vouched(self, channel: str, who: Identity, entries: list[str], moves: Moves) -> Identity:
        """``who`` as far as the name ``entries`` list is still its first account's (``nanobot.handles``)."""


class ChannelStore(Protocol):
    """What a channel keeps with its messages (the gateway's delivery store, shared by workers):
    where its event stream stands (a Matrix sync token; any value kept under a key until it
    changes: the number a WhatsApp user id stood for), what a group said that was not for the
    bot (``Heard``: sender id, shown as, text), until the next message that is, and notes on a
    chat for its later messages (``keep``: the words of what the bot sent, where a reply names
    only its id; an album that was for the bot)."""

    async def position(self, channel: str) -> str | None: ...

    async def keep_position(self, channel: str, position: str) -> None: ...

    async def hear(self, chat: str, heard: Heard) -> None: ...

    async def take_heard(self, chat: str, keep: int) -> list[Heard]:
        """What ``chat`` said since it was last taken (the ``keep`` latest); forgotten now."""

    async def keep(self, chat: str, key: str, text: str = "") -> None:
        """Note ``text`` under ``key`` for ``chat``'s later messages, for 3 days (the first note stays)."""

    async def kept(self, chat: str, key: str) -> str | None:
        """What was noted under ``key`` (``keep``); None if nothing is."""


class Remembered:
    """A ChannelStore in memory only (a bare channel, tests): a restart forgets it."""

    def __init__(self) -> None:
        self._kept: dict[str, str] = {}
        self._heard: dict[str, list[Heard]] = {}
        self._notes: dict[tuple[str, str], str] = {}

    async def position(self, channel: str) -> str | None:
        return self._kept.get(channel)

    async def keep_position(self, channel: str, position: str) -> None:
        self._kept[channel] = position

    async def hear(self, chat: str, heard: Heard) -> None:
        self._heard.setdefault(chat, []).append(heard)

    async def take_heard(self, chat: str, keep: int) -> list[Heard]:
        return self._heard.pop(chat, [])[-keep:] if keep else []

    async def keep(self, chat: str, key: str, text: str = "") -> None:
        self._notes.setdefault((chat, key), text)

    async def kept(self, chat: str, key: str) -> str | None:
        return self._notes.get((chat, key))


class LastRead:
    """Where each of a channel's latest chats was read up to (a message id), kept in one
    position: a platform that replays nothing after a restart (Discord, Slack) is read from
    each chat's history after it. ``key``: the position's name (known once the adapter is
    signed in); ``order``: how two ids compare. Other workers may write it too (Slack's Events
    API), so what is kept is taken in before each write."""

    def __init__(self, store: ChannelStore, key: Callable[[], str], order: Callable[[str], Any],
                 chats: int = 100) -> None:
        self.store, self.key, self.order, self.chats = store, key, order, chats
        self._last: dict[str, str] = {}  # this worker's view, changed at once (no lost update here)

    async def note(self, chat_id: str, message_id: str) -> None:
        """``message_id`` of ``chat_id`` is recorded."""
        self._take({chat_id: message_id})
        self._take(json.loads(await self.store.position(self.key()) or "{}"))
        await self.store.keep_position(self.key(), json.dumps(self._last))

    async def chats_to_read(self) -> list[tuple[str, str]]:
        """(chat, the last message read there) for each chat kept."""
        self._take(json.loads(await self.store.position(self.key()) or "{}"))
        return list(self._last.items())

    def _take(self, ids: dict[str, str]) -> None:
        """The later id of each chat; the ``chats`` latest chats."""
        for chat_id, message_id in ids.items():
            if chat_id not in self._last or self.order(message_id) > self.order(self._last[chat_id]):
                self._last[chat_id] = message_id
        self._last = dict(sorted(self._last.items(), key=lambda item: self.order(item[1]))[-self.chats:])


@dataclass(frozen=True)
class Sender:
    """Who wrote a message and where: what decides the chat's folder (owner or member)."""

    channel: str
    chat_id: str
    who: Identity
    is_private: bool


@dataclass
class ChannelContext:
    intake: Intake  # where admitted messages go: the gateway's durable intake
    access: AccessGate
    workspace: Path
    max_media_bytes: int = 20 * 1024 * 1024
    max_workspace_mb: int | None = None  # tools.maxWorkspaceMb: what sent files may fill it to (None: no limit)
    # The chat's own root for downloads (its inbox/ is there); the gateway supplies the trust
    # rule (a member chat's folder). The default, the whole workspace, suits a bare channel.
    chat_root: Callable[[Sender], Path] | None = None
    # Work one process at a time may do (Telegram polling, a Discord connection); alone, always ours.
    singletons: Singletons = field(default_factory=Alone)
    # Where a started adapter says it is in trouble (channel name, why; None once it is fine
    # again): a dropped mailbox connection being retried shows in status and /readyz.
    report: Callable[[str, str | None], None] | None = None
    # Where event streams stand and what groups said: the gateway keeps them in its delivery store.
    store: ChannelStore = field(default_factory=Remembered)
    # A webhook request whose headers or body take longer is ended (None: nanobot.listener's).
    http_timeout_s: float | None = None
    # Where an adapter keeps keys that belong to this process alone (a Matrix device's encryption
    # keys), readable by this user only; None among workers, where no one process serves every chat.
    keys_dir: Path | None = None

    async def accept(self, messages: list[InboundMessage]) -> None:
        await self.intake.accept(messages)

    @property
    def positions(self) -> ChannelStore:
        """``store`` by its name from before it also kept what groups said (adapters written then)."""
        return self.store


class BaseChannel(ABC):
    name: ClassVar[str]
    max_message_len: ClassVar[int]
    # A third-party adapter's own section class (a PluginChannelConfig subclass), if it has one
    config_model: ClassVar[type[ChannelSection] | None] = None
    # Which name of a sender may pass to another account (``Moves``): it counts only for the
    # account first seen with it here.
    moves: ClassVar[Moves] = "handle"

    def __init__(self, config: ChannelSection, ctx: ChannelContext) -> None:
        self.config = config  # this channel's section of the config (TelegramConfig, ...)
        self.ctx = ctx
        self._troubles: dict[str, str] = {}  # what is wrong now, by part (``_report``)
        self.receiving = Background()  # the event stream's reader (``read_while_held``)

    @abstractmethod
    async def start(self) -> None:
        """Connect and begin receiving; return once the channel is up."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop receiving and release connections; must not raise."""

    async def stop_receiving(self) -> None:
        """Stop taking in new messages but keep sending, so turns still running at shutdown can
        deliver their replies before ``stop()``. By default the reader ``read_while_held``
        started stops; messages that arrive later wait on the platform for the next start."""
        await self.receiving.stop()

    @abstractmethod
    async def send(self, msg: OutboundMessage) -> None:
        """Deliver one text message (split as the platform needs): only ``kind == "text"`` comes
        here, each other kind has its method (the gateway's Outbound decides which, once).
        Return once the platform took it, raise SendFailed if it did not. Retrying later is the outbox's job (it backs off while
        the platform is down); an adapter retries only what the platform asks it to (a 429)."""

    @abstractmethod
    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far (``msg.kind == "stream"``, its whole text each time): a chat platform
        edits one message as it grows, a live client (the API, the terminal) gets what is new;
        the final text arrives with the same ``stream_id``. Every channel decides
        (no silent default: the API's streams once went nowhere through one); a channel that
        cannot show a reply growing returns and shows only the final text."""

    async def send_file(self, msg: OutboundMessage) -> None:
        """Send ``msg.file`` (a photo or a document) with ``msg.content`` as its caption. A
        channel that cannot send files says so in the chat instead."""
        name = msg.file.name if msg.file else "a file"
        await self.send(OutboundMessage(msg.channel, msg.chat_id,
                                        "\n".join(filter(None, [msg.content, f"[{name}: this channel cannot send files]"]))))

    @abstractmethod
    async def send_typing(self, chat_id: str) -> None:
        """Show a typing indicator in the chat, best effort."""

    def _report(self, why: str | None, part: str = "") -> None:
        """In trouble since it started (``why``), or fine again (None); shown by ``status`` and
        ``/readyz``. ``part``: a channel with two sides (email's mailbox and its SMTP server)
        reports each on its own, and is fine when both are."""
        if why == self._troubles.get(part):
            return  # nothing new: fine and was, or the same trouble again
        if why is None:
            self._troubles.pop(part, None)
        else:
            self._troubles[part] = why
        if self.ctx.report is not None:
            self.ctx.report(self.name, "; ".join(self._troubles.values()) or None)

    def read_while_held(self, singleton: str, read: Callable[[], Awaitable[None]],
                        first: Coroutine[Any, Any, None] | None = None) -> None:
        """Start reading in the background until ``stop_receiving``: ``read()`` (a platform's
        event stream) on one worker at a time; when it ends or fails it is started again, after
        ``RECONNECT_FIRST_S`` doubling to ``RECONNECT_MAX_S``, with the trouble in status
        meanwhile. ``read`` says ``_report(None)`` once it is connected. ``first``: the first
        round instead of ``read()``, when start() held the singleton and connected already (so a
        refused token failed it)."""
        self.receiving.run(self._read_while_held(singleton, read, first), name=singleton)

    async def _read_while_held(self, singleton: str, read: Callable[[], Awaitable[None]],
                               first: Coroutine[Any, Any, None] | None) -> None:
        delay = RECONNECT_FIRST_S
        try:
            while True:
                held = await self.ctx.singletons.hold(singleton)
                began = time.monotonic()
                work = await run_while_held(self.ctx.singletons, held, first or read())
                first = None
                if not work.cancelled():  # cancelled: lost the singleton; another worker reads now
                    delay = await self._reconnect_after(work.exception(), delay, began)
        finally:
            if first is not None:
                first.close()  # stopped before its round: never started, nothing to undo

    async def _reconnect_after(self, failed: BaseException | None, delay: float, began: float) -> float:
        """Say why a stream stopped, wait ``delay``; the next delay."""
        why = (str(failed) or type(failed).__name__).removeprefix(f"{self.name}: ") if failed \
            else "the stream ended"
        log.warning("%s: %s; reconnecting in %g s", self.name, why, delay)
        self._report(f"disconnected ({why}), reconnecting")
        if time.monotonic() - began > RECONNECT_MAX_S:
            delay = RECONNECT_FIRST_S  # it had been up a while: this is a new outage
        await asyncio.sleep(delay)
        return min(delay * 2, RECONNECT_MAX_S)

    async def chat_root(self, sender: Sender) -> Path:
        """Where ``sender``'s files go, by the sender as vouched: whoever holds an owner's old name is a member."""
        return self.ctx.chat_root(replace(sender, who=await self._vouched(sender.who))) if self.ctx.chat_root \
            else self.ctx.workspace

    async def _keep(self, root: Path, prefix: str, filename: str, data: bytes) -> str | None:
        """Write a file someone sent into the chat's ``inbox/`` as ``<channel>_<prefix>_<filename>``
        (the name made safe), never through a link the chat made (``beneath``); its path
        relative to the chat's root, as ``media`` lists it, or None when the folder refused it or
        the workspace is full (the message still goes, without the file)."""
        relative = f"inbox/{self.name}_{prefix}_{safe_filename(filename)}"
        try:
            if self.ctx.max_workspace_mb is not None:
                await asyncio.to_thread(check_room, self.ctx.workspace, self.ctx.max_workspace_mb, len(data))
            await asyncio.to_thread(beneath.write_bytes, root, relative, data)
        except OSError as exc:
            log.warning("%s: not keeping %s: %s", self.name, relative, exc)
            return None
        return relative

    def _addressed(self, is_private: bool, mentioned: bool) -> bool:
        """Whether the bot should read this message at all: always in private chats; in groups
        under ``groupPolicy: "mention"`` only when mentioned or replied to. Adapters ask this
        before downloading anything, and ``_handle_message`` asks again."""
        return is_private or mentioned or self.config.group_policy != "mention"

    async def _may_download(self, who: Identity) -> bool:
        """Whether this sender is admitted already; ask before fetching their attachments, so a
        stranger's files never touch the disk."""
        return await self.ctx.access.is_allowed(self.name, await self._vouched(who), self.config.let_in)

    async def _vouched(self, who: Identity) -> Identity:
        """``who`` as far as the name that may change hands is still its first account's (``moves``)."""
        return await self.ctx.access.vouched(self.name, who, self.config.let_in, self.moves) if who.handle else who

    async def _handle_message(self, *, sender: Identity, chat_id: str, content: str, media: list[str] | None = None,
                              is_private: bool = True, mentioned: bool = False, delivery_key: str | None = None) -> bool:
        """Apply group policy and access control, then hand the message on. True if it went.
        ``sender``: only what the platform vouches for in ``id`` and ``handle`` (``Identity``).
        ``delivery_key``: the platform's id for it, by which repeats are dropped. (An adapter
        with more to say about a message, as the built-in ones have, builds the InboundMessage
        with ``nanobot.message_context`` and calls ``_handle``.)"""
        return await self._handle(InboundMessage(
            self.name, chat_id, sender.id, content, sender_name=sender.name, sender_handle=sender.handle,
            media=media or [], is_private=is_private, delivery_key=delivery_key), mentioned=mentioned)

    async def _handle(self, msg: InboundMessage, *, mentioned: bool = False) -> bool:
        """``_handle_message`` for a message the adapter built (with durations, reply context)."""
        admitted = await self._admit(msg, mentioned=mentioned)
        if admitted is not None:
            await self.ctx.accept([admitted])
        return admitted is not None

    async def _overhear(self, chat_id: str, who: Identity, text: str, shown: str | None = None) -> None:
        """A group message not for the bot, kept for the next that is (``after_heard``): an allowed
        person's only, as nothing a stranger writes reaches the model. ``shown``: how the model
        is told who wrote it (by default the vouched handle, else the id)."""
        if self.config.group_history and text.strip() and await self.ctx.access.is_allowed(
                self.name, who := await self._vouched(who), self.config.let_in):
            await self.ctx.store.hear(f"{self.name}:{chat_id}", (
                who.id, shown or (f"@{who.handle}" if who.handle else who.id), " ".join(text.split())[:HEARD_CHARS]))

    async def _admit(self, msg: InboundMessage, *, mentioned: bool = False) -> InboundMessage | None:
        """``msg``, if group policy and access control let it through (for adapters that hand
        over a batch at a time); a stranger gets the gate's reply (a pairing code)."""
        if not self._addressed(msg.is_private, mentioned):
            return None
        if not msg.content.strip() and not msg.media:  # a sticker, a reaction, someone joining:
            return None  # nothing to answer (a turn would be a model call on an empty message)
        if (who := await self._vouched(msg.sender)) != msg.sender:  # trust reads the sender from the message
            msg = replace(msg, sender_id=who.id, sender_handle=who.handle)
        admitted, reply = await self.ctx.access.check(self.name, who, self.config.let_in, msg.is_private, msg.chat_id)
        if not admitted:
            log.debug("%s: ignored message from unknown sender %s (%s)", self.name, msg.sender_id, msg.sender_name)
            if reply:
                try:
                    await self.send(OutboundMessage(self.name, msg.chat_id, reply))
                except SendFailed as exc:
                    log.warning("%s: could not send the pairing reply to %s: %s", self.name, msg.chat_id, exc)
            return None
        return msg if msg.is_private else after_heard(msg, await self.ctx.store.take_heard(
            msg.session_key, self.config.group_history))


def safe_filename(filename: str) -> str:
    """A file name someone else chose, safe to write: no folders, only word characters, ``.``, ``-``."""
    return re.sub(r"[^\w.-]", "_", Path(filename).name)[:100] or "file"
