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

from nanobot_channels.text import split_message, utf16_len

_FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```[ \t]*$|\Z)", re.S | re.M)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+|tg://[^)\s]+|mailto:[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?!\s)(.+?)(?<!\s)\*\*|(?<!\w)__(?!\s)(.+?)(?<!\s)__(?!\w)")
# Single * or _ only at word edges, so snake_case names and 2*3*4 stay as they are.
_ITALIC = re.compile(r"(?<![\w*])\*(?![\s*])([^*\n]+?)(?<![\s*])\*(?![\w*])"
                     r"|(?<![\w_])_(?![\s_])([^_\n]+?)(?<![\s_])_(?![\w_])")
_STRIKE = re.compile(r"~~(?!\s)(.+?)(?<!\s)~~")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
_QUOTE = re.compile(r"(?:^&gt; ?.*(?:\n|$))+", re.M)
_SLOT = re.compile(r"\x00(\d+)\x00")


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

    text = text.replace("\x00", "")  # NUL delimits our placeholders
    text = _FENCE.sub(fence, text)
    text = _INLINE_CODE.sub(lambda m: stash(f"<code>{html.escape(m.group(1), quote=False)}</code>"), text)
    text = html.escape(text, quote=False)
    text = _LINK.sub(lambda m: stash(f'<a href="{m.group(2).replace(chr(34), "%22")}">') + m.group(1)
                     + stash("</a>"), text)
    text = _HEADING.sub(r"<b>\1</b>", text)
    text = _BULLET.sub(r"\1• ", text)  # before italics: a "* item" bullet is not emphasis
    text = _BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
    text = _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)
    text = _STRIKE.sub(r"<s>\1</s>", text)
    text = _QUOTE.sub(_blockquote, text)
    while _SLOT.search(text):  # a link's text may itself hold stashed inline code
        text = _SLOT.sub(lambda m: slots[int(m.group(1))], text)
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
