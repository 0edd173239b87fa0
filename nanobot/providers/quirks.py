"""What one model's server refuses of a request that other servers take, learnt from its 400s
while the process runs, and left out of that model's requests from then on.

- OpenAI's reasoning models (gpt-5, o3, o4-mini) refuse ``max_tokens`` (they take
  ``max_completion_tokens``, which other servers may not know) and any ``temperature`` but
  their own.
- DeepSeek's thinking mode (and Kimi's, llama.cpp's) wants the ``reasoning_content`` of an
  assistant message with tool calls sent back with it in every later request, and Gemini 3 a
  tool call's ``extra_content`` (its thought signature); a server that never heard of either
  may refuse it (a fallback, or a chat switched with /model).

A refusal that names one of these (``unsupported_parameter``, ``unsupported_value``,
``unknown_parameter``, or the field in ``param``) is asked again at once without it.
"""

from __future__ import annotations

import logging
from typing import Any

import openai

from nanobot.providers.base import ChatRequest

log = logging.getLogger(__name__)

UNSUPPORTED = ("unsupported_parameter", "unsupported_value", "unknown_parameter")
REASONING = "reasoning_content"
CARRIED = (REASONING, "extra_content")  # what a message or tool call carries back for its server


class ModelQuirks:
    def __init__(self) -> None:
        self._refused: dict[str, set[str]] = {}  # model -> fields

    def fields(self, request: ChatRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The request's messages, length and temperature as its model takes them."""
        refused = self._refused.get(request.model, set())
        if dropped := refused.intersection(CARRIED):
            messages = [_without(m, dropped) for m in messages]
        fields: dict[str, Any] = {"messages": messages,
                                  "max_completion_tokens" if "max_tokens" in refused else "max_tokens": request.max_tokens}
        if "temperature" not in refused:
            fields["temperature"] = request.temperature
        return fields

    def learn(self, exc: Exception, model: str) -> bool:
        """Whether ``exc`` refused a field we can do without, not refused before: ask again."""
        error = error_of(exc) if isinstance(exc, openai.BadRequestError) else None
        field = _refused_field(error) if isinstance(error, dict) else None
        if field is None or field in self._refused.get(model, set()):
            return False
        self._refused.setdefault(model, set()).add(field)
        log.info("the model %s does not take %s: its requests go without it", model, field)
        return True


def _refused_field(error: dict[str, Any]) -> str | None:
    param, unsupported = str(error.get("param") or ""), error.get("code") in UNSUPPORTED
    if unsupported and param in ("max_tokens", "temperature"):
        return param
    # (param "messages[3].reasoning_content"; not DeepSeek's "the reasoning_content ... must be passed back")
    for field in CARRIED:
        if param.endswith(field) or unsupported and field in str(error.get("message") or ""):
            return field
    return None


def _without(message: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """``message`` without ``fields``, on itself and on its tool calls."""
    if not fields.intersection(message) and not any(fields.intersection(c) for c in message.get("tool_calls") or ()):
        return message
    kept = {k: v for k, v in message.items() if k not in fields}
    if "tool_calls" in kept:
        kept["tool_calls"] = [{k: v for k, v in call.items() if k not in fields} for call in kept["tool_calls"]]
    return kept


def error_of(exc: openai.APIStatusError) -> Any:
    """The server's ``{"error": ...}`` (the SDK has usually taken the wrapper off already)."""
    return exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
