"""Markdown as models write it -> the small HTML subset Telegram accepts (parse_mode=HTML).

Telegram's HTML is stricter and smaller than Markdown: only b, i, s, u, code, pre, a,
blockquote, and every other ``<``, ``>``, ``&`` must be escaped. Code is cut out first so
nothing inside it is formatted, the rest is escaped, then the inline markup is rewritten.
Malformed nesting can still slip through; the adapter falls back to plain text when
Telegram refuses to parse a message.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from nanobot_channels.text import (BOLD, BULLET, FENCE, HEADING, INLINE_CODE, ITALIC, LINK, QUOTE, SLOT, STRIKE,
                                   misleading, split_message, tables_as_code, utf16_len)


def markdown_to_html(text: str) -> str:
    """Convert one Markdown message to Telegram HTML; unknown syntax is kept, escaped."""
    slots: list[str] = []

    def stash(fragment: str) -> str:
        slots.append(fragment)
        return f"\x00{len(slots) - 1}\x00"

    def fence(m: re.Match[str]) -> str:
        lang, body = m.group(1), html.escape(m.group(2).rstrip("\n"), quote=False)
        attr = f' class="language-{html.escape(lang)}"' if lang else ""
        return stash(f"<pre><code{attr}>{body}</code></pre>")

    text = tables_as_code(text.replace("\x00", ""))  # NUL delimits our placeholders
    text = FENCE.sub(fence, text)
    text = INLINE_CODE.sub(lambda m: stash(f"<code>{html.escape(m.group(1), quote=False)}</code>"), text)
    text = html.escape(text, quote=False)
    text = LINK.sub(lambda m: stash(f'<a href="{m.group(2).replace(chr(34), "%22")}">') + m.group(1)
                     + stash(f" ({m.group(2)})" if misleading(m.group(1), m.group(2)) else "") + stash("</a>"), text)
    text = HEADING.sub(r"<b>\1</b>", text)
    text = BULLET.sub(r"\1• ", text)  # before italics: a "* item" bullet is not emphasis
    text = BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
    text = ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)
    text = STRIKE.sub(r"<s>\1</s>", text)
    text = QUOTE.sub(_blockquote, text)
    while SLOT.search(text):  # a link's text may itself hold stashed inline code
        text = SLOT.sub(lambda m: slots[int(m.group(1))], text)
    return text


def _blockquote(m: re.Match[str]) -> str:
    lines = [re.sub(r"^&gt; ?", "", line) for line in m.group(0).rstrip("\n").split("\n")]
    tail = "\n" if m.group(0).endswith("\n") else ""
    return "<blockquote>" + "\n".join(lines) + "</blockquote>" + tail


def render_chunks(text: str, limit: int, length: Callable[[str], int] = utf16_len) -> list[tuple[str, str]]:
    """Split Markdown into (markdown, html) pairs whose HTML fits ``limit``.

    The split happens on the Markdown (so code blocks are closed and reopened properly) and
    is measured again after conversion: escaping and tags make text longer, so a piece that
    grew past the limit is split again, finer, in proportion to how much it grew.
    """
    return _render(text, limit, limit, length)


def _render(text: str, limit: int, budget: int, length: Callable[[str], int]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for piece in split_message(text, budget, length):
        converted = markdown_to_html(piece)
        size = length(converted)
        if size <= limit or budget <= 256:
            out.append((piece, converted))
        else:
            smaller = max(256, int(length(piece) * limit / size * 0.9))
            out.extend(_render(piece, limit, min(smaller, budget - 1), length))
    return out


def preview_text(text: str, limit: int) -> str:
    """A reply streamed so far, as plain text cut to fit one message (the final reply is split properly)."""
    if utf16_len(text) <= limit:
        return text
    while utf16_len(text) > limit - 2:
        text = text[: len(text) - max(1, (utf16_len(text) - limit) // 2 + 1)]
    return text + " …"
