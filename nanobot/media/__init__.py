"""Media: voice notes, photos and documents in; files out.

Channels only download (into the chat's ``inbox/``); what a file *is* and how the model gets
it is decided here, once for every channel: voice becomes text (``transcribe``), photos
become image parts (``images``), documents become text (``documents``), and ``intake``
puts a message's attachments together for a turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Kind = Literal["image", "audio", "document", "other"]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp"}
# (.aac: Signal's voice notes)
AUDIO_SUFFIXES = {".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".wav", ".flac", ".webm", ".mpga", ".mpeg"}
VOICE_VIDEO_PREFIX = "video_note"  # Telegram's round video notes: transcribed like voice
DOCUMENT_SUFFIXES = {".pdf", ".docx", ".txt", ".md", ".markdown", ".csv", ".json", ".log", ".tsv", ".xml",
                     ".yaml", ".yml", ".html", ".htm", ".py", ".rst", ".ini", ".toml"}


def kind_of(path: str | Path) -> Kind:
    """What an attachment is, by its name (channels name downloads after the platform's kind)."""
    name = Path(path).name.lower()
    suffix = Path(name).suffix
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in AUDIO_SUFFIXES or VOICE_VIDEO_PREFIX in name:
        return "audio"
    if suffix in DOCUMENT_SUFFIXES:
        return "document"
    return "other"


MB = 1024 * 1024
# What a bot may upload per file: Telegram's Bot API takes documents up to 50 MB (photos, up to
# 10 MB, are the adapter's business); Discord takes 10 MB on an unboosted server.
UPLOAD_LIMITS = {"telegram": 50 * MB, "discord": 10 * MB}
DEFAULT_UPLOAD_LIMIT = 10 * MB


def upload_limit(channel: str) -> int:
    return UPLOAD_LIMITS.get(channel, DEFAULT_UPLOAD_LIMIT)
