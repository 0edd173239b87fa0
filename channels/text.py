"""Splitting long replies for platforms with a message size limit, and the Markdown that
models write, as patterns the platform converters (Telegram HTML, Slack mrkdwn) share."""

from __future__ import annotations

import re
from typing import Callable
from urllib.parse import urlsplit

# Code is cut out first (FENCE, INLINE_CODE) and stashed behind NUL-delimited SLOTs, so
# nothing inside it is formatted; the rest are inline markup and line starts. An image
# (``![alt](url)``) becomes a link: the chat platforms show none inline, and the "!" would stay.
FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```[ \t]*$|\Z)", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[([^\]\n]+)\]\((https?://[^)\s]+|tg://[^)\s]+|mailto:[^)\s]+)\)")
BOLD = re.compile(r"\*\*(?!\s)(.+?)(?<!\s)\*\*|(?<!\w)__(?!\s)(.+?)(?<!\s)__(?!\w)")
# Single * or _ only at word edges, so snake_case names and 2*3*4 stay as they are.
ITALIC = re.compile(r"(?<![\w*])\*(?![\s*])([^*\n]+?)(?<![\s*])\*(?![\w*])"
                    r"|(?<![\w_])_(?![\s_])([^_\n]+?)(?<![\s_])_(?![\w_])")
STRIKE = re.compile(r"~~(?!\s)(.+?)(?<!\s)~~")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
QUOTE = re.compile(r"(?:^&gt; ?.*(?:\n|$))+", re.M)
SLOT = re.compile(r"\x00(\d+)\x00")
# Words that name a web address ("bank.example", "https://bank.example/login").
ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://)?(?:[\w-]+\.)+[a-z]{2,}", re.I)


def misleading(words: str, url: str) -> bool:
    """Whether a link's words name an address other than where it goes ("https://bank.example"
    over a link elsewhere): a reply a web page steered could show one and lead to the other, so
    the converters show the target after such words."""
    host = (urlsplit(url).hostname or "").lower().removeprefix("www.")
    return any(host not in named.lower() for named in ADDRESS.findall(words))


def utf16_len(text: str) -> int:
    """Telegram counts message length in UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def split_message(text: str, limit: int, length: Callable[[str], int] = len) -> list[str]:
    """Split into chunks of at most ``limit`` (by ``length``), never inside a ``` code block.

    Prefers paragraph breaks, then line breaks, then spaces. A single code block longer than
    the limit is closed at the cut and reopened in the next chunk, so each chunk renders alone.
    """
    chunks: list[str] = []
    rest = text.strip("\n")
    while rest:
        if length(rest) <= limit:
            chunks.append(rest)
            break
        cut = _cut_point(rest, limit, length)
        head, rest = rest[:cut].rstrip("\n"), rest[cut:].lstrip("\n")
        if head.count("```") % 2:  # we are inside a code block: close it here, reopen after
            fence = head[head.rfind("```"):].split("\n", 1)[0]
            head, rest = head + "\n```", fence + "\n" + rest
        chunks.append(head)
    return chunks or [""]


def _cut_point(text: str, limit: int, length: Callable[[str], int]) -> int:
    budget = limit - 8  # room to close a code fence
    hi = len(text)
    lo = 0
    while lo < hi:  # the longest prefix that fits the budget
        mid = (lo + hi + 1) // 2
        if length(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    window = text[:lo]
    # Prefer to cut outside code blocks, at the latest paragraph or line break that is; inside a
    # code block, at a line break (never inside a line of code), then at a space.
    for sep, inside_block_ok in (("\n\n", False), ("\n", False), ("\n", True), (" ", False), (" ", True)):
        pos = window.rfind(sep)
        while pos > lo // 3:
            if inside_block_ok or window[:pos].count("```") % 2 == 0:
                return pos + len(sep)
            pos = window.rfind(sep, 0, pos)
    return max(lo, 1)
