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


def rejects_images(exc: ProviderError) -> bool:
    """Whether a failed request with images looks refused for them (not for its size, key...)."""
    if exc.status in (400, 415, 422):
        return True
    text = str(exc).lower()
    return exc.status is not None and exc.status >= 500 and ("image" in text or "multimodal" in text)
