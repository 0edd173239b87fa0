"""Any OpenAI-compatible server through the official ``openai`` SDK.

Retries are ours, not the SDK's, because the SDK's defaults hurt local servers: llama.cpp and
Ollama serve one request at a time, so re-sending a request that timed out only queues a
second copy behind the first, and a 500 from such a server (a rejected message, a template
error) fails the same way every time. So: a timeout or a 500 is never retried; a connection
error, 429, 502, 503 or 504 is, up to ``maxRetries`` times, with backoff (honouring
``Retry-After``). Every failure becomes one short ProviderError line for the user.

A request goes as every server takes it; what one model's server refuses of it is learnt from
its 400 and left out from then on (``quirks.ModelQuirks``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import ssl
from typing import Any

import httpx2
import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from nanobot.config import ConfigError, ProviderConfig
from nanobot.utf8 import clean_text
from nanobot.providers.base import ChatRequest, LLMResponse, Provider, ProviderError, ToolCall, Transcript, Usage
from nanobot.providers.quirks import Carried, ModelQuirks, error_of

log = logging.getLogger(__name__)

RETRY_STATUSES = {429, 502, 503, 504}
MAX_BACKOFF_S = 30.0
CALL_FIELDS = ("id", "type", "function", "index")  # a tool call's own; the rest goes back as it came


class OpenAIProvider(Provider):
    def __init__(self, name: str, config: ProviderConfig) -> None:
        self.name = name
        self.max_retries = config.max_retries
        self.backoff_s = 1.0
        self.prompt_cache_key = config.prompt_cache_key
        self.quirks = ModelQuirks(config.extra_body)
        self._client = openai.AsyncOpenAI(
            api_key=config.api_key or "no-key",  # local servers (Ollama, llama.cpp) accept anything
            base_url=config.api_base or None,
            timeout=httpx2.Timeout(config.timeout, connect=min(10.0, config.timeout)),
            max_retries=0,
            http_client=_AiohttpClient(verify=_tls_context()),
        )

    async def chat(self, request: ChatRequest) -> LLMResponse:
        kwargs: dict[str, Any] = {}
        if request.tools:  # llama.cpp emits native tool calls only when tool_choice is given
            kwargs.update(tools=request.tools, tool_choice="auto")
        if self.prompt_cache_key and request.cache_key:  # routes a chat's requests to the same cache
            kwargs.update(prompt_cache_key=request.cache_key)
        attempt = 0
        while True:
            try:
                if request.on_text is not None:
                    return await self._streamed(request, kwargs)
                return _to_response(await self._create(request, kwargs))
            except ProviderError:
                raise
            except Exception as exc:
                if self.quirks.learn(exc, request.model):
                    continue  # (at most once per field: not a retry)
                error, wait = classify_error(exc)
                if wait is None or attempt == self.max_retries:
                    raise error from exc
                delay = min(MAX_BACKOFF_S, wait if wait > 0 else self.backoff_s * 2 ** attempt)
                attempt += 1
                log.warning("model call failed (%s); retry %d of %d in %.1f s", error, attempt, self.max_retries, delay)
                await asyncio.sleep(delay)

    async def _streamed(self, request: ChatRequest, kwargs: dict[str, Any]) -> LLMResponse:
        """The same response as a plain call, assembled from the stream's deltas; text goes to
        ``request.on_text`` as it arrives. Tool calls come in pieces keyed by index (id and name
        first, the arguments in fragments), parallel calls interleaved; usage is in the last chunk."""
        assert request.on_text is not None
        stream = await self._create(request, {**kwargs, "stream": True, "stream_options": {"include_usage": True}})
        text: list[str] = []
        carried = Carried()
        calls: dict[int, dict[str, Any]] = {}  # pieces in lists: += on a held string copies it each time
        finish, model, usage, answered = None, "", Usage(), False
        async with stream:
            async for chunk in stream:
                model = chunk.model or model
                if chunk.usage:
                    usage = usage_of(chunk.usage.model_dump())
                for choice in chunk.choices or []:
                    answered = True
                    finish = choice.finish_reason or finish
                    delta = choice.delta
                    if delta is None:
                        continue
                    for part in delta.tool_calls or []:
                        call = calls.setdefault(part.index, {"id": "", "name": [], "arguments": [], "extra": {}})
                        call["id"] = part.id or call["id"]
                        call["extra"].update(part.model_extra or {})  # Gemini's thought signature
                        if part.function is not None:
                            call["name"].append(part.function.name or "")
                            call["arguments"].append(part.function.arguments or "")
                    if delta.content:
                        text.append(delta.content)
                        await request.on_text(delta.content)
                    carried.add(delta.model_extra or {})
        if not answered:  # an HTML error page from a proxy, or a stream without a single choice
            raise ProviderError("the model server returned no choices (its stream held no answer)")
        tool_calls = [ToolCall(c["id"] or f"call_{i}", "".join(c["name"]), "".join(c["arguments"]), c["extra"])
                      for i, c in sorted(calls.items())]
        return LLMResponse("".join(text) or None, tool_calls, usage, model, finish, carried=carried.fields())

    async def _create(self, request: ChatRequest, extra: dict[str, Any]) -> Any:
        """POST /chat/completions through the SDK's client (its auth, errors and stream types),
        without ``chat.completions.create``'s walk of every message against the request's
        TypedDicts: that walk cost more CPU than the rest of a turn together, and it grows with
        the history. Our messages are plain JSON already, and go as bytes (``request_json``).
        A plain answer comes back as parsed JSON (``cast_to=object``), not as the SDK's models:
        building them cost 4 % of a message's trip, and ``_to_response`` reads what we use."""
        body = {"model": request.model, **self.quirks.fields(request, wire_messages(request.messages)), **extra}
        stream = bool(extra.get("stream"))
        return await self._client.post("/chat/completions", content=request_json(body),
                                       cast_to=ChatCompletion if stream else object,
                                       stream=stream, stream_cls=AsyncStream[ChatCompletionChunk])

    async def transcribe(self, audio: tuple[str, bytes], model: str, language: str | None,
                         timeout: float) -> Transcript:
        """Speech to text (``/audio/transcriptions``) of ``(file name, bytes)`` on this
        provider's client; no retries: a recording that failed once (too long, unsupported)
        fails the same way again."""
        extra = {"language": language} if language else {}
        try:
            result = await self._client.audio.transcriptions.create(model=model, file=audio, timeout=timeout, **extra)
        except Exception as exc:
            raise classify_error(exc)[0] from exc
        if isinstance(result, str):
            return Transcript(result)
        usage = getattr(result, "usage", None)  # as the server wrote it: the SDK checks no type here
        seconds, tokens = (getattr(usage, name, None) for name in ("seconds", "input_tokens"))
        output = getattr(usage, "output_tokens", None)
        text = getattr(result, "text", None)
        return Transcript(text if isinstance(text, str) else "", float(seconds) if _number(seconds) else None,
                          Usage(tokens, output if _number(output) else 0) if _number(tokens) else None)

    async def speak(self, text: str, model: str, voice: str, timeout: float) -> bytes:
        """Text to speech (``/audio/speech``) as OGG/Opus, on this provider's client; no retries:
        the text reply went already, and a voice note late by a retry's wait is worth less."""
        try:
            result = await self._client.audio.speech.create(model=model, voice=voice, input=text,
                                                            response_format="opus", timeout=timeout)
        except Exception as exc:
            raise classify_error(exc)[0] from exc
        return result.content

    async def close(self) -> None:
        await self._client.close()


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The SDK's TLS context (the system's roots, or ``SSL_CERT_FILE``), one for the process:
    building one reads the CA bundle, about 40 ms of CPU, and the SDK builds one per client."""
    try:
        return httpx2.create_ssl_context()
    except (OSError, ssl.SSLError) as exc:  # a file the environment names (the first set is read)
        name = next((name for name in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(name)), None)
        where = f"{name}={os.environ[name]} (environment)" if name else "the system's CA certificates"
        raise ConfigError(f"{where}: no CA certificate could be read there ({exc.strerror or exc})") from exc


class _AiohttpClient(openai.DefaultAioHttpClient):  # type: ignore[misc, valid-type]
    """The SDK's client over aiohttp: a call costs 0.8 CPU-ms instead of 1.25 over httpx2's
    own pool (bench/RESULTS.md, "Durable delivery"). Its adapter reports every aiohttp
    connection error (refused, reset, disconnected) as a connect *timeout*, which the SDK
    turns into APITimeoutError: we would then tell the user the server was slow, and not
    retry what a retry fixes. A "timeout" caused by something that is not one is re-raised as
    the connection error it was."""

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        try:
            return await super().send(request, **kwargs)
        except httpx2.TimeoutException as exc:
            if exc.__cause__ is None or isinstance(exc.__cause__, TimeoutError):
                raise
            raise httpx2.ConnectError(str(exc) or type(exc.__cause__).__name__, request=request) from exc.__cause__


def request_json(body: dict[str, Any]) -> bytes:
    """``body`` as the SDK would encode it (compact, UTF-8, no NaN). The tool schemas, three
    quarters of a tools-mode request, are the same objects turn after turn: each is encoded
    once and kept while it lives."""
    tools = body.get("tools")
    rest = {key: value for key, value in body.items() if key != "tools"}
    text = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if tools:
        text = f'{text[:-1]},"tools":[{",".join(map(_schema_json, tools))}]}}'
    return text.encode()


def _schema_json(schema: dict[str, Any]) -> str:
    kept = _schemas.get(id(schema))
    if kept is None or kept[0] is not schema:
        if len(_schemas) > 4096:  # tools come and go (MCP servers reconnect): forget the old ones
            _schemas.clear()
        kept = _schemas[id(schema)] = (schema, json.dumps(schema, ensure_ascii=False, separators=(",", ":"),
                                                          allow_nan=False))
    return kept[1]


_schemas: dict[int, tuple[dict[str, Any], str]] = {}  # id -> (the schema, kept alive; its JSON)


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the strictest servers accept: an assistant message with tool calls and no text
    carries ``content: ""``, not null (llama-cpp-python answers null with HTTP 500); no
    unpaired surrogates, which cannot be sent as JSON at all."""
    return [{**m, "content": ""} if m.get("content") is None else m for m in clean_text(messages)]


def classify_error(exc: Exception) -> tuple[ProviderError, float | None]:
    """The user's error line, and whether to retry: None = never, 0 = backoff, >0 = Retry-After."""
    if isinstance(exc, openai.APIStatusError):
        error = ProviderError(f"the model server answered HTTP {exc.status_code}: {_short(_server_message(exc))}",
                              fallback=exc.status_code == 429 or exc.status_code >= 500, status=exc.status_code)
        if exc.status_code not in RETRY_STATUSES or _error_code(exc) == "insufficient_quota":
            return error, None  # (a quota spent is a 429 too: asking again soon does not help; a fallback may)
        return error, _retry_after(exc.response)
    if isinstance(exc, openai.APITimeoutError):  # before APIConnectionError: it is a subclass
        return ProviderError("the model server did not answer in time (providers.*.timeout)", fallback=True), None
    if isinstance(exc, openai.APIConnectionError) and (refused := _certificate_error(exc)) is not None:
        # Not retried: a certificate refused once is refused again.
        return ProviderError(f"the model server's certificate was refused ({refused.verify_message or refused}); for a "
                             "certificate of your own CA, give its file in SSL_CERT_FILE", fallback=True), None
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError(f"could not reach the model server ({_short(str(exc.__cause__ or exc))})",
                             fallback=True), 0
    if isinstance(exc, (openai.OpenAIError, ValueError, TypeError, AttributeError)):
        # ValueError & co: a 200 whose body is not a chat completion (an HTML page, say)
        return ProviderError(f"the model server's answer was not a chat completion ({_short(str(exc))})"), None
    raise exc


def _certificate_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed, down ``exc``'s causes (aiohttp's error is one too, and
    holds the check's own as ``certificate_error``; httpx's chain is partly implicit)."""
    for _ in range(10):  # a chain is a few links long; a cycle in one must not hang the turn
        if exc is None or isinstance(exc, ssl.SSLCertVerificationError):
            return getattr(exc, "certificate_error", exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _error_code(exc: openai.APIStatusError) -> str | None:
    """The error's ``code``, as OpenAI gives it (``insufficient_quota``)."""
    error = error_of(exc)
    return str(error["code"]) if isinstance(error, dict) and error.get("code") else None


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own words (``{"error": {"message": ...}}``), not the SDK's "Error code: N - {...}"."""
    error = error_of(exc)
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) and message else exc.message


def _retry_after(response: httpx2.Response | None) -> float:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``retry-after``), 0 if it did not say."""
    headers = response.headers if response is not None else {}
    try:
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        return max(0.0, float(headers.get("retry-after", 0)))
    except ValueError:
        return 0.0


def _to_response(completion: Any) -> LLMResponse:
    """A completion from its JSON, read as leniently as the SDK's own models read it: a field
    that is missing or null counts as empty. Text instead of JSON is a clear error."""
    if isinstance(completion, str):
        raise ProviderError(f"the model server returned text, not JSON: {_short(completion, 80)}")
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError("the model server returned no choices")
    choice = choices[0]
    message = _object(choice.get("message"))
    calls = [ToolCall(call.get("id") or f"call_{i}", function.get("name") or "", function.get("arguments") or "",
                      {k: v for k, v in call.items() if k not in CALL_FIELDS})
             for i, call in enumerate(message.get("tool_calls") or [])
             if isinstance(call, dict) and (function := _object(call.get("function")))]
    carried = Carried()
    carried.add(message)
    return LLMResponse(message.get("content"), calls, usage_of(_object(completion.get("usage"))),
                       completion.get("model") or "", choice.get("finish_reason"), carried=carried.fields())


def usage_of(usage: dict[str, Any]) -> Usage:
    """Tokens, and the prompt's cached part as each server reports it: OpenAI, vLLM and
    llama.cpp's ``prompt_tokens_details.cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``."""
    details = _object(usage.get("prompt_tokens_details"))
    cached = details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens") or 0
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
