"""Telegram adapter: python-telegram-bot's Bot, with our own long-polling loop.

We poll ourselves (``telegram_updates.py``: each update read on its own) rather than with the
library's Updater, because the Updater confirms updates (by asking for the next offset) as
soon as they are parsed, before we have stored them: a crash then lost them. Here the offset
moves past a batch only after ``ctx.accept`` has recorded it, so Telegram delivers again
whatever we did not keep, and the update_id (the message's ``delivery_key``) lets the intake
drop the repeats. Polling errors back off from ``poll_interval`` to ``poll_backoff_max``
(2 s): after an outage the first message is read within seconds of recovery.

Among workers one polls at a time (the ``telegram polling`` singleton; the others send, and
one takes over within a second when the poller dies or stops). With
``channels.telegram.webhook`` nobody polls: every worker serves the webhook
(``telegram_webhook.py``).

What goes out is ``telegram_send.py``'s. An album's pictures are one message (each part
carries its ``album``; the gateway joins them). Who may talk is decided by ``BaseChannel._admit``
and what a command means is the agent's business, so every message, ``/new`` included, is
passed on as plain text.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar

from telegram import Bot, BotCommand, CallbackQuery, LinkPreviewOptions, Message, Update
from telegram.error import TelegramError
from telegram.ext import ApplicationBuilder, Defaults

from nanobot.channel_plugin import BaseChannel, ChannelContext, Sender
from nanobot_channels.telegram_updates import ALLOWED_UPDATES, fetch_updates, readable
from nanobot_channels.telegram_http import AiohttpRequest
from nanobot_channels.telegram_send import MAX_MESSAGE_LEN, TelegramSender, described, seconds_of
from nanobot_channels.telegram_where import answered, chat_of, words_of
from nanobot_channels.telegram_webhook import WebhookServer
from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.chat_commands import COMMANDS, picked
from nanobot.config import TelegramConfig
from nanobot.message_context import noting_lost, with_quote
from nanobot.sqlite_file import StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_API_BASE = "https://api.telegram.org"
CONNECTIONS = 8  # to the Bot API for sends (Telegram takes about 30 messages/s from a bot)
POOL_TIMEOUT = 60.0  # seconds a send may wait for a free connection
POLLING = "telegram polling"  # the singleton: one worker long-polls at a time


# A link in a reply is not previewed: Telegram's servers would fetch it at once, so a reply a web
# page steered could hand what the chat knows to an address in a link, with nobody clicking it.
NO_PREVIEW = LinkPreviewOptions(is_disabled=True)


class TelegramChannel(BaseChannel):
    name: ClassVar[str] = "telegram"
    max_message_len: ClassVar[int] = MAX_MESSAGE_LEN

    def __init__(self, config: TelegramConfig, ctx: ChannelContext, *, poll_timeout: float = 30.0,
                 poll_interval: float = 0.25, poll_backoff_max: float = 2.0, send_retries: int = 5,
                 max_retry_after: float = 60.0) -> None:
        super().__init__(config, ctx)
        self.config: TelegramConfig = config
        self.poll_timeout = poll_timeout  # seconds a getUpdates long poll may wait on the server
        self.poll_interval = poll_interval  # the first wait after a failed poll, doubled up to poll_backoff_max
        self.poll_backoff_max = poll_backoff_max
        base, proxy = (config.api_base or DEFAULT_API_BASE).rstrip("/"), config.proxy
        self._app = (ApplicationBuilder().token(config.token).updater(None)
                     .base_url(f"{base}/bot").base_file_url(f"{base}/file/bot")
                     .request(AiohttpRequest(CONNECTIONS, POOL_TIMEOUT, proxy))  # sends
                     .get_updates_request(AiohttpRequest(1, proxy=proxy))  # the long poll
                     .defaults(Defaults(link_preview_options=NO_PREVIEW))
                     .build())
        self._bot: Bot = self._app.bot
        self._webhook = WebhookServer(config.webhook, self._on_webhook, ctx.http_timeout_s) if config.webhook else None
        self._username = ""  # the bot's own @username, known after start()
        self._out = TelegramSender(self._bot, send_retries=send_retries, max_retry_after=max_retry_after)

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._app.initialize()  # getMe: a bad token or unreachable server fails here
            self._username = self._bot.username or ""
            await (self._start_polling() if self._webhook is None else self._start_webhook(self._webhook))
            await self._offer_commands()
        except BaseException:
            await self.stop()
            raise

    async def _offer_commands(self) -> None:
        """The menu Telegram shows when "/" is typed: the chat commands (best effort)."""
        try:
            await self._bot.set_my_commands([BotCommand(name, what[:256]) for name, _, what in COMMANDS])
        except TelegramError as exc:
            log.warning("telegram: the command menu was not set: %s", exc)

    async def _start_polling(self) -> None:
        """Poll if no other worker does; else wait in the background to take over."""
        # getUpdates is refused while a webhook is set: each round deletes it first; the first
        # round here, so that a refused token fails start(). Two pollers would both get 409 Conflict.
        first = None
        if await self.ctx.singletons.try_hold(POLLING) is not None:
            await self._bot.delete_webhook()
            first = self._poll()
            log.info("telegram: polling as @%s", self._username)
        else:
            log.info("telegram: @%s is polled by another worker; this one sends, and takes over if it stops",
                     self._username)
        again = lambda: self._poll(self._bot.delete_webhook)  # noqa: E731  (a later round)
        self.read_while_held(POLLING, again, first)

    async def _start_webhook(self, server: WebhookServer) -> None:
        """Tell Telegram where to post updates (every worker says the same), and serve that path.
        The webhook is not deleted at stop: another worker may still be serving it."""
        webhook = server.config
        await server.start()
        await self._bot.set_webhook(webhook.url, secret_token=webhook.secret_token, allowed_updates=ALLOWED_UPDATES)
        log.info("telegram: webhook for @%s at %s, served on %s", self._username, webhook.url, webhook.listen)

    async def _on_webhook(self, data: dict[str, Any]) -> None:
        update = readable(data, self._bot)  # one this library cannot read is answered 200: not sent again
        if update is not None and (msg := await self._from_update(update)) is not None:
            await self.ctx.accept([msg])

    async def stop_receiving(self) -> None:
        """Stop polling at shutdown: later messages wait on Telegram's server for the next start
        (or another worker's poll: polling is handed over at once)."""
        await super().stop_receiving()
        if self._webhook is not None:
            await self._webhook.stop()

    async def stop(self) -> None:
        await self.stop_receiving()
        for shutdown in (self._app.shutdown, self._bot.shutdown):  # the bot's closes the HTTP pools, started or not
            try:
                await shutdown()
            except Exception:  # stop() must not raise; log and keep tearing down
                log.exception("telegram: error during shutdown")

    # ---- incoming -------------------------------------------------------------------
    async def _poll(self, first: Callable[[], Awaitable[Any]] | None = None) -> None:
        offset: int | None = None  # None: everything Telegram still holds for us (unconfirmed)
        delay = 0.0
        while True:
            try:
                if first is not None:  # once, before the first poll (retried with it)
                    await first()
                    first = None
                updates, confirms = await fetch_updates(self._bot, offset, int(self.poll_timeout) or 1,
                                                        self.poll_timeout + 10)
                if updates:
                    await self.ctx.accept([m for m in [await self._from_update(u) for u in updates] if m])
                offset = confirms or offset  # confirms the batch, now that it is stored
                delay = 0.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Telegram or the network is down, or the store refused
                delay = min(self.poll_backoff_max, delay * 2 if delay else self.poll_interval)
                log.warning("telegram: polling failed (%s), retrying in %.2f s", described(exc), delay)
                await asyncio.sleep(delay)

    async def _from_update(self, update: Update) -> InboundMessage | None:
        """The admitted message an update carries, or None (not for us, a stranger, a bot)."""
        message, user = update.message, update.effective_user
        try:
            if update.callback_query is not None:  # a button under one of our answers pressed
                return await self._pressed(update.callback_query, update.update_id)
            if message is None or user is None or user.is_bot:
                return None
            return await self._intake(message, user.id, user.username, update.update_id)
        except StoreUnavailable:  # the batch waits, unconfirmed, until the database is back
            raise
        except Exception:  # one bad update must not block the ones behind it
            log.exception("telegram: failed to handle update %s", update.update_id)
            return None

    async def _intake(self, message: Message, user_id: int, username: str | None,
                      update_id: int) -> InboundMessage | None:
        is_private = message.chat.type == "private"
        # Telegram vouches for the user id and the @username (unique, theirs while they keep it).
        who = Identity(str(user_id), username)
        text = words_of(message)
        album = message.media_group_id
        mentioned = not is_private and self._addressed_to_me(message, text)
        if album and not is_private:  # its caption (on one picture) speaks for the others, wherever they land
            if mentioned and await self._may_download(who):  # a stranger's: no note
                await self.ctx.store.keep(chat_of(message), f"album {album}")
            elif not mentioned:
                mentioned = await self.ctx.store.kept(chat_of(message), f"album {album}") is not None
        if mentioned:
            text = re.sub(rf"@{re.escape(self._username)}\b", "", text, flags=re.I).strip()
            text = re.sub(r"[ \t]{2,}", " ", text)
        if not self._addressed(is_private, mentioned):  # not for us (no download): kept for the next that is
            return await self._overhear(chat_of(message), who, text)
        # A stranger's files never touch the disk: only admitted senders' attachments are fetched.
        files = _files_of(message)
        allowed = bool(files) and await self._may_download(who)
        sender = Sender(self.name, chat_of(message), who, is_private)
        media, notes, durations = (await self._download_media(files, await self.chat_root(sender))
                                   if allowed else ([], [], {}))
        content = "\n".join(part for part in (text, *notes) if part)  # a stranger's files: noted, never fetched
        content, quoted = with_quote(noting_lost(content, 0 if allowed else len(files), []), *answered(message),
                                     who.id, str(self._bot.id))
        return await self._admit(InboundMessage(
            self.name, chat_of(message), who.id, content, sender_name=username, sender_handle=username, media=media,
            is_private=is_private, delivery_key=str(update_id), durations=durations, album=album,
            reply_context=_reply_context(message),
            # someone else's words, whoever passed them on (a forward, an inline bot's result the
            # sender picked, a message they answer): the turn is marked untrusted
            untrusted="a forwarded message" if message.forward_origin else
            "an inline bot's message" if message.via_bot else quoted), mentioned=mentioned)

    async def _pressed(self, query: CallbackQuery, update_id: int) -> InboundMessage | None:
        """A button a command's answer offered (``/mode code``) pressed: that command, from whoever
        pressed it (Telegram vouches for them), in the chat of the message it is under. Only a
        command that offers picks is taken (``picked``); typed, it would be taken all the same."""
        try:
            await query.answer()  # the button stops spinning
        except TelegramError as exc:
            log.debug("telegram: answering a button press: %s", described(exc))
        command, message = picked(query.data or ""), query.message
        if not isinstance(message, Message) or query.from_user.is_bot or not command:
            return None
        who = Identity(str(query.from_user.id), query.from_user.username)
        return await self._admit(InboundMessage(
            self.name, chat_of(message), who.id, command, sender_name=who.name, sender_handle=who.name,
            is_private=message.chat.type == "private", delivery_key=str(update_id),
            reply_context=_reply_context(message)), mentioned=True)

    def _addressed_to_me(self, message: Message, text: str) -> bool:
        """An @mention of the bot (also /cmd@bot), or a reply to one of the bot's messages."""
        reply = message.reply_to_message
        if reply and reply.from_user and reply.from_user.id == self._bot.id:
            return True
        return bool(self._username) and re.search(rf"@{re.escape(self._username)}\b", text, re.I) is not None

    async def _download_media(self, files: list[tuple[Any, str]],
                              root: Path) -> tuple[list[str], list[str], dict[str, float]]:
        """Fetch a message's files (``_files_of``) into the chat's inbox: (root-relative paths,
        notes for the model, seconds of each recording)."""
        media, notes, durations = [], [], {}
        for item, filename in files:
            path, note = await self._download(item, filename, root)
            if path:
                media.append(path)
                if (seconds := seconds_of(item, "duration")) is not None:
                    durations[path] = seconds
            if note:
                notes.append(note)
        return media, notes, durations

    async def _download(self, item: Any, filename: str, root: Path) -> tuple[str | None, str | None]:
        cap = self.ctx.max_media_bytes
        if item.file_size and item.file_size > cap:
            return None, f"[attachment {filename} refused: {item.file_size} bytes, limit is {cap}]"
        try:
            file = await item.get_file()
            data = bytes(await file.download_as_bytearray())
        except TelegramError as exc:
            log.warning("telegram: download of %s failed: %s", filename, exc)
            return None, f"[attachment {filename} could not be downloaded]"
        if len(data) > cap:  # the size was unknown up front
            return None, f"[attachment {filename} refused: larger than {cap} bytes]"
        kept = await self._keep(root, item.file_unique_id, filename, data)
        return kept, None if kept else f"[attachment {filename} could not be kept]"

    # ---- outgoing: telegram_send.py -------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        await self._out.send(msg)

    async def send_file(self, msg: OutboundMessage) -> None:
        await self._out.send_file(msg)

    async def send_stream(self, msg: OutboundMessage) -> None:
        await self._out.send_stream(msg)

    async def send_typing(self, chat_id: str) -> None:
        await self._out.send_typing(chat_id)


def _reply_context(message: Message) -> dict[str, str] | None:
    """What the answer to ``message`` needs: in a group, the message to answer as a reply."""
    return None if message.chat.type == "private" else {"message_id": str(message.message_id)}


def _files_of(message: Message) -> list[tuple[Any, str]]:
    """A message's files, each with the name it is kept under: the kind in it (``voice.ogg``,
    ``photo.jpg``) is how the agent tells a voice note from a document."""
    document, audio, video = message.document, message.audio, message.video
    named = [(document, document and document.file_name or "document"),
             (message.photo[-1] if message.photo else None, "photo.jpg"),  # the last size is the largest
             (message.voice, "voice.ogg"), (audio, audio and audio.file_name or "audio.mp3"),
             (message.video_note, "video_note.mp4"), (video, video and video.file_name or "video.mp4")]
    return [(item, name) for item, name in named if item]
