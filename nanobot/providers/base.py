"""What the agent needs from a model: one chat call that may return text and tool calls."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable


class ProviderError(Exception):
    """A model call failed in a way worth telling the user in one short line.

    ``fallback``: another provider may well answer (429, 5xx, a timeout, no connection); a
    bad request (400), a bad key or an unknown model would fail the same way on a retry here.
    """

    def __init__(self, message: str, *, fallback: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.fallback = fallback
        self.status = status  # the server's HTTP status, when it answered with an error
        self.failed_attempts: list[tuple[str, str, str]] = []  # (provider, model, error) before this one


def parse_arguments(raw: str) -> dict[str, Any]:
    """A tool call's JSON arguments as a dict; ValueError with the parser's complaint when broken."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    return value


@dataclass
class ToolCall:
    id: str
    name: str
    raw_arguments: str  # kept as sent, so a malformed payload can be shown back to the model
    # The server's other fields of the call, sent back as they came: Gemini 3 refuses a chat
    # whose tool call lacks its ``extra_content`` (the thought signature).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw_arguments},
                **self.extra}


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, read from the provider's prompt cache (billed lower)


@dataclass
class Transcript:
    """A recording's words and what the server counted of it: ``seconds`` of audio (models billed
    by the minute, such as whisper-1) or ``usage`` in tokens (gpt-4o-transcribe); neither from a
    server that does not say (most local Whisper servers)."""
    text: str
    seconds: float | None = None
    usage: Usage | None = None


@dataclass
class LLMResponse:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    provider: str = ""  # which provider answered (set by the router)
    failed_attempts: list[tuple[str, str, str]] = field(default_factory=list)  # (provider, model, error) before it
    # What the model thought, as its server wants it back with a tool call (``quirks.CARRIED``).
    carried: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    model: str
    tools: list[dict[str, Any]] | None = None
    max_tokens: int = 8192
    temperature: float = 0.2
    provider: str | None = None  # None: agents.defaults.provider
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (provider, model), tried in order
    # Set: the reply is streamed, and each piece of text is handed here as it arrives.
    on_text: Callable[[str], Awaitable[None]] | None = None
    cache_key: str | None = None  # the same for every request of a chat (``prompt_cache_key``, where enabled)


class Provider:
    """A model endpoint: one server's client, or the router that picks among them."""

    name: str = "provider"

    async def chat(self, request: ChatRequest) -> LLMResponse:
        raise NotImplementedError

    async def close(self) -> None:
        return None

    def cooling_down(self) -> dict[str, float]:
        """Providers skipped after a failure, and for how many more seconds (the router's)."""
        return {}

