"""``$NANOBOT_HOME/api.sock``: how ``nanobot agent`` reaches a running gateway of its home.

The socket is 0600 in the 0700 home, so whoever can open it is the owner: its turns are the
terminal's chats (``cli:SESSION``), run by the gateway's dispatcher with everything already
loaded, so a one-shot ``nanobot agent -m`` needs no model SDK or sandbox of its own. The
requests are the API's (``/v1/chat/completions``), without a key.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING

from aiohttp import web

from nanobot.api.channel import ApiChannel
from nanobot.agent.commands import MODES
from nanobot.api.server import ApiError, answer, errors, last_user_text, read_body
from nanobot.bus import InboundMessage
from nanobot.listener import Listener
from nanobot.terminal_client import PIPED, PIPED_HEADER, SOCKET

if TYPE_CHECKING:
    from nanobot.api.front_door import FrontDoor

log = logging.getLogger(__name__)

SESSION = re.compile(r"[A-Za-z0-9_.:-]{1,80}")


class TerminalSocket:
    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.path = door.home / SOCKET
        self.channel = ApiChannel(door, name="cli")
        self.app = web.Application(middlewares=[errors])
        self.listener = Listener(self.app, "the terminal's socket", timeout_s=door.http_timeout_s)

    async def start(self) -> None:
        self.door.add_internal_channel(self.channel)
        app = self.app
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/nanobot/gateway", self.about)
        app.router.add_post("/v1/nanobot/waiting", self.waiting)
        self.path.unlink(missing_ok=True)  # left by a gateway that was killed (the home lock says it is gone)
        old = os.umask(0o177)
        try:
            await self.listener.start_unix(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        await self.listener.stop()
        self.path.unlink(missing_ok=True)

    async def about(self, request: web.Request) -> web.Response:
        """Which config file this gateway runs with: ``nanobot agent`` hands it a message only
        when it would itself read the same file."""
        source = self.door.config.source
        return web.json_response({"config": str(source) if source else None, "pid": os.getpid()})

    async def waiting(self, request: web.Request) -> web.Response:
        """What arrived in a terminal chat while nobody was there (past position ``?after=``, what
        this terminal showed already), and its last position; seen from now on: the mark is a
        message of the chat (``seen``), written by whichever worker holds it, a moment later."""
        session = _terminal_session(request)
        messages, upto = (await self.door.open_chat(session)).waiting_since(request.query.get("after", ""))
        if messages:
            await self.channel.ctx.accept([InboundMessage(self.channel.name, session.partition(":")[2], "owner",
                                                          str(upto), source="seen")])
        return web.json_response({"messages": messages, "upto": upto})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request, 1024)
        session = _terminal_session(request)
        mode = request.headers.get("X-Nanobot-Mode") or None
        if mode is not None and mode not in MODES:
            raise ApiError(400, "X-Nanobot-Mode must be tools, code or hybrid", "invalid_mode")
        piped = PIPED if request.headers.get(PIPED_HEADER) else None  # the owner's socket: theirs to say
        return await answer(request, self.channel, "owner", session.partition(":")[2],
                            last_user_text(body.get("messages")), stream=bool(body.get("stream")),
                            usage=self.door.usage, mode=mode, untrusted=piped)


def _terminal_session(request: web.Request) -> str:
    session = request.headers.get("X-Nanobot-Session", "cli:default")
    if not SESSION.fullmatch(session) or not session.startswith("cli:"):
        raise ApiError(400, "X-Nanobot-Session must be a terminal session, cli:NAME", "invalid_session")
    return session
