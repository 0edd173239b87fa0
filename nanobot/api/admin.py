"""The owner's pages' data: status and notices, cron jobs (enable, disable, run now, remove, recent
runs), pairing requests (approve, deny, revoke an approval) and usage per day. Owner keys only;
a change is a POST with the key in the Authorization header, which another site cannot make a
browser send.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Awaitable, Callable

from aiohttp import web

from nanobot.cron.schedule import in_words
from nanobot.listener import BadBody, read_json

if TYPE_CHECKING:
    from nanobot.api.front_door import FrontDoor

DAYS = 30
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminRoutes:
    def __init__(self, door: FrontDoor, owner_only: Callable[[web.Request], Awaitable[None]]) -> None:
        self.door = door
        self.owner_only = owner_only  # raises the API's 401/403 unless the request has an owner key

    def add_to(self, app: web.Application) -> None:
        for method, path, handler in (
                ("GET", "/v1/nanobot/status", self.status),
                ("GET", "/v1/nanobot/cron", self.cron), ("POST", "/v1/nanobot/cron/{job}/{action}", self.cron_action),
                ("GET", "/v1/nanobot/pairing", self.pairing),
                ("POST", "/v1/nanobot/pairing/{action}", self.pairing_action),
                ("GET", "/v1/nanobot/usage", self.usage)):
            app.router.add_route(method, path, self._guarded(handler))

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            await self.owner_only(request)
            return await handler(request)

        return guarded

    async def status(self, request: web.Request) -> web.Response:
        """Channels, MCP servers, the shell, the database, tasks, disk; and the notices of the last
        30 days (an owner with the page alone gets them nowhere else)."""
        notices = [{"at": datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds"), "text": text,
                    "id": at}  # (news counts those after the newest one the page showed)
                   for at, text in await self.door.notices.latest()]
        return web.json_response({"lines": await self.door.status_lines(), "notices": notices})

    # ---- cron ---------------------------------------------------------------------------
    async def cron(self, request: web.Request) -> web.Response:
        store = self.door.cron
        jobs = []
        for job in await store.list():
            runs = await store.runs(job.id, limit=5)
            jobs.append({"id": job.id, "name": job.name, "schedule": in_words(job.schedule_kind, job.expression),
                         "timezone": job.timezone, "kind": job.payload_kind, "payload": job.payload,
                         "made_in": job.owner_session,
                         "enabled": job.enabled, "target": job.target, "last_status": job.last_status,
                         "next_run": job.next_run_at.isoformat() if job.next_run_at else None,
                         "runs": [{"started": r.started_at.isoformat(timespec="seconds"), "status": r.status,
                                   "output": r.output_excerpt} for r in runs]})
        return web.json_response({"jobs": jobs})

    async def cron_action(self, request: web.Request) -> web.Response:
        job_id, action = request.match_info["job"], request.match_info["action"]
        store = self.door.cron
        if await store.get(job_id) is None:
            raise web.HTTPNotFound()
        if action in ("enable", "disable"):
            await store.set_enabled(job_id, action == "enable")
            return web.json_response({"ok": True})
        if action == "remove":  # its runs stay, as with nanobot cron remove
            await store.remove(job_id)
            return web.json_response({"ok": True})
        if action == "run":
            try:
                run = await self.door.run_cron_now(job_id)
            except TimeoutError as exc:  # the clock is busy or stopping: the request stays queued
                return web.json_response({"error": str(exc)}, status=504)
            return web.json_response({"status": run.status, "output": run.output_excerpt})
        raise web.HTTPNotFound()

    # ---- pairing ------------------------------------------------------------------------
    async def pairing(self, request: web.Request) -> web.Response:
        store = self.door.pairing
        return web.json_response({
            "pending": [{"code": r.code, "channel": r.channel, "sender_id": r.sender_id, "sender_name": r.sender_name}
                        for r in await store.pending()],
            "paired": [{"channel": u.channel, "sender_id": u.sender_id, "sender_name": u.sender_name}
                       for u in await store.paired()]})

    async def pairing_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        body = await read_json(request, 4096) if request.can_read_body else {}
        store = self.door.pairing
        if action == "revoke":  # an approval taken back (they may ask again), as nanobot pairing revoke
            channel, sender = (body.get(k) if isinstance(body, dict) else None for k in ("channel", "sender_id"))
            if not isinstance(channel, str) or not isinstance(sender, str):
                raise BadBody(400, 'the body must be {"channel": "...", "sender_id": "..."}')
            if not await store.revoke(channel, sender):
                raise web.HTTPNotFound()
            return web.json_response({"ok": True})
        code = body.get("code") if isinstance(body, dict) else None
        if not isinstance(code, str):
            raise BadBody(400, 'the body must be {"code": "..."}')
        if action not in ("approve", "deny"):
            raise web.HTTPNotFound()
        try:
            await (store.approve(code) if action == "approve" else store.deny(code))
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error",
                                                "param": None, "code": "no_such_code"}}, status=404)
        return web.json_response({"ok": True})

    # ---- usage --------------------------------------------------------------------------
    async def usage(self, request: web.Request) -> web.Response:
        """Calls, tokens and cost per day for the last 30 days, in the configured time zone."""
        usage = self.door.usage
        days = await usage.per_day(self.door.config.agents.defaults.timezone, DAYS)
        top = await usage.top_chats(time.time() - DAYS * 86400)
        return web.json_response({"days": days, "top_chats": top})
