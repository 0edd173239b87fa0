"""Text that can always be written: as UTF-8 (history files, JSON requests), and to a terminal
(shown, never obeyed)."""

from __future__ import annotations

import json
from typing import Any


# What a terminal acts on rather than shows: the C0 controls but tab and newline (ESC begins
# sequences that set the clipboard, retitle the window or redraw the screen; CR overwrites a
# line), DEL, and the C1 controls (0x9b is CSI to some terminals).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0))}
# What reorders the text around it (bidi embeddings, overrides, isolates and marks): a stranger's
# name holding U+202E shows the rest of the line, the command to type included, backwards.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS |= {ord(c): f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}
_NO_BIDI = dict.fromkeys(map(ord, BIDI_CONTROLS))


def for_terminal(text: str) -> str:
    """Text as a terminal shows it, each control character written out as ``\\xNN``: for what
    others wrote (a reply a web page may have steered, a stranger's name, a member's job)
    printed in the owner's terminal."""
    return text.translate(_CONTROLS)


# JSON escapes the C0 controls itself; DEL, C1 and the bidi controls pass as they are unless
# written as escapes.
_JSON_CONTROLS = {c: f"\\u{c:04x}" for c in (0x7f, *range(0x80, 0xa0), *map(ord, BIDI_CONTROLS))}


def without_bidi_controls(text: str) -> str:
    """``text`` shown in the order it was written (natural right-to-left script is unchanged)."""
    return text.translate(_NO_BIDI)


def json_for_terminal(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON (one line unless ``indent``), readable as UTF-8 (not ``\\u`` escapes)
    and, like ``for_terminal``, never obeyed by the terminal it is printed on."""
    return json.dumps(value, ensure_ascii=False, indent=indent).translate(_JSON_CONTROLS)


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
