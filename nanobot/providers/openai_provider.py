"""Any OpenAI-compatible server through the official ``openai`` SDK.

The SDK already retries 408/409/429/5xx and connection errors with backoff and honours
``Retry-After``; we only set how many times and how long to wait, and turn its exceptions
into one short ProviderError line for the user.
"""

from __future__ import annotations

import logging

import openai

from nanobot.config import ProviderConfig
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError, ToolCall, Usage

log = logging.getLogger(__name__)


class OpenAIProvider:
    def __init__(self, name: str, config: ProviderConfig) -> None:
        self.name = name
        self._client = openai.AsyncOpenAI(
            api_key=config.api_key or "no-key",  # local servers (Ollama, llama.cpp) accept anything
            base_url=config.api_base or None,
            timeout=config.timeout,
            max_retries=config.max_retries,
        )

    async def chat(self, request: ChatRequest) -> LLMResponse:
        kwargs = {}
        if request.tools:
            kwargs["tools"] = request.tools
        try:
            completion = await self._client.chat.completions.create(
                model=request.model, messages=request.messages, max_tokens=request.max_tokens,
                temperature=request.temperature, **kwargs)
        except openai.APIStatusError as exc:
            log.warning("model call failed: HTTP %s: %s", exc.status_code, exc.message)
            raise ProviderError(f"the model server answered HTTP {exc.status_code}: {_short(exc.message)}") from exc
        except openai.APITimeoutError as exc:
            raise ProviderError("the model server did not answer in time") from exc
        except openai.APIConnectionError as exc:
            log.warning("model call failed: %s", exc)
            raise ProviderError(f"could not reach the model server ({_short(str(exc.__cause__ or exc))})") from exc
        except openai.OpenAIError as exc:
            raise ProviderError(f"model call failed: {_short(str(exc))}") from exc
        return _to_response(completion)

    async def close(self) -> None:
        await self._client.close()


def _to_response(completion) -> LLMResponse:
    if not completion.choices:
        raise ProviderError("the model server returned no choices")
    choice = completion.choices[0]
    message = choice.message
    calls = [ToolCall(c.id or f"call_{i}", c.function.name, c.function.arguments or "")
             for i, c in enumerate(message.tool_calls or []) if getattr(c, "function", None)]
    usage = Usage(completion.usage.prompt_tokens, completion.usage.completion_tokens) if completion.usage else Usage()
    return LLMResponse(message.content, calls, usage, completion.model or "", choice.finish_reason)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
