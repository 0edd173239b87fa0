"""Text that can always be written as UTF-8 (history files, JSON requests)."""

from __future__ import annotations

from typing import Any


def clean_text(value: Any) -> Any:
    """Text that can be written as UTF-8: an unpaired surrogate (from a broken client, a program,
    bytes decoded with surrogateescape) becomes U+FFFD instead of failing every later write
    and every later request of the chat."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:  # via UTF-16: a split pair is joined again, a lone half replaced
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {k: clean_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_text(v) for v in value]
    return value
