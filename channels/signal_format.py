"""Markdown as models write it -> a Signal message: its words, and ranges that style them.

Signal has no markup: a message is plain text, and signal-cli's ``textStyle`` ranges
(``start:length:STYLE``, counted in UTF-16 code units) make parts of it BOLD, ITALIC,
STRIKETHROUGH or MONOSPACE. So the Markdown is parsed (markdown-it), its words written without
the markers, and each emphasis, heading and piece of code becomes a range. A list item starts
with "•" or its number, a table is code with its columns lined up. A link is its words and
then its address: Signal links the addresses it sees, and has no hidden targets.
"""

from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

from nanobot_channels.text import names_itself, tables_as_lists, utf16_len

PARSER = MarkdownIt("commonmark", {"html": False}).enable("strikethrough")  # tables: tables_as_lists
STYLED = {"strong": "BOLD", "em": "ITALIC", "s": "STRIKETHROUGH", "heading": "BOLD"}
ENDS = {"paragraph_close": "\n\n", "heading_close": "\n\n", "bullet_list_close": "\n", "ordered_list_close": "\n",
        "blockquote_close": "\n", "hr": "———\n\n"}


class _Message:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0  # in UTF-16 code units, as Signal counts
        self.styles: list[str] = []
        self._open: list[int] = []  # where each styled part still open began

    def write(self, text: str, style: str | None = None) -> None:
        start, self.length = self.length, self.length + utf16_len(text)
        self.parts.append(text)
        if style and text:
            self.styles.append(f"{start}:{self.length - start}:{style}")

    def style(self, style: str, edge: str) -> None:
        """A styled part begins (``edge`` "open") or ends here."""
        if edge == "open":
            self._open.append(self.length)
        elif self._open and self.length > (start := self._open.pop()):  # markdown-it nests them well
            self.styles.append(f"{start}:{self.length - start}:{style}")


def signal_message(markdown: str) -> dict[str, Any]:
    """The ``send`` parameters for ``markdown``: ``message``, and ``textStyle`` if any part is styled."""
    out = _Message()
    for token in PARSER.parse(tables_as_lists(markdown)):
        kind, _, edge = token.type.rpartition("_")
        if token.type in ("fence", "code_block"):
            out.write(token.content.rstrip("\n"), "MONOSPACE")
            out.write("\n\n")
        elif token.type == "inline":
            _inline(out, token.children or [])
        elif token.type == "list_item_open":
            indent = "   " * (token.level // 2)  # an item of a list inside an item
            out.write(indent + (f"{token.info}{token.markup} " if token.info else "• "))
        elif token.type == "paragraph_close" and token.hidden:  # a tight list's item
            out.write("\n")
        elif kind in STYLED:
            out.style(STYLED[kind], edge)
        if token.type in ENDS and not (token.type == "paragraph_close" and token.hidden) and not (
                token.type.endswith("list_close") and (token.level or out.parts[-1:] == ["\n\n"])):
            out.write(ENDS[token.type])  # (a list inside an item, or a loose list's last paragraph, ended already)
    text = "".join(out.parts).rstrip("\n")
    return {"message": text, "textStyle": out.styles} if out.styles else {"message": text}


def _inline(out: _Message, children: list[Token]) -> None:
    link: tuple[str, int] | None = None  # the open link's address, and where its words begin
    for child in children:
        kind, _, edge = child.type.rpartition("_")
        if child.type == "text":
            out.write(child.content)
        elif child.type == "code_inline":
            out.write(child.content, "MONOSPACE")
        elif child.type in ("softbreak", "hardbreak"):
            out.write("\n")
        elif child.type == "image":
            out.write(f"{child.content} ({child.attrGet('src')})")
        elif child.type == "link_open":
            link = (str(child.attrGet("href") or ""), len(out.parts))
        elif child.type == "link_close" and link is not None:
            address, words = link[0], "".join(out.parts[link[1]:])
            if not names_itself(words, address):
                out.write(f" ({address})")
            link = None
        elif kind in STYLED:
            out.style(STYLED[kind], edge)
