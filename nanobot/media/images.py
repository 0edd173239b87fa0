"""Photos as image parts for vision models, and how far back in a chat they are sent.

A phone photo is 3-12 MB; a model needs far less. Each image is resized (Pillow) to at most
``MAX_EDGE`` pixels on its longer side and re-encoded as JPEG until it is under
``MAX_BYTES``. The history keeps only the image's path (``"images": [...]`` on the user
message); the bytes are read again for each request, and only the last ``RECENT_IMAGES``
images of the prompt are sent as pictures, older ones as a one-line note, so a long chat with
photos does not grow its prompt without bound. Encodings are cached by path and mtime.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

from nanobot import beneath
from nanobot.media.isolation import parse_file

log = logging.getLogger(__name__)

MAX_EDGE = 1568  # pixels on the longer side: what the major vision models use at full detail
MAX_BYTES = 1_500_000  # per image, after encoding
MAX_PIXELS = 64_000_000  # checked from the header, before decoding (a PNG can claim billions)
RECENT_IMAGES = 5  # images of the prompt sent as pictures; older ones as a note
_CACHE_SIZE = 16

_cache: OrderedDict[tuple[str, int, int], str] = OrderedDict()


async def encode_image(root: Path, relative: str) -> str:
    """A ``data:`` URL of the resized image ``relative`` under ``root``, made in the parsing
    process (``isolation``); ValueError if it is not an image that can be read within the limits."""
    st = await asyncio.to_thread(_stat, root, relative)
    key = (str(root / relative), st.st_mtime_ns, st.st_size)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    url = "data:image/jpeg;base64," + (await parse_file("image", root, relative))["jpeg"]
    _cache[key] = url
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return url


def _stat(root: Path, relative: str) -> os.stat_result:
    with beneath.opened(root, relative) as fd:
        return os.fstat(fd)


def resized_jpeg(path: Path | BinaryIO, name: str | None = None) -> bytes:
    """The image at most MAX_EDGE on its longer side, as a JPEG under MAX_BYTES. Decodes
    untrusted bytes: the daemon runs it only in the parsing process (``isolation``)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = None  # Pillow's own check (a warning up to 179 MP): ours below says why, once
    name = name or Path(path).name  # type: ignore[arg-type]
    try:
        with Image.open(path) as img:  # reads the header only
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise ValueError(f"{name} is {width}x{height} pixels; I read images up to "
                                 f"{MAX_PIXELS // 1_000_000} megapixels")
            img.draft("RGB", (MAX_EDGE, MAX_EDGE))  # a JPEG decodes at 1/2, 1/4 or 1/8 scale: less memory
            img = ImageOps.exif_transpose(img)  # phones store the rotation separately
            img.thumbnail((MAX_EDGE, MAX_EDGE))
            if img.mode != "RGB":
                img = _flatten(img)
            for quality in (85, 70, 55, 40):
                out = io.BytesIO()
                img.save(out, "JPEG", quality=quality, optimize=True)
                if out.tell() <= MAX_BYTES:
                    break
            return out.getvalue()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{name} is not an image I can read ({exc})") from None


def _flatten(img: Any) -> Any:
    """RGBA, palette or greyscale to RGB on white (JPEG has no transparency)."""
    from PIL import Image

    img = img.convert("RGBA")
    background = Image.new("RGB", img.size, (255, 255, 255))
    background.paste(img, mask=img.getchannel("A"))
    return background


async def with_images(messages: list[dict[str, Any]], root: Path, keep: int = RECENT_IMAGES) -> list[dict[str, Any]]:
    """The prompt as sent: the last ``keep`` images as image parts, older (or unreadable)
    ones as a note with their path. Messages without images are passed through as they are."""
    if not any(m.get("images") for m in messages):
        return messages
    recent = {id(m): set(range(len(m["images"]))) for m in messages if m.get("images")}
    budget = keep
    for m in reversed(messages):  # the newest images win the budget
        for i in reversed(range(len(m.get("images") or []))):
            if budget > 0:
                budget -= 1
            else:
                recent[id(m)].discard(i)
    return [await _expand(m, root, recent[id(m)]) if m.get("images") else m for m in messages]


async def _expand(message: dict[str, Any], root: Path, shown: set[int]) -> dict[str, Any]:
    text = message.get("content") or ""
    parts: list[dict[str, Any]] = []
    notes = []
    for i, rel in enumerate(message["images"]):
        url = await _url(root, rel) if i in shown else None
        if url is None:
            notes.append(f"[image: {rel}]")
        else:
            parts.append({"type": "image_url", "image_url": {"url": url}})
    body = "\n".join(filter(None, [text, *notes]))
    plain = {k: v for k, v in message.items() if k != "images"}
    if not parts:
        return {**plain, "content": body}
    return {**plain, "content": [{"type": "text", "text": body or "(a photo)"}, *parts]}


async def _url(root: Path, rel: str) -> str | None:
    try:
        return await encode_image(root, rel)
    except (OSError, ValueError) as exc:  # deleted since, or not an image after all
        log.info("image %s not sent: %s", rel, exc)
        return None


def sent_images(messages: list[dict[str, Any]]) -> bool:
    """Whether a prompt carries image parts (a rejection of it may be about them)."""
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
               for m in messages)


def image_count(messages: list[dict[str, Any]]) -> int:
    return sum(len(m.get("images") or []) for m in messages)
