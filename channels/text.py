"""Splitting long replies for platforms with a message size limit, and the Markdown that
models write, as patterns the platform converters (Telegram HTML, Slack's and WhatsApp's
marks) share."""

from __future__ import annotations

import re
import unicodedata
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


# A table: a row of cells, the row of dashes under it (with a "|": a bare "---" under a line is a
# heading or a rule), and the rows after them.
TABLE = re.compile(r"^[ \t]*\|?[^\n]*\|[^\n]*\n(?=[^\n]*\|)[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$"
                   r"(?:\n[ \t]*\|?[^\n]*\|[^\n]*)*\n?", re.M)


def tables_as_code(text: str) -> str:
    """Each Markdown table outside code as a code block with its columns lined up: the chat
    apps that show code (Telegram, Slack, Discord) show no tables, and their raw pipes and
    dashes line up nowhere."""
    return _each_table(text, _table_as_code)


def tables_as_lists(text: str) -> str:
    """Each Markdown table outside code as a list per row, under the row's first cell, each
    value named by its column: for apps read on phones (Signal, WhatsApp, Matrix's Element X,
    which drops a table's cells), where a table lined up in code is wider than the screen."""
    return _each_table(text, _table_as_list)


def _each_table(text: str, convert: Callable[[re.Match[str]], str]) -> str:
    out, at = [], 0
    for fence in FENCE.finditer(text):
        out += [TABLE.sub(convert, text[at:fence.start()]), fence.group(0)]
        at = fence.end()
    return "".join(out) + TABLE.sub(convert, text[at:])


def _rows(table: str) -> list[list[str]]:
    """A table's rows of cells, the header first (not the row of dashes), each as long as the longest."""
    lines = table.rstrip("\n").split("\n")
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for i, line in enumerate(lines) if i != 1]
    return [row + [""] * (max(map(len, rows)) - len(row)) for row in rows]


def _table_as_list(m: re.Match[str]) -> str:
    header, *body = _rows(m.group(0))
    # "+" items: a list of their own, even right under a list of the model's ("-" or "*").
    if len(header) <= 2:  # a name and its value: one item each
        shown = "\n".join("+ " + _label(row[0], ": ") + row[1] for row in body)
    else:
        shown = "\n\n".join(_row_as_list(header, row) for row in body)
    # Apart from what is around it: a line right after a list would be read as its last item's.
    apart = m.start() > 0 and m.string[m.start() - 2:m.start()] != "\n\n"
    return ("\n" if apart else "") + (shown or " · ".join(header)) + ("\n\n" if m.group(0).endswith("\n") else "")


def _row_as_list(header: list[str], row: list[str]) -> str:
    """A row: its first cell, then an item for each other cell that holds something, named by its column."""
    items = [f"+ {name}: {cell}" if name else f"+ {cell}" for name, cell in zip(header[1:], row[1:]) if cell]
    return _label(row[0], "\n") + "\n".join(items)


def _label(cell: str, then: str) -> str:
    """A row's first cell, bold (marks of its own taken off), and ``then``; nothing if it is empty."""
    cell = re.sub(r"\*\*|__", "", cell)
    return f"**{cell}**{then}" if cell else ""


def _table_as_code(m: re.Match[str]) -> str:
    rows = [[re.sub(r"\*\*|__|`", "", cell) for cell in row] for row in _rows(m.group(0))]
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]
    rows.insert(1, ["-" * width for width in widths])
    shown = ["  ".join(cell + " " * (width - _width(cell)) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    return "```\n" + "\n".join(shown) + "\n```" + ("\n" if m.group(0).endswith("\n") else "")


def _width(text: str) -> int:
    """Columns ``text`` takes in a monospaced font: wide characters (✅, 日本) take two."""
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def names_itself(words: str, url: str) -> bool:
    """Whether a link's words are its address (written out as text, the link is then just them)."""
    return words in (url, url.split("://", 1)[-1], url.removeprefix("mailto:"))


def to_marks(text: str, escape: Callable[[str], str], link: Callable[[str, str], str]) -> str:
    """Markdown as models write it -> the marks Slack and WhatsApp read: ``*bold*``,
    ``_italic_``, ``~strike~``, a heading bold, a bullet "•", a table lined up in code (the
    channels line tables up before splitting too: doing it again finds none). Code is cut out first, so nothing
    inside it is formatted (both show ``` blocks and `code` as they are); ``escape`` is for what
    the platform would read as markup, ``link(words, url)`` writes a link."""
    slots: list[str] = []

    def stash(fragment: str) -> str:
        slots.append(fragment)
        return f"\x00{len(slots) - 1}\x00"

    text = tables_as_code(text.replace("\x00", ""))
    text = FENCE.sub(lambda m: stash("```\n" + escape(m.group(2).rstrip("\n")) + "\n```"), text)
    text = INLINE_CODE.sub(lambda m: stash(f"`{escape(m.group(1))}`"), text)
    text = escape(text)
    text = LINK.sub(lambda m: stash(link(m.group(1), m.group(2))), text)
    text = HEADING.sub(lambda m: stash(f"*{m.group(1)}*"), text)
    text = BULLET.sub(r"\1• ", text)  # before italics: a "* item" bullet is not emphasis
    text = ITALIC.sub(lambda m: stash(f"_{m.group(1) or m.group(2)}_"), text)  # before bold makes *x*
    text = BOLD.sub(lambda m: stash(f"*{m.group(1) or m.group(2)}*"), text)
    text = STRIKE.sub(r"~\1~", text)
    while SLOT.search(text):
        text = SLOT.sub(lambda m: slots[int(m.group(1))], text)
    return text


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
