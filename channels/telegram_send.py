"""Telegram's outgoing side: a reply as HTML (the same text plain when Telegram refuses the
HTML), in chunks Telegram takes; a reply streamed as a draft in a private chat, elsewhere into
one message that is edited as it grows, then finished formatted; files as photos, voice notes
or documents; the typing indicator. A 429 is waited out (Telegram says how long); every other
failure is a ``SendFailed`` that says whether to try again, for the outbox.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter, TelegramError

from nanobot.bus import OutboundMessage, OutgoingFile
from nanobot.chat_commands import shown
from nanobot.channel_plugin import SendFailed, send_parts
from nanobot_channels.telegram_html import preview_text, render_chunks
from nanobot_channels.telegram_where import replying, where
from nanobot_channels.text import split_message, utf16_len

log = logging.getLogger(__name__)

MAX_MESSAGE_LEN = 4096  # characters (UTF-16 units) of a message's text
CAPTION_LIMIT = 1024  # characters of a photo's or document's caption
PHOTO_LIMIT = 10 * 1024 * 1024  # a bigger picture goes as a document
DRAFT_IDS = 2**31 - 1  # a draft's id is a non-zero 32-bit number; one per streamed reply


class TelegramSender:
    """Sends for the Telegram adapter through its ``bot``; keeps the messages replies stream into."""

    def __init__(self, bot: Bot, *, send_retries: int, max_retry_after: float) -> None:
        self._bot = bot
        self.send_retries = send_retries  # 429s waited out per API call before the send counts as failed
        self.max_retry_after = max_retry_after  # honour Telegram's 429 wait, but never longer than this
        self._previews: dict[Any, _Preview] = {}  # stream_id -> the message a reply streams into
        self.drafts = True  # private chats see a streamed reply as a draft, until the server has none

    async def send(self, msg: OutboundMessage) -> None:
        if not msg.content.strip():
            return  # Telegram rejects empty text
        first, *rest = self._text_parts(msg.chat_id, msg.content)
        preview = self._previews.pop(msg.stream_id, None)  # the streamed message takes the first chunk
        parts = [partial(first, reply=replying(msg), preview=preview), *rest]
        parts[-1] = partial(parts[-1], markup=_buttons(msg))
        await send_parts(msg, parts)

    def _text_parts(self, chat_id: str, text: str) -> list[partial[Any]]:
        return [partial(self._send_chunk, chat_id, markdown, html) for markdown, html in
                render_chunks(text, MAX_MESSAGE_LEN)]

    async def send_file(self, msg: OutboundMessage) -> None:
        """A photo (sendPhoto), a voice note (sendVoice: a spoken reply) or a document
        (sendDocument); a picture or voice note Telegram refuses as such (a photo over 10 MB,
        odd dimensions; a voice note that is not OGG/Opus) goes as a document. A caption over
        Telegram's 1,024 characters follows as a message of its own."""
        if msg.file is None:
            return
        if utf16_len(msg.content) <= CAPTION_LIMIT:
            return await self._send_file(msg.chat_id, msg.file, msg.content or None)
        await send_parts(msg, [partial(self._send_file, msg.chat_id, msg.file, None),
                               *self._text_parts(msg.chat_id, msg.content)])

    async def _send_file(self, chat_id: str, file: OutgoingFile, caption: str | None) -> None:
        shown_as = "photo" if file.photo and len(file.data) <= PHOTO_LIMIT else "voice" if file.voice else None
        if shown_as is not None:
            send = self._bot.send_photo if shown_as == "photo" else self._bot.send_voice
            try:
                return await self._call(send, **where(chat_id), filename=file.name, caption=caption,
                                        **{shown_as: file.data})
            except BadRequest as exc:
                log.info("telegram: %s refused as a %s (%s); sending it as a document", file.name, shown_as, exc)
        try:
            await self._call(self._bot.send_document, **where(chat_id), document=file.data, filename=file.name,
                             caption=caption)
        except BadRequest as exc:
            raise SendFailed(f"telegram: {file.name} was refused: {exc}", retry=False) from exc

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far, as plain text: in a private chat a draft Telegram shows growing
        (the answer then comes as one message, whole, and notifies with its whole text); in a
        group, or where the Bot API server has no drafts, one message sent, then edited."""
        stream_id = msg.stream_id
        text = preview_text(msg.content, MAX_MESSAGE_LEN)
        if self.drafts and msg.chat_id.partition(":")[0].isdigit() and await self._draft(msg, text):
            return
        preview = self._previews.get(stream_id)
        try:
            if preview is None:
                sent = await self._bot.send_message(**where(msg.chat_id), text=text, reply_parameters=replying(msg))
                self._previews[stream_id] = _Preview(str(sent.chat_id), sent.message_id, text)
            elif text != preview.text:
                await self._bot.edit_message_text(text=text, chat_id=preview.chat_id, message_id=preview.message_id)
                preview.text = text
        except Exception as exc:  # a missed preview is not worth a retry: the final text follows
            log.debug("telegram: streaming to %s failed: %s", msg.chat_id, exc)

    async def _draft(self, msg: OutboundMessage, text: str) -> bool:
        """``text`` as the stream's draft (sendMessageDraft); False where Telegram has none (an
        older Bot API server, which answers 404): then no chat gets drafts again."""
        draft = int(msg.stream_id or 0) % DRAFT_IDS + 1  # the same for every update of one reply
        try:
            await self._bot.send_message_draft(**where(msg.chat_id), draft_id=draft, text=text)
        except (InvalidToken, BadRequest) as exc:
            self.drafts = False
            log.info("telegram: replies stream by editing a message, as sendMessageDraft failed: %s", exc)
            return False
        except TelegramError as exc:  # a missed draft is not worth a retry: the next one, or the answer, follows
            log.debug("telegram: draft to %s failed: %s", msg.chat_id, exc)
        return True

    async def _finish_preview(self, preview: _Preview, markdown: str, html: str) -> bool:
        """Turn the streamed message into the final first chunk; False: send it anew instead."""
        edit = partial(self._bot.edit_message_text, chat_id=preview.chat_id, message_id=preview.message_id)
        try:
            try:
                await edit(text=html, parse_mode=ParseMode.HTML)
            except BadRequest as exc:
                if "not modified" not in str(exc).lower():
                    await edit(text=markdown)  # the HTML was refused: the same text, plain
        except Exception as exc:
            log.warning("telegram: could not finish the streamed message: %s", exc)
            return False
        return True

    async def _send_chunk(self, chat_id: str, markdown: str, html: str, reply: ReplyParameters | None = None,
                          preview: _Preview | None = None, markup: InlineKeyboardMarkup | None = None) -> None:
        if preview is not None and markup is None and await self._finish_preview(preview, markdown, html):
            return
        try:
            await self._call(self._bot.send_message, **where(chat_id), text=html, parse_mode=ParseMode.HTML,
                             reply_parameters=reply, reply_markup=markup)
            return
        except BadRequest as exc:
            if "parse entities" not in str(exc).lower():
                raise SendFailed(f"telegram: message to {chat_id} rejected: {exc}", retry=False) from exc
            log.warning("telegram: HTML rejected (%s); sending plain text", exc)
        parts = split_message(markdown, MAX_MESSAGE_LEN, utf16_len)
        for i, part in enumerate(parts):
            try:
                await self._call(self._bot.send_message, **where(chat_id), text=part, reply_parameters=reply,
                                 reply_markup=markup if i == len(parts) - 1 else None)
            except BadRequest as exc:
                raise SendFailed(f"telegram: message to {chat_id} rejected: {exc}", retry=False) from exc
            reply = None

    async def send_typing(self, chat_id: str) -> None:
        try:
            await self._bot.send_chat_action(**where(chat_id), action=ChatAction.TYPING)
        except Exception as exc:  # a missing typing indicator is not worth a retry
            log.debug("telegram: typing indicator for %s failed: %s", chat_id, exc)

    async def _call(self, method: Any, **kwargs: Any) -> Any:
        """One Bot API call. A 429 is waited out (Telegram says how long); BadRequest is raised
        as it is, for the caller to judge; anything else becomes SendFailed."""
        for attempt in range(1, self.send_retries + 1):
            try:
                return await method(**kwargs)
            except RetryAfter as exc:
                wait = min(seconds_of(exc, "retry_after") or 1.0, self.max_retry_after)
                log.warning("telegram: rate limited, waiting %.1fs (attempt %d)", wait, attempt)
                await asyncio.sleep(wait)
            except BadRequest:
                raise
            except NetworkError as exc:  # includes TimedOut and 5xx; the outbox tries again later
                raise SendFailed(f"telegram: {described(exc)}", retry=True) from exc
            except TelegramError as exc:  # Forbidden (blocked by the user), chat gone, ...
                raise SendFailed(f"telegram: {getattr(method, '__name__', method)} failed: {exc}", retry=False) from exc
        raise SendFailed(f"telegram: still rate limited after {self.send_retries} waits", retry=True)


@dataclass
class _Preview:
    """A streamed reply's message: where it is, and what it shows now."""

    chat_id: str
    message_id: int
    text: str


def _buttons(msg: OutboundMessage) -> InlineKeyboardMarkup | None:
    """Under an answer that offers what to pick (a bare ``/mode``), a button for each, four to a
    row: pressed, it is that command (``TelegramChannel._pressed``). Telegram's limits: 64 bytes
    of callback data, 100 buttons."""
    offer = shown(msg.offer, most=100, label_chars=32, sends_bytes=64)
    buttons = [InlineKeyboardButton(word, callback_data=sends) for word, sends in offer]
    return InlineKeyboardMarkup([buttons[i:i + 4] for i in range(0, len(buttons), 4)]) if buttons else None


def described(exc: BaseException) -> str:
    """An error in one line: its type, and its words when it has any."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def seconds_of(item: Any, attribute: str) -> float | None:
    """A duration as PTB gives it: int seconds today, a timedelta in later versions (PTB 22
    warns of the change on every read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = getattr(item, attribute, None)
    return None if value is None else value.total_seconds() if hasattr(value, "total_seconds") else float(value)
