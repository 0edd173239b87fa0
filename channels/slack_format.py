"""Markdown as models write it -> Slack's mrkdwn.

mrkdwn is not Markdown: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>`` links, no
headings, and ``&``, ``<``, ``>`` escaped (they open links and mentions). Code is cut out
first, so nothing inside it is formatted; Slack shows ``` blocks and `code` as they are.
(``slackify-markdown`` was tried for this and not taken: it lets ``<!channel>`` and ``<@U…>``
through as they are, so a reply could ping a whole channel, and makes ``2*3*4`` ``2_3_4``.)
"""

from __future__ import annotations

import re

from nanobot_channels.text import (BOLD, BULLET, FENCE, HEADING, INLINE_CODE, ITALIC, LINK, SLOT, STRIKE,
                                   misleading, split_message)

MAX_TEXT = 3900  # Slack truncates a message's text past 40,000 characters; it advises under 4,000


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_to_mrkdwn(text: str) -> str:
    slots: list[str] = []

    def stash(fragment: str) -> str:
        slots.append(fragment)
        return f"\x00{len(slots) - 1}\x00"

    def fence(m: re.Match[str]) -> str:
        return stash("```\n" + escape(m.group(2).rstrip("\n")) + "\n```")

    text = text.replace("\x00", "")
    text = FENCE.sub(fence, text)
    text = INLINE_CODE.sub(lambda m: stash(f"`{escape(m.group(1))}`"), text)
    text = escape(text)
    text = LINK.sub(lambda m: stash(f"<{m.group(2).replace('|', '%7C')}|{m.group(1)}"
                                    f"{f' ({m.group(2)})' if misleading(m.group(1), m.group(2)) else ''}>"), text)
    text = HEADING.sub(lambda m: stash(f"*{m.group(1)}*"), text)
    text = BULLET.sub(r"\1• ", text)  # before italics: a "* item" bullet is not emphasis
    text = ITALIC.sub(lambda m: stash(f"_{m.group(1) or m.group(2)}_"), text)  # before bold makes *x*
    text = BOLD.sub(lambda m: stash(f"*{m.group(1) or m.group(2)}*"), text)
    text = STRIKE.sub(r"~\1~", text)
    while SLOT.search(text):
        text = SLOT.sub(lambda m: slots[int(m.group(1))], text)
    return text


def mrkdwn_chunks(text: str, limit: int = MAX_TEXT) -> list[str]:
    """Split on the Markdown (code blocks closed and reopened), then convert each piece;
    escaping makes a piece longer, so the split leaves room for it."""
    return [markdown_to_mrkdwn(piece) for piece in split_message(text, limit * 4 // 5)]
