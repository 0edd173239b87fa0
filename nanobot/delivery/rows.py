"""How a message is kept in a delivery table's row, and read back (rows of older versions too)."""

from __future__ import annotations

import json
from typing import Any

from nanobot.bus import InboundMessage, OutboundMessage, OutgoingFile

# What a recorded message keeps: not its intake id (the row's), whether it resumes (decided at
# start), a waiting caller (a future) or when it arrived (this process's clock).
_STORED_INBOUND = ("channel", "chat_id", "sender_id", "content", "sender_name", "media", "is_private",
                   "source", "delivery_key", "durations", "untrusted", "reply_context", "mode", "sender_handle", "album")
# Rows written before these were typed fields kept them in a "metadata" object (read, then dropped).
_ONCE_METADATA = ("delivery_key", "durations", "untrusted", "reply_context", "mode")


def inbound_json(msg: InboundMessage) -> str:
    return json.dumps({name: getattr(msg, name) for name in _STORED_INBOUND})


def inbound_from(row_id: int, text: str) -> InboundMessage:
    data = json.loads(text)
    metadata = data.pop("metadata", None) or {}
    for name in _ONCE_METADATA:
        if name in metadata:
            data.setdefault(name, metadata[name])
    if str(data.get("sender_id", "")).startswith("cron:"):  # a cron job's, recorded before ``source``
        data.setdefault("source", "cron")
    return InboundMessage(**data, intake_id=row_id)


def outbound_metadata_json(msg: OutboundMessage) -> str:
    """The metadata column: what a reply carries besides its columns (a voice note, a mail's
    thread, what it offers to pick)."""
    kept: dict[str, Any] = {}
    if msg.file and msg.file.voice:
        kept["voice_note"] = True
    if msg.reply_context:
        kept["reply_context"] = msg.reply_context
    if msg.offer:
        kept["offer"] = list(msg.offer)
    if msg.failed:  # read by a caller waiting on another worker (``settled_reply``)
        kept["failed"] = True
    return json.dumps(kept)


def said_failed(metadata: str | None) -> bool:
    """Whether a recorded reply says its turn failed (its metadata column)."""
    return bool(metadata) and bool(json.loads(metadata).get("failed"))


def outbound_from(row: Any) -> OutboundMessage:
    """A recorded message, to send again. Not its stream: the streamed message of before the
    restart is not ours to edit."""
    extras = json.loads(row["metadata"])  # anything else in it is from rows of before: not read
    voice = bool(extras.get("voice_note", False))
    file = OutgoingFile(row["file_name"], row["file_data"], bool(row["photo"]), voice) if row["file_name"] else None
    return OutboundMessage(row["channel"], row["chat_id"], row["content"], kind=row["kind"],
                           reply_to=row["reply_to"], file=file, reply_context=extras.get("reply_context"),
                           offer=tuple(extras.get("offer", ())), outbox_id=row["id"], outbox_created=row["created"],
                           parts_sent=row["parts_sent"])
