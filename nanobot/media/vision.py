"""Which models turned out not to take images (``agents.defaults.vision: "auto"``).

Learned from the model server's rejection of a request with image parts, and kept in
``$NANOBOT_HOME/vision-off.json`` so a restart does not ask the same server again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from nanobot.config import write_private
from nanobot.providers.base import ProviderError

log = logging.getLogger(__name__)

FILE_NAME = "vision-off.json"


def _load(home: Path) -> set[str]:
    try:
        return set(json.loads((home / FILE_NAME).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return set()


def is_blind(home: Path, provider: str, model: str) -> bool:
    return f"{provider}/{model}" in _load(home)


def remember_blind(home: Path, provider: str, model: str) -> None:
    blind = _load(home) | {f"{provider}/{model}"}
    try:
        write_private(home / FILE_NAME, json.dumps(sorted(blind)))
    except OSError as exc:  # a read-only home: it is asked again after a restart, no more
        log.warning("could not record that %s/%s takes no images: %s", provider, model, exc)


# What servers say of a model that takes no pictures: OpenAI's "image_url is only supported by
# certain models", vLLM's "not a multimodal model", llama.cpp's "image input is not supported
# (mmproj)", LM Studio's "does not support images", DeepSeek's "unknown variant `image_url`",
# Groq's "content must be a string".
_NO_PICTURES = ("image", "multimodal", "vision", "mmproj", "unknown variant", "must be a string")
# What a request with pictures may also be refused for, about this request only: its length, a
# picture's size, a safety policy. Remembered as blindness, one member's photo (or long message)
# would take pictures from every chat of the model, for good.
_THIS_REQUEST = ("context", "token", "too large", "too long", "size", "policy", "safety", "moderation", "filter")


def rejects_images(exc: ProviderError) -> bool:
    """Whether a failed request with images says the model takes none (not that this request was
    too long, a picture too big, or refused by a policy)."""
    text = str(exc).lower()
    return exc.status is not None and (exc.status in (400, 415, 422) or exc.status >= 500) \
        and any(word in text for word in _NO_PICTURES) and not any(word in text for word in _THIS_REQUEST)
