"""Matrix events as the adapter reads and writes them: what a message says (its words, a poll
as words, a reply without the quote older clients put first) and the content the bot sends (its
Markdown rendered to Matrix HTML, mentioning nobody; an edit that replaces a streamed message;
the transaction id that makes a repeat of a recorded reply's part show once).
Every field is whatever the sender wrote: one of another type is read as empty, never an error."""

from __future__ import annotations

import itertools
import mimetypes
from pathlib import PurePosixPath
from typing import Any

from nanobot.bus import OutboundMessage
from nanobot.message_context import shared_poll
from nanobot_channels.markdown_html import to_html
from nanobot_channels.text import tables_as_lists

POLL_STARTS = ("m.poll.start", "org.matrix.msc3381.poll.start")  # the spec's name, and Element's


def transaction_id(msg: OutboundMessage, part: int) -> str | None:
    """The same transaction id for every attempt at one part of one recorded reply: the
    homeserver keeps the first and answers a repeat with its event, so a retry after an answer
    that was lost, or after a crash between sending and marking it sent, shows once. The time
    it was recorded keeps ids apart should the outbox's numbering start again (a new database)."""
    if msg.outbox_id is None or msg.outbox_created is None:
        return None  # not recorded (a notice): nio makes one up
    return f"nanobot.{msg.outbox_id}.{int(msg.outbox_created * 1000)}.{part}"


def text_message(markdown: str, answers: str | None = None) -> dict[str, Any]:
    """A message: the Markdown as its plain body, rendered (no raw HTML passed through) as its HTML;
    a reply to the event ``answers`` names. It mentions nobody (``m.mentions``): without that,
    push rules read the body, and a reply a web page steered could ping the whole room
    (``@room``) or anyone by their display name."""
    markdown = tables_as_lists(markdown)  # Element X shows a table's cells run together, or none
    content = {"msgtype": "m.text", "body": markdown, "format": "org.matrix.custom.html",
               "formatted_body": to_html(markdown), "m.mentions": {}}
    return {**content, "m.relates_to": {"m.in_reply_to": {"event_id": answers}}} if answers else content


def edit_message(event_id: str, markdown: str) -> dict[str, Any]:
    """``event_id`` replaced with new text (clients that know edits show only the new text; the
    others, the fallback: the new text marked with "*", not a list of one)."""
    new = text_message(markdown)
    return {**new, "body": "* " + markdown, "formatted_body": "* " + new["formatted_body"], "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}


def without_reply_fallback(body: str) -> str:
    """A reply's words without the quote older clients put first ("> <@ada:x.org> what she said",
    then a blank line): the message it answers is read whole instead."""
    lines = body.split("\n")
    kept = list(itertools.dropwhile(lambda line: line.startswith(">"), lines))
    return "\n".join(kept).strip() if len(kept) < len(lines) else body


def words(content: dict[str, Any]) -> str:
    """What a message says: its body, or the poll it starts as words."""
    if isinstance(content.get("body"), str):
        return content["body"]
    poll = next((mapping(content[key]) for key in POLL_STARTS if key in content), None)
    if poll is None:
        return ""
    return shared_poll(_said(poll.get("question")), [_said(answer) for answer in _list(poll.get("answers"))])


def _said(item: Any) -> str:
    """An extensible event's text: Element's ``org.matrix.msc1767.text``, or the spec's ``m.text``."""
    item = mapping(item)
    unstable = item.get("org.matrix.msc1767.text")
    texts = [mapping(text).get("body") for text in _list(item.get("m.text"))]
    return next((text for text in (unstable, *texts) if isinstance(text, str)), "")


def relation(content: dict[str, Any]) -> str | None:
    return mapping(content.get("m.relates_to")).get("rel_type")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def file_name(content: dict[str, Any]) -> str:
    """What a file event's file is called: its filename or body, with the extension its mimetype
    gives where it has none (a recording sent as "Recording", audio/ogg: else no kind of file)."""
    name = str(content.get("filename") or content.get("body") or "file")
    mime = str(mapping(content.get("info")).get("mimetype") or "").split(";")[0]
    return name if PurePosixPath(name).suffix else name + (mimetypes.guess_extension(mime) or "")


def mapping(value: Any) -> dict[str, Any]:
    """A field of an event's content that should be a mapping: the content is whatever its sender
    wrote, and a field of another type must not stop the sync (it would be read again, for good)."""
    return value if isinstance(value, dict) else {}
