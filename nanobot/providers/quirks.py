"""What one model's server refuses of a request that other servers take, learnt from its 400s
while the process runs, and left out of that model's requests from then on.

- OpenAI's reasoning models (gpt-5, o3, o4-mini) refuse ``max_tokens`` (they take
  ``max_completion_tokens``, which other servers may not know) and any ``temperature`` but
  their own.
- Thinking models want what they thought before a tool call sent back with it in every later
  request, or refuse the chat: DeepSeek's (and Kimi's, llama.cpp's) ``reasoning_content``,
  OpenRouter's ``reasoning_details`` (Gemini 3, Claude), and a tool call's ``extra_content``
  on Gemini's own API (its thought signature). A server that never heard of them may refuse
  them (a fallback, or a chat switched with /model).
- ``providers.<name>.extraBody`` may hold a field one of the server's models refuses
  (``reasoning_effort`` to a model that does not reason).

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
REASONING, DETAILS = "reasoning_content", "reasoning_details"
CARRIED = (REASONING, DETAILS, "extra_content")  # what a message or tool call carries back for its server


class ModelQuirks:
    def __init__(self, extra_body: dict[str, Any]) -> None:
        self.extra_body = extra_body  # the provider's own fields for every request (extraBody)
        self._refused: dict[str, set[str]] = {}  # model -> fields

    def fields(self, request: ChatRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The request's messages, length, temperature and the provider's extra fields, as its
        model takes them."""
        refused = self._refused.get(request.model, set())
        if dropped := refused.intersection(CARRIED):
            messages = [_without(m, dropped) for m in messages]
        fields: dict[str, Any] = {k: v for k, v in self.extra_body.items() if k not in refused}
        fields.update({"messages": messages,
                       "max_completion_tokens" if "max_tokens" in refused else "max_tokens": request.max_tokens})
        if "temperature" not in refused:
            fields["temperature"] = request.temperature
        return fields

    def learn(self, exc: Exception, model: str) -> bool:
        """Whether ``exc`` refused a field we can do without, not refused before: ask again."""
        error = error_of(exc) if isinstance(exc, openai.BadRequestError) else None
        field = _refused_field(error, self.extra_body) if isinstance(error, dict) else None
        if field is None or field in self._refused.get(model, set()):
            return False
        self._refused.setdefault(model, set()).add(field)
        log.info("the model %s does not take %s: its requests go without it", model, field)
        return True


class Carried:
    """The thinking an answer carries for its server, from its message or, piece by piece, from
    its stream's deltas: ``reasoning_content`` as text; ``reasoning_details`` as parts, each
    streamed in pieces under its ``index`` (text and summary arrive in runs, the rest whole)."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._details: dict[Any, dict[str, Any]] = {}

    def add(self, fields: dict[str, Any]) -> None:
        if isinstance(text := fields.get(REASONING), str):
            self._text.append(text)
        for part in fields.get(DETAILS) or ():
            if isinstance(part, dict):
                kept = self._details.setdefault(part.get("index", len(self._details)), {})
                for key, value in part.items():
                    joined = key in ("text", "summary") and isinstance(value, str) and isinstance(kept.get(key), str)
                    kept[key] = kept[key] + value if joined else value

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {REASONING: "".join(self._text)} if any(self._text) else {}
        if self._details:
            fields[DETAILS] = list(self._details.values())
        return fields


def _refused_field(error: dict[str, Any], extra_body: dict[str, Any]) -> str | None:
    param, unsupported = str(error.get("param") or ""), error.get("code") in UNSUPPORTED
    if unsupported and (param in ("max_tokens", "temperature") or param in extra_body):
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
