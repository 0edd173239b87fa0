"""Files sent inside a chat completion's message, as OpenAI's clients send them (Open WebUI, the
``openai`` SDK): a picture as a ``data:`` URL in an ``image_url`` part, a document as
``file_data`` in a ``file`` part, a recording in an ``input_audio`` part. Each is decoded here and
then kept in the chat's ``inbox/`` like an upload. A picture named by a link is refused, not
fetched: the gateway reaches the internet only through its web tools' guards.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import re
from typing import Any

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*);base64,(.*)", re.DOTALL)


def inline_file(part: Any) -> tuple[str, bytes] | None:
    """(a file name, the bytes) of a file inside ``part``; None for a part without one (text, an
    uploaded file's id); ValueError, saying what to send instead, for one that cannot be read."""
    if not isinstance(part, dict):
        return None
    kind, value = part.get("type"), part.get(part.get("type") or "")
    if kind == "image_url":
        url = value.get("url") if isinstance(value, dict) else value
        return _from_data_url(url, "picture")
    if kind == "file" and isinstance(value, dict) and "file_data" in value:
        return _from_data_url(value["file_data"], str(value.get("filename") or "file"))
    if kind == "input_audio" and isinstance(value, dict):
        return f"recording.{value.get('format') or 'wav'}", _decoded(value.get("data"))
    return None


def _from_data_url(url: Any, name: str) -> tuple[str, bytes]:
    found = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if found is None:
        raise ValueError("a file in a message must be in it, as a data: URL with base64 (a link is not fetched); "
                         "or upload it (POST /v1/nanobot/upload) and name its id in a file part")
    extension = mimetypes.guess_extension(found.group(1) or "") or ""
    return (name if "." in name else name + extension), _decoded(found.group(3))


def _decoded(data: Any) -> bytes:
    try:
        decoded = base64.b64decode(re.sub(r"\s", "", data) if isinstance(data, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a file in a message is not valid base64") from None
    if not decoded:
        raise ValueError("a file in a message is empty")
    return decoded
