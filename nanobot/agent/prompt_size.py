"""How much of the model's context a prompt takes, estimated without a tokenizer.

Servers reject a prompt longer than their context (HTTP 400), and a chat whose history has
outgrown it would fail on every later turn. So the prompt is kept under
``agents.defaults.contextTokens - maxTokens``: the oldest history goes first, and a turn
that outgrows the budget by itself stops with a clear reply. The estimate (about 3
characters per token, which is cautious for English and code) needs no model-specific files.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 3
PER_MESSAGE_TOKENS = 4  # role and framing
IMAGE_TOKENS = 800  # a resized photo at full detail is 765 to 1,600 tokens on the major models


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    chars = images = 0
    for m in messages:
        content = m.get("content")
        chars += len(content) if isinstance(content, str) else len(json.dumps(content or ""))
        if m.get("tool_calls"):
            chars += len(json.dumps(m["tool_calls"]))
        images += len(m.get("images") or ())
    # Every image is counted, though only the latest few are sent as pictures: cautious.
    return chars // CHARS_PER_TOKEN + PER_MESSAGE_TOKENS * len(messages) + IMAGE_TOKENS * images


def prompt_budget(context_tokens: int, max_tokens: int) -> int:
    """Tokens the prompt may take, leaving room for the reply."""
    return max(256, context_tokens - max_tokens)


OLD_RESULT_CHARS = 2_000  # an older tool or program result longer than this is sent shortened
HEAD_CHARS, TAIL_CHARS = 700, 300
_RESULT_MARKS = ("<python_result>", "<tool_result")


def shorten_old_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt with every tool or program result before the model's latest message cut to its
    head and tail: the model has read them already, and each later request would otherwise pay
    for them again (a 4.5 KB skill, a 20 KB printout). The latest results stay whole; the
    history on disk keeps everything."""
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return [_shortened(m) if i < last_reply and _is_result(m) else m for i, m in enumerate(messages)]


def _is_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= OLD_RESULT_CHARS:
        return False
    return message.get("role") == "tool" or message.get("role") == "user" and content.startswith(_RESULT_MARKS)


def _shortened(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    hidden = len(content) - HEAD_CHARS - TAIL_CHARS
    note = (f"\n[… {hidden:,} characters you read before are not repeated here; call the function again, or print "
            "the part you need, to see them …]\n")
    return {**message, "content": content[:HEAD_CHARS] + note + content[-TAIL_CHARS:]}


def drop_oldest_history(messages: list[dict[str, Any]], history_len: int, budget: int) -> int:
    """Remove the oldest history (``messages[1:1+history_len]``, after the system prompt) until
    the prompt fits; what is left starts at a user message. Returns the new history length."""
    while history_len > 0 and estimate_tokens(messages) > budget:
        del messages[1]
        history_len -= 1
        while history_len > 0 and messages[1].get("role") != "user":  # no orphaned tool results
            del messages[1]
            history_len -= 1
    return history_len
