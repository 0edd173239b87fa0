"""A stand-in for ``signal-cli daemon --http`` on 127.0.0.1, speaking as signal-cli 0.13 does
(read from its ``HttpServerHandler``): ``GET /api/v1/check``, ``GET /api/v1/events`` (Server-Sent
Events: ``event: receive`` and ``data: {"account", "envelope"}``, ``:`` keep-alives) and
``POST /api/v1/rpc`` (JSON-RPC 2.0).

Usage::

    async with FakeSignalCli("+15550001111", attachments=tmp_path) as signal:
        config = {"account": signal.account, "rpcUrl": signal.url, "attachmentsDir": str(tmp_path)}
        signal.push("+15550002222", "hi")                  # a direct message
        signal.push("+15550002222", "hi all", group="G1", mention=True)
        sent = await signal.wait_sent(1)                   # the params of each ``send``

- Messages pushed while no stream is open wait for the next one (as they wait at Signal's
  server while signal-cli, run with ``--receive-mode on-connection``, has no listener);
  ``drop_streams()`` cuts the open ones.
- ``push(..., attachments={"name": bytes})`` stores them in the attachments folder, as
  signal-cli does, and names them in the envelope; ``source_name`` is the sender's profile name.
- ``refuse`` (a set of numbers): ``send`` to them answers a JSON-RPC error; ``up = False``:
  ``/api/v1/check`` answers 503.
- A number is held by one account (UUID) at a time, as Signal's directory says: the last that
  wrote with it, or one ``recycle()`` names. ``reached``: the accounts each send went to (a
  recipient named by number reaches whoever holds the number then).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes.ticks import Ticks
from tests.fakes.loopback import serve


class FakeSignalCli(Ticks):
    def __init__(self, account: str, attachments: Path) -> None:
        super().__init__()
        self.account = account
        self.attachments = attachments
        self.sent: list[dict[str, Any]] = []  # params of each "send"
        self.calls: list[str] = []
        self.refuse: set[str] = set()
        self.up = True
        self.streams_opened = 0
        self.holders: dict[str, str] = {}  # number -> the account that holds it now
        self.reached: list[list[str]] = []  # the accounts each "send" went to
        self._waiting: list[dict[str, Any]] = []
        self._streams: list[asyncio.Queue[dict[str, Any] | None]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeSignalCli:
        app = web.Application()
        app.router.add_get("/api/v1/check", self._check)
        app.router.add_get("/api/v1/events", self._events)
        app.router.add_post("/api/v1/rpc", self._rpc)
        self._runner, self.port = await serve(app, self.port, access_log=None, handler_cancellation=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.drop_streams()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- the test's side ------------------------------------------------------------
    def push(self, number: str, text: str, *, group: str | None = None, mention: bool = False,
             attachments: dict[str, bytes] | None = None, stored: list[str] = [], source_name: str = "Someone",
             timestamp: int | None = None, quote: dict[str, Any] | None = None,
             account: str | None = None, voice: bytes | None = None) -> dict[str, Any]:
        """A message from ``number`` (to a group with ``group``), as the next stream event.
        ``stored``: names already in the attachments folder, attached as they are; ``account``: the
        sender's UUID (by default one of the number's own); ``voice``: a voice note's audio (AAC,
        with no file name, as Signal's apps record them)."""
        message: dict[str, Any] = {"timestamp": timestamp or time.time_ns() // 1000, "message": text}
        if group:
            message["groupInfo"] = {"groupId": group, "type": "DELIVER"}
        if quote:  # what signal-cli says of the message this one replies to
            message["quote"] = {"id": 1, "authorUuid": f"uuid-{quote['authorNumber']}", **quote}
        if mention:
            message["message"] = "\ufffc " + text
            message["mentions"] = [{"name": self.account, "number": self.account, "uuid": "bot-uuid",
                                    "start": 0, "length": 1}]
        if attachments or stored:
            message["attachments"] = [self._store(name, data) for name, data in (attachments or {}).items()] + [
                {"contentType": "text/plain", "filename": name, "id": name, "size": 1} for name in stored]
        if voice is not None:
            message["attachments"] = [{**self._store(".aac", voice), "contentType": "audio/aac", "filename": None}]
        account = self.holders[number] = account or self.holders.get(number, f"uuid-{number}")
        envelope = {"source": number, "sourceNumber": number, "sourceUuid": account,
                    "sourceName": source_name, "sourceDevice": 1, "timestamp": message["timestamp"],
                    "dataMessage": message}
        self.push_envelope(envelope)
        return envelope

    def recycle(self, number: str, account: str) -> None:
        """The carrier gives ``number`` to someone who registers Signal with it: ``account``."""
        self.holders[number] = account

    def _accounts(self, recipients: Any) -> list[str]:
        """The accounts numbers or UUIDs name now."""
        return [self.holders.get(to, f"uuid-{to}") if to.startswith("+") else to for to in recipients]

    def push_envelope(self, envelope: dict[str, Any]) -> None:
        event = {"account": self.account, "envelope": envelope}
        if self._streams:
            for stream in self._streams:
                stream.put_nowait(event)
        else:
            self._waiting.append(event)

    def drop_streams(self) -> None:
        for stream in self._streams:
            stream.put_nowait(None)

    async def wait_sent(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        await self.wait_until(lambda: len(self.sent) >= count, timeout)
        return self.sent

    def _store(self, name: str, data: bytes) -> dict[str, Any]:
        stored = uuid.uuid4().hex + Path(name).suffix
        (self.attachments / stored).write_bytes(data)
        return {"contentType": "text/plain", "filename": name, "id": stored, "size": len(data)}

    def _ticked(self) -> None:
        self._tick.set()

    # ---- the daemon's side ----------------------------------------------------------
    async def _check(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.up else 503)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("account") not in (None, self.account):
            return web.Response(status=400, text="unknown account")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        stream: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        for event in self._waiting:
            stream.put_nowait(event)
        self._waiting.clear()
        self._streams.append(stream)
        self.streams_opened += 1
        self.ticked()
        try:
            await response.write(b":\n\n")  # signal-cli's keep-alive, also sent at once
            while (event := await stream.get()) is not None:
                await response.write(f"event: receive\ndata: {json.dumps(event)}\n\n".encode())
        finally:
            self._streams.remove(stream)
            while not stream.empty():  # not written yet: for the next stream
                if (left := stream.get_nowait()) is not None:
                    self._waiting.append(left)
        return response

    async def _rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        method, params = body["method"], body.get("params") or {}
        self.calls.append(method)
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": body.get("id")}
        if params.get("account") != self.account:
            answer["error"] = {"code": -32602, "message": "Specified account does not exist"}
        elif method == "send" and set(self._accounts(params.get("recipient") or [])) & set(self._accounts(self.refuse)):
            answer["error"] = {"code": -1, "message": "Failed to send message: Unregistered user"}
        elif method == "send":
            self.sent.append(params)
            self.reached.append(self._accounts(params.get("recipient") or []))
            answer["result"] = {"timestamp": time.time_ns() // 1000, "results": []}
        else:
            answer["result"] = {}
        self.ticked()
        return web.json_response(answer)
