"""Markdown as HTML for clients that show it: a Matrix message's ``formatted_body`` and a
mail's HTML part (markdown-it, CommonMark with tables and strikethrough, a line break kept as
one, no raw HTML passed through).

No images: a Matrix client shows an <img> of mxc://any.server/id at once, and the homeserver
fetches it from that server, so a reply a web page steered could hand what the chat knows to
another server in an image's id, with nobody clicking; a mail client that loads pictures does
the same with any address. An image is shown as its link. A link whose words name another
address shows its target after them (``misleading``).
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from nanobot_channels.text import misleading


def _targets_shown(state: StateCore) -> None:
    """After the words of each link that name another address, its target (inside the link)."""
    for block in state.tokens:
        shown: list[Token] = []
        href: str | None = None
        words: list[str] = []
        for child in block.children or []:
            if child.type == "link_open":
                href, words = str(child.attrGet("href") or ""), []
            elif child.type == "link_close" and href is not None:
                if misleading("".join(words), href):
                    shown.append(Token("text", "", 0, content=f" ({href})"))
                href = None
            elif href is not None:
                words.append(child.content)
            shown.append(child)
        if block.children:
            block.children = shown


# breaks: a line break is one, as in the plain text and other chat apps (/help's lines ran together).
RENDER = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["strikethrough", "table"]).disable("image")
RENDER.core.ruler.push("targets_shown", _targets_shown)


def to_html(markdown: str) -> str:
    return RENDER.render(markdown).strip()
