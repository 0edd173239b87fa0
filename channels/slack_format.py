"""Markdown as models write it -> Slack's mrkdwn.

mrkdwn is not Markdown: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>`` links, no
headings, and ``&``, ``<``, ``>`` escaped (they open links and mentions). Code is cut out
first, so nothing inside it is formatted; Slack shows ``` blocks and `code` as they are.
(``slackify-markdown`` was tried for this and not taken: it lets ``<!channel>`` and ``<@U…>``
through as they are, so a reply could ping a whole channel, and makes ``2*3*4`` ``2_3_4``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nanobot.chat_commands import shown
from nanobot_channels.text import misleading, split_message, tables_as_code, to_marks

MAX_TEXT = 3900  # Slack truncates a message's text past 40,000 characters; it advises under 4,000


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_to_mrkdwn(text: str) -> str:
    return to_marks(text, escape, lambda words, url: f"<{url.replace('|', '%7C')}|{words}"
                                                     f"{f' ({url})' if misleading(words, url) else ''}>")


def mrkdwn_chunks(text: str, limit: int = MAX_TEXT) -> list[str]:
    """Split on the Markdown (code blocks closed and reopened; tables already lined up, which can
    make them much longer), then convert each piece; escaping makes a piece longer, so the split
    leaves room for it."""
    return [markdown_to_mrkdwn(piece) for piece in split_message(tables_as_code(text), limit * 4 // 5)]


def pick_blocks(mrkdwn: str, offer: Sequence[str]) -> list[dict[str, Any]] | None:
    """A message as Block Kit: its text, then a button for each pick it offers (``/mode``: tools,
    code...); None when they do not fit Slack's limits (25 in an actions block, 75 characters a
    label). A press comes back as a ``block_actions`` payload with the button's value."""
    buttons = [{"type": "button", "action_id": f"pick-{i}", "value": sends,
                "text": {"type": "plain_text", "text": word}}
               for i, (word, sends) in enumerate(shown(offer, most=25, label_chars=75, sends_bytes=2000))]
    return [{"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn[:3000]}},
            {"type": "actions", "elements": buttons}] if buttons else None
