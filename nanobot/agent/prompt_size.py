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
            # with what the model thought before the calls, which goes back with them (quirks.CARRIED)
            chars += len(json.dumps([m["tool_calls"], m.get("reasoning_content"), m.get("reasoning_details")]))
        images += len(m.get("images") or ())
    # Every image is counted, though only the latest few are sent as pictures: cautious.
    return chars // CHARS_PER_TOKEN + PER_MESSAGE_TOKENS * len(messages) + IMAGE_TOKENS * images


def prompt_budget(context_tokens: int, max_tokens: int) -> int:
    """Tokens the prompt may take, leaving room for the reply."""
    return max(256, context_tokens - max_tokens)


RESULT_CHARS = 16_000  # a tool or program result longer than this is cut when first shown
HEAD_CHARS, TAIL_CHARS = 12_000, 3_000
RESULTS_DIR = ".results"  # in the chat's folder: long results, whole
KEPT_RESULTS = 50  # the newest kept there; older ones are removed as new ones come
_RESULT_MARKS = ("<python_result>", "<tool_result")


def is_long_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= RESULT_CHARS:
        return False
    return message.get("role") == "tool" or message.get("role") == "user" and content.startswith(_RESULT_MARKS)


def cut_when_shown(message: dict[str, Any], kept_at: str | None) -> dict[str, Any]:
    """A long result as it is shown, once and in every later request: its head and tail, and
    where the whole of it is kept (``kept_at``, in the chat's folder). Never shortened later
    (it once was, when it grew old): a later request repeats these very bytes, which a prompt
    cache bills at a tenth of the price or less, where a rewrite would be billed in full."""
    content = message["content"]
    hidden = len(content) - HEAD_CHARS - TAIL_CHARS
    where = f"all of it is in {kept_at}: read the part you need" if kept_at else "print the part you need"
    note = f"\n[… {hidden:,} more characters; {where} …]\n"
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
