"""A message's attachments, made ready for a turn: transcripts, images, document texts.

Runs at the start of a turn (so ``/stop`` cancels a slow transcription and the typing
indicator covers it). Voice notes become the message text, marked ``[voice]``; photos stay
files that the prompt refers to (``images``); documents become text; anything else is named by
its path. When a voice note cannot be heard and nothing else came with it, ``reply`` says why
and the turn ends without a model call.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Awaitable, Callable

from nanobot import beneath
from nanobot.config import Config
from nanobot.media import kind_of
from nanobot.media.documents import PARSED_SUFFIXES, DocumentText, NoText, extract_text
from nanobot.media.duration import recording_seconds
from nanobot.media.isolation import Unreadable, parse_file
from nanobot.media.transcribe import TranscriptionError, check_limits, transcription_enabled
from nanobot.session import Session

log = logging.getLogger(__name__)

PREVIEW_CHARS = 600
Hear = Callable[[str, bytes, float | None], Awaitable[str]]  # a voice note (name, bytes, seconds): its words

VOICE_OFF_HINT = (
    "I got a voice note, but voice transcription is not set up, so I cannot listen to it. "
    "To turn it on, add to config.json: "
    '"tools": {"transcription": {"provider": "openai", "model": "whisper-1"}} '
    "(provider names a providers entry; any OpenAI-compatible speech-to-text server works: OpenAI, Groq "
    "with whisper-large-v3, or a local Whisper server) and restart the gateway. Until then, please type it.")


@dataclass
class Document:
    path: str  # root-relative path of the file as sent
    name: str
    text: str
    text_path: str | None = None  # a .txt beside a PDF or DOCX, for the file tools
    truncated: bool = False

    def preview(self) -> str:
        head = self.text[:PREVIEW_CHARS].strip()
        more = len(self.text) - PREVIEW_CHARS
        return head + (f"\n[… {more:,} more characters]" if more > 0 else "")


@dataclass
class Attachments:
    """What the model is told about a message's files."""

    voice: list[str] = field(default_factory=list)  # transcripts, in order
    images: list[str] = field(default_factory=list)  # root-relative paths
    documents: list[Document] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per file not handed over otherwise
    reply: str | None = None  # an answer without the model (a voice note that could not be heard)

    def text(self, content: str) -> str:
        """The message text: transcripts first, then what the user typed."""
        heard = [f"[voice] {t}" for t in self.voice]
        return "\n".join(filter(None, [*heard, content]))

    def image_notes(self) -> list[str]:
        return [f"[photo: {path}]" for path in self.images]


async def read_attachments(config: Config, hear: Hear, root: Path, media: list[str], content: str,
                           durations: dict[str, float], session: Session, *, owner: bool) -> Attachments:
    """Sort a message's files by kind and turn each into what the model can take in
    (``hear``: a voice note's words, metered; ``owner``: an owner chat, told the transcription
    server's words when it fails)."""
    found = Attachments()
    unheard: list[str] = []
    for rel in media:  # every file is opened through ``beneath``: never a link someone made
        kind = kind_of(rel)
        if kind == "audio":
            await _hear(config, hear, root, rel, durations.get(rel), found, unheard, owner=owner)
        elif kind == "image":
            found.images.append(rel)
        elif kind == "document":
            await _read_document(root, rel, found)
        else:
            found.notes.append(f"[attached file: {rel}]")
    if unheard and not content.strip() and not found.voice and len(unheard) == len(media):
        found.reply = _unheard_reply(unheard, session)
    return found


async def _hear(config: Config, hear: Hear, root: Path, rel: str, seconds: float | None,
                found: Attachments, unheard: list[str], *, owner: bool) -> None:
    if not transcription_enabled(config):
        unheard.append("")
        found.notes.append(f"[voice note {rel}: not transcribed, voice transcription is off]")
        return
    try:
        check_limits(config, await asyncio.to_thread(beneath.size_of, root, rel), None)
        data = await asyncio.to_thread(beneath.read_bytes, root, rel)
        # Its own bytes before what the platform said: that is the sender's app's claim.
        seconds = await asyncio.to_thread(recording_seconds, data) or seconds
        check_limits(config, len(data), seconds)
        found.voice.append(await hear(PurePosixPath(rel).name, data, seconds))
    except (OSError, ValueError) as exc:
        log.warning("voice note %s not read: %s", rel, exc)
        unheard.append("")
        found.notes.append(f"[voice note {rel}: could not be read]")
    except TranscriptionError as exc:
        log.warning("transcription of %s failed: %s", rel, exc)
        said = str(exc) if owner or not exc.server_said else "the transcription server gave no answer"
        unheard.append(said)
        found.notes.append(f"[voice note {rel}: not transcribed, {said}]")


def _unheard_reply(reasons: list[str], session: Session) -> str | None:
    problem = next((r for r in reasons if r), None)
    if problem:
        return f"I could not transcribe your voice note: {problem}. Please try again or type it."
    if session.meta.voice_hint_sent:
        return None  # said once in this chat; from now on the model answers (it sees the note)
    session.set_meta(voice_hint_sent=True)
    return VOICE_OFF_HINT


async def _document_text(root: Path, rel: str) -> DocumentText:
    """PDF and DOCX are parsed in a child process with limits; text is a bounded read here."""
    if PurePosixPath(rel).suffix.lower() not in PARSED_SUFFIXES:
        try:
            return await asyncio.to_thread(_plain_text, root, rel)
        except NoText as exc:
            raise Unreadable(str(exc), no_text=True) from None
    parsed = await parse_file("document", root, rel)
    return DocumentText(parsed["text"], parsed["truncated"], parsed["pages"])


def _plain_text(root: Path, rel: str) -> DocumentText:
    with beneath.opened(root, rel) as fd, os.fdopen(os.dup(fd), "rb") as file:
        return extract_text(file, PurePosixPath(rel).name)


async def _read_document(root: Path, rel: str, found: Attachments) -> None:
    path = PurePosixPath(rel)
    try:
        doc = await _document_text(root, rel)
    except (ValueError, OSError) as exc:  # Unreadable is a ValueError
        no_text = isinstance(exc, Unreadable) and exc.no_text
        found.notes.append(f"[document {rel}: {exc}]" if no_text else f"[document {rel}: could not be read: {exc}]")
        return
    text_path = None
    if path.suffix.lower() in PARSED_SUFFIXES:  # the file tools read text, not PDF
        text_path = path.with_name(path.name + ".txt").as_posix()
        await asyncio.to_thread(beneath.write_bytes, root, text_path, doc.text.encode("utf-8"))
    found.documents.append(Document(rel, path.name, doc.text, text_path, doc.truncated))
