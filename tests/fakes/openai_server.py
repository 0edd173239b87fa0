"""A scripted OpenAI-compatible chat server on 127.0.0.1, for the real ``openai`` SDK to talk to.

Usage::

    async with FakeOpenAI() as llm:            # llm.base_url -> "http://127.0.0.1:PORT/v1"
        llm.script(reply("hi"), tool_call("read_file", {"path": "a.txt"}), error(429, retry_after=0))
        ...
        llm.requests   # every request body received, in order, user messages without their time
        llm.raw_requests  # the same, exactly as received

Each user message ends with the time it was sent (``(sent Friday 2026-11-27 20:06 (UTC))``: at
the end, for the prompt cache). ``requests`` (and what scripted functions are given) leave it
out, so a test reads a message as the user wrote it; the prompt-cache tests read ``raw_requests``.

A script item is a response dict (``reply``/``tool_call``/``tool_calls``, optionally
``truncated(...)``), an ``error(...)``, a ``Raw(body)`` non-JSON answer, ``HANG_UP`` (the connection is closed
unanswered), a ``delayed(item, seconds)`` or a function ``f(request_body) -> item``. When the script is
empty the server answers ``fallback`` (default: a plain "(script exhausted)" reply).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web


_SENT = re.compile(r"\n\n\(sent [^\n]*\)\Z")


def without_times(body: dict[str, Any]) -> dict[str, Any]:
    """The request with each user message's trailing time left out."""
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if isinstance(content, str):
            message["content"] = _SENT.sub("", content)
        elif isinstance(content, list) and content and str(content[-1].get("text", "")).startswith("(sent "):
            message["content"] = content[:-1]
    return body


def reply(content: str, prompt_tokens: int = 10, completion_tokens: int = 5) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content},
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def tool_calls(*calls: tuple[str, dict[str, Any] | str], content: str | None = None) -> dict[str, Any]:
    items = []
    for i, (name, args) in enumerate(calls):
        raw = args if isinstance(args, str) else json.dumps(args)
        items.append({"id": f"call_{time.monotonic_ns()}_{i}", "type": "function",
                      "function": {"name": name, "arguments": raw}})
    return {"message": {"role": "assistant", "content": content, "tool_calls": items},
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def tool_call(name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    return tool_calls((name, args))


@dataclass
class Error:
    status: int
    headers: dict[str, str]
    message: str
    code: str | None = None  # OpenAI's error code ("insufficient_quota")
    param: str | None = None  # the request field it is about ("max_tokens")


def error(status: int, retry_after: float | None = None, message: str = "scripted error",
          code: str | None = None, param: str | None = None) -> Error:
    headers = {"retry-after-ms": str(int(retry_after * 1000))} if retry_after is not None else {}
    return Error(status, headers, message, code, param)


@dataclass
class Delayed:
    item: Any
    seconds: float


def delayed(item: Any, seconds: float) -> Delayed:
    return Delayed(item, seconds)


@dataclass
class Raw:
    """A non-JSON answer, e.g. an HTML page with status 200 from a misconfigured proxy."""

    body: str
    content_type: str = "text/html"
    status: int = 200


HANG_UP = "hang up"  # a script item: close the connection without an answer (a crashed or restarting server)


def truncated(item: dict[str, Any]) -> dict[str, Any]:
    """The same reply, marked as cut at max_tokens (``finish_reason: "length"``)."""
    return {**item, "finish_reason": "length"}


class FakeOpenAI:
    # Streaming (``"stream": true``): text goes out in pieces of ``stream_piece_chars``, one
    # every ``stream_interval`` seconds; tool calls as id+name first, then their arguments in
    # pieces, parallel calls interleaved; the last chunk carries usage, as OpenAI's does.
    stream_piece_chars = 4
    stream_interval = 0.0

    def __init__(self, fallback: Any = None, cache: Any = None, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # served over https with this context (its certificate), else plain http
        self.cache = cache  # a prompt_cache.PromptCache: usage then says how many prompt tokens were cached
        self.requests: list[dict[str, Any]] = []
        self.raw_requests: list[dict[str, Any]] = []
        self.transcripts: list[Any] = []  # answers of /audio/transcriptions, in order
        self.transcriptions: list[dict[str, Any]] = []  # what was sent there: model, language, filename, data
        self.speeches: list[Any] = []  # answers of /audio/speech, in order (default: a real OGG/Opus file)
        self.speech_requests: list[dict[str, Any]] = []  # what was sent there: model, voice, input, response_format
        self.models = ["gpt-4.1-mini", "local-model"]  # what GET /v1/models lists
        self._script: list[Any] = []
        self.fallback = fallback if fallback is not None else reply("(script exhausted)")
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.request_event = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def script(self, *items: Any) -> None:
        self._script.extend(items)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

    async def start(self) -> "FakeOpenAI":
        app = web.Application(client_max_size=64 * 1024 * 1024)  # prompts with pictures are big
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_post("/v1/audio/speech", self._speak)
        app.router.add_get("/v1/models", self._models)
        # A short shutdown: a delayed() answer nobody waits for any more (the client was
        # cancelled, e.g. by /stop) must not hold up the test's teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=self.tls).start()
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeOpenAI":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _stream(self, request: web.Request, body: dict[str, Any], item: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model", "fake")}

        async def send(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> None:
            chunk = {**base, "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.stream_interval:
                await asyncio.sleep(self.stream_interval)

        message = item["message"]
        await send({"role": "assistant", "content": ""})
        content, n = message.get("content") or "", self.stream_piece_chars
        thought = message.get("reasoning_content") or ""  # DeepSeek's thinking, before the answer
        for i in range(0, len(thought), n):
            await send({"reasoning_content": thought[i:i + n]})
        for part in message.get("reasoning_details") or ():  # OpenRouter's: text in pieces, the rest whole
            text = part.get("text", "")
            for i in range(0, max(len(text), 1), n):
                await send({"reasoning_details": [{**part, "text": text[i:i + n]} if text else part]})
        for i in range(0, len(content), n):
            await send({"content": content[i:i + n]})
        calls = message.get("tool_calls") or []
        for index, call in enumerate(calls):  # headers first, then interleaved argument pieces
            await send({"tool_calls": [{**call, "index": index, "function": {"name": call["function"]["name"],
                                                                             "arguments": ""}}]})
        pieces = [[c["function"]["arguments"][i:i + n] for i in range(0, len(c["function"]["arguments"]), n)]
                  for c in calls]
        for step in range(max((len(p) for p in pieces), default=0)):
            for index, parts in enumerate(pieces):
                if step < len(parts):
                    await send({"tool_calls": [{"index": index, "function": {"arguments": parts[step]}}]})
        finish = item.get("finish_reason") or ("tool_calls" if calls else "stop")
        await send({}, finish)
        await send(None, usage={**item["usage"], "total_tokens": item["usage"]["prompt_tokens"] + item["usage"]["completion_tokens"]})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _transcribe(self, request: web.Request) -> web.Response:
        """Speech to text: the next of ``transcripts`` (a str, the whole answer as a dict, or an
        Error to fail with)."""
        form = await request.post()
        upload = form.get("file")
        self.transcriptions.append({"model": form.get("model"), "language": form.get("language"),
                                    "filename": getattr(upload, "filename", None),
                                    "data": upload.file.read() if hasattr(upload, "file") else None})
        item = self.transcripts.pop(0) if self.transcripts else "(no transcript scripted)"
        item = await _waited(item)
        if isinstance(item, Error):
            return _error_response(item)
        return web.json_response(item if isinstance(item, dict) else {"text": item})

    async def _models(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") == "Bearer wrong-key":  # a key the server refuses
            return web.json_response({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
                                     status=401)
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "fake"} for name in self.models]})

    async def _speak(self, request: web.Request) -> web.Response:
        """Text to speech: the next of ``speeches`` (bytes, an Error or delayed(...)), else a real
        OGG/Opus file of 20 ms of silence."""
        from tests.media_files import ogg_opus

        self.speech_requests.append(await request.json())
        self.request_event.set()
        item = self.speeches.pop(0) if self.speeches else ogg_opus()
        item = await _waited(item)
        if isinstance(item, Error):
            return _error_response(item)
        return web.Response(body=item, content_type="audio/ogg")

    async def _chat(self, request: web.Request) -> web.Response:
        self.raw_requests.append(await request.json())
        body = without_times(await request.json())
        self.requests.append(body)
        self.request_event.set()
        item = self._script.pop(0) if self._script else self.fallback
        if callable(item):
            item = item(body)
        item = await _waited(item)
        if self.cache is not None and isinstance(item, dict):
            item = {**item, "usage": {**item["usage"], **self.cache.usage(self.raw_requests[-1])}}
        if isinstance(item, Raw):
            return web.Response(text=item.body, status=item.status, content_type=item.content_type)
        if isinstance(item, Error):
            return _error_response(item)
        if item == HANG_UP:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=499)  # never reaches the client
        if body.get("stream"):
            try:
                return await self._stream(request, body, item)
            except ConnectionResetError:  # the client went away mid-stream (/stop, shutdown)
                return web.Response(status=499)
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": item["message"], "finish_reason": item.get("finish_reason") or
                         ("tool_calls" if item["message"].get("tool_calls") else "stop")}],
            "usage": {**item["usage"], "total_tokens": item["usage"]["prompt_tokens"] + item["usage"]["completion_tokens"]},
        })


async def _waited(item: Any) -> Any:
    """A ``delayed(...)`` item after its delay, an async function's answer once it is given; any
    other as it is."""
    if inspect.isawaitable(item):
        return await item
    if isinstance(item, Delayed):
        await asyncio.sleep(item.seconds)
        return item.item
    return item


def _error_response(error: Error) -> web.Response:
    return web.json_response({"error": {"message": error.message, "type": error.code or "scripted", "code": error.code,
                                        "param": error.param}}, status=error.status, headers=error.headers)
