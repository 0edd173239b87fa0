"""Plays recorded model turns from a JSONL file, so nanobot can be shown offline.

Each line is one model response: ``{"content": "...", "tool_calls": [{"name": ..., "arguments":
{...}}]}``. Lines with a ``"setup"`` key describe the demo (its user message and starting
files) and are not responses. When the recording runs out, the provider says so plainly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nanobot.providers.base import ChatRequest, LLMResponse, Provider, ToolCall, Usage


class ReplayProvider(Provider):
    name = "replay"

    def __init__(self, path: Path) -> None:
        self.setup: dict[str, Any] = {}
        self._responses: list[dict[str, Any]] = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if "setup" in record:
                self.setup = record["setup"]
            else:
                self._responses.append(record)
        self._next = 0

    @property
    def calls(self) -> int:
        return self._next

    async def chat(self, request: ChatRequest) -> LLMResponse:
        if self._next >= len(self._responses):
            return LLMResponse("(The recording has no more model turns: this demo replays a fixed conversation.)")
        record = self._responses[self._next]
        self._next += 1
        calls = [ToolCall(f"call_{self._next}_{i}", c["name"], json.dumps(c.get("arguments", {})))
                 for i, c in enumerate(record.get("tool_calls", []))]
        prompt_chars = sum(len(str(m.get("content") or "")) for m in request.messages)
        return LLMResponse(record.get("content"), calls, Usage(prompt_chars // 4, len(record.get("content") or "") // 4),
                           "replay")

    async def close(self) -> None:
        return None
