"""Spoken replies: a reply's words as a voice note, with any OpenAI-compatible speech endpoint.

``tools.speech.provider`` names a ``providers`` entry (OpenAI, a local speech server), so its
key, ``apiBase`` and HTTP client are reused: the call is the ``openai`` SDK's
``audio.speech.create`` with ``response_format="opus"`` (OGG/Opus, what Telegram's voice notes
are). What is spoken is the reply as one would read it aloud: no Markdown markers, and a code
block is "The code is in the message." (see ``spoken_text``). When a reply is spoken is
``tools.speech.reply``, or the chat's ``/voice`` choice (``speaks``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from nanobot.config import Config, ConfigError
from nanobot.media import kind_of
from nanobot.providers.base import ProviderError

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

SPOKEN_NAME = "reply.ogg"  # the voice note's file name: Telegram sends it with sendVoice
CODE_SAID = "The code is in the message."
CHOICES = ("whenVoice", "always", "never")

_BLOCK_END = {"paragraph_close", "heading_close", "list_item_close", "blockquote_close", "tr_close"}


class SpeechError(Exception):
    """One short line for the log: why a reply was not spoken."""


@runtime_checkable
class Speaker(Protocol):
    async def speak(self, provider: str, text: str, model: str, voice: str, timeout: float) -> bytes: ...


def speech_enabled(config: Config) -> bool:
    return bool(config.tools.speech.provider)


def speaks(config: Config, chosen: str | None, media: list[str]) -> bool:
    """Whether the reply to a message with these files is spoken (speech being on): the chat's
    ``/voice`` choice, else ``tools.speech.reply``; ``whenVoice`` speaks when audio came in."""
    setting = chosen if chosen in CHOICES else config.tools.speech.reply
    return setting == "always" or setting == "whenVoice" and any(kind_of(rel) == "audio" for rel in media)


def spoken_text(markdown: str) -> str:
    """The reply's words as they are read aloud: the text of its Markdown without the markers,
    a code block said as ``CODE_SAID`` (once for a run of them), each block on a line."""
    lines: list[str] = []
    line = ""
    for token in _parser().parse(markdown):
        if token.type in ("fence", "code_block"):
            line = _said(lines, line)
            if not lines or lines[-1] != CODE_SAID:
                lines.append(CODE_SAID)
        elif token.type in ("th_open", "td_open") and line.strip():  # a row's cells, said apart
            line += ", "
        elif token.type == "inline":
            line += "".join(_words(child) for child in token.children or ())
        elif token.type in _BLOCK_END or token.type == "hr":
            line = _said(lines, line)
    _said(lines, line)
    return "\n".join(lines)


@cache
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt  # here: 14 ms at import, paid only by a gateway that speaks

    return MarkdownIt("commonmark").enable("strikethrough").enable("table")


def _words(token: Token) -> str:
    """An inline token's words: text, inline code and a picture's description; breaks as spaces."""
    if token.type in ("text", "code_inline", "image"):
        return token.content
    return " " if token.type in ("softbreak", "hardbreak") else ""


def _said(lines: list[str], line: str) -> str:
    text = re.sub(r"\s+", " ", line).strip()
    if text:
        lines.append(text)
    return ""


async def synthesize(config: Config, models: object, text: str) -> bytes:
    """The spoken ``text`` as OGG/Opus bytes; SpeechError with a short reason on any failure."""
    settings = config.tools.speech
    if not isinstance(models, Speaker):  # the offline demo's recorded model
        raise SpeechError("this model provider cannot speak")
    try:
        audio = await models.speak(settings.provider, text, settings.model, settings.voice, settings.timeout)
    except (ProviderError, ConfigError) as exc:
        raise SpeechError(str(exc).replace("model server", "speech server")) from exc
    if not audio:
        raise SpeechError("the speech server sent no audio")
    return audio
