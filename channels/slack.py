"""Slack adapter: slack-bolt's ``AsyncApp`` receives, slack_sdk's ``AsyncWebClient`` sends.

Two ways in, as ``channels.slack`` says:
- **Socket Mode** (``appToken``): Slack pushes events over a WebSocket that one worker holds
  at a time (a singleton, taken over like Discord's connection); no public URL needed.
- **Events API** (``events``): Slack posts each event to our listener on every worker; bolt
  checks the signature (``v0:timestamp:body``, HMAC-SHA256 with ``signingSecret``) and refuses
  timestamps older than five minutes.

Either way the app runs with ``process_before_response``: an event is acknowledged only once
it is recorded by the durable intake, so a crash or a database outage makes Slack send it
again; its ``channel:ts`` (the same for a retry, and for the ``message`` and ``app_mention``
events of one message) drops the repeat.

Chats: a DM is ``slack:<channel>``; in a channel the bot answers in the message's thread, and
the thread is its own chat, ``slack:<channel>:<thread ts>``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from nanobot.channel_plugin import BaseChannel, ChannelContext, LastRead, SendFailed, Sender, safe_filename, send_parts
from nanobot.chat_commands import as_chat_message, picked
from nanobot_channels.slack_http import fetch_file, proxy_for, token_may_go_to, without_env_proxy
from nanobot_channels.slack_where import target, ts_order, where
from nanobot_channels.slack_working import WorkingMarks
from nanobot_channels.slack_format import MAX_TEXT, markdown_to_mrkdwn, mrkdwn_chunks, pick_blocks
from nanobot.message_context import noting_lost
from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.config import SlackConfig
from nanobot.config.slack_app import lacking_scopes
from nanobot.eventloop import ChatLocks
from nanobot.listener import BadBody, Listener, read_body

log = logging.getLogger(__name__)
# Bolt warns at every start that the client's token "will be ignored" since ``authorize`` is
# given: it is on purpose (see __init__), and an operator reading it would doubt the token.
_BOLT_LOG = log.getChild("bolt")
_BOLT_LOG.addFilter(lambda record: "will be ignored" not in record.getMessage())

DEFAULT_API_BASE = "https://slack.com/api/"
SOCKET = "slack socket mode"  # the singleton: one worker holds the WebSocket
PING_S = 10.0  # slack_sdk pings the WebSocket this often, and reconnects a dead one at the next ping
WATCH_S = 2.0  # how often the held WebSocket's state is looked at (for status)
CONNECT_S = 20.0  # slack_sdk retries a failing first connection forever: ours gives up after this
MESSAGE_SUBTYPES = (None, "file_share", "thread_broadcast")  # what a person wrote; not edits, joins, bots
MAX_EVENT_BYTES = 1024 * 1024
MISSED_MAX = 200  # messages read per chat at a catch-up (one page: the latest ones when more came)
THREAD_MESSAGES = 50  # of a thread the bot is called into, read with the call (the first ones)
THREAD_LINE_CHARS = 2000  # of each of them
# A link in a reply is not unfurled: Slack would fetch it at once, so a reply a web page steered
# could hand what the chat knows to an address in a link, with nobody clicking it.
NO_UNFURL = {"unfurl_links": False, "unfurl_media": False}


class SlackChannel(BaseChannel):
    name = "slack"
    max_message_len = MAX_TEXT

    def __init__(self, config: SlackConfig, ctx: ChannelContext, *, ping_s: float = PING_S,
                 watch_s: float = WATCH_S) -> None:
        super().__init__(config, ctx)
        self.config: SlackConfig = config
        self.ping_s, self.watch_s = ping_s, watch_s
        self.api_base = config.api_base or DEFAULT_API_BASE
        self.proxy = proxy_for(self.api_base)
        self.client = without_env_proxy(self.proxy, AsyncWebClient(
            token=config.bot_token, base_url=self.api_base, proxy=self.proxy,
            retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=2)]))
        # ``authorize``: what auth.test said at start. Bolt's default asks Slack again through a
        # client of its own, which takes its proxy from the environment whatever NO_PROXY says.
        self.app = AsyncApp(client=self.client, signing_secret=config.signing_secret or None,
                            process_before_response=True, logger=_BOLT_LOG, authorize=_authorized_as(self),
                            request_verification_enabled=config.events is not None)
        self.app.event("message")(self._on_event)
        self.app.event("app_mention")(self._on_event)
        self.app.command(re.compile("/"))(self._on_command)  # every slash command the app has
        self.app.action(re.compile("^pick-"))(self._on_pick)  # a button of pick_blocks pressed
        self.bot_user = ""  # our user id, from auth.test: mentions of it address the bot
        self.team: str | None = None  # our workspace's id, from auth.test
        events = web.Application(client_max_size=MAX_EVENT_BYTES)  # with channels.slack.events
        events.router.add_post(config.events.path if config.events else "/", self._http_event)
        self.events = Listener(events, "channels.slack.events.listen", timeout_s=ctx.http_timeout_s)
        self._previews: dict[Any, tuple[str, str]] = {}  # stream_id -> (channel, ts) of the growing message
        self._chat_locks = ChatLocks()
        self.working = WorkingMarks(self.client)  # 👀 while a turn runs: Slack has no typing indicator for bots
        # Where each chat was read up to: Slack gives up on an event after a few retries, so what
        # came while no worker listened is read from the chats' history (``_catch_up``).
        self._read = LastRead(ctx.store, lambda: f"{self.name} {self.team} {self.bot_user}", ts_order)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        try:
            me = await self.client.auth_test()
            self.bot_user, self.team = me["user_id"], me.get("team_id")
            if lacking := lacking_scopes(me.headers):  # what needs them fails later, one way or another
                log.warning("slack: the bot token lacks %s: add them to the app and reinstall it", ", ".join(lacking))
        except (SlackApiError, aiohttp.ClientError, OSError) as exc:
            trouble = "the bot token was not accepted at {}" if isinstance(exc, SlackApiError) else "{} is unreachable"
            raise RuntimeError(f"slack: {trouble.format(self.api_base)} ({_reason(exc)})") from None
        if self.config.events is not None:
            await self.events.start(*self.config.events.address())
            log.info("slack: taking events on %s (signed requests only)", self.config.events.listen)
            self.receiving.run(self._catch_up(), name="slack catch-up")
            return
        first = None  # the first round, on the connection made here
        if await self.ctx.singletons.try_hold(SOCKET) is None:
            log.info("slack: another worker holds the Socket Mode connection; this one sends, and takes over")
        else:
            first = self._socket_round(await self._connect_socket())  # its errors fail start(), with their reason
        self.read_while_held(SOCKET, self._socket_round, first)

    async def _connect_socket(self) -> AsyncSocketModeHandler:
        """The WebSocket, or RuntimeError with the reason. slack_sdk's own connect retries every
        failure forever (a refused app token too, with a traceback each time): the token is
        tried first here, and the connection gets ``CONNECT_S``."""
        try:
            await self.client.apps_connections_open(app_token=self.config.app_token)
        except (SlackApiError, aiohttp.ClientError, OSError) as exc:
            raise _not_connected(exc) from None
        handler = AsyncSocketModeHandler(self.app, self.config.app_token, ping_interval=self.ping_s, proxy=self.proxy)
        without_env_proxy(self.proxy, handler.client)
        try:
            async with asyncio.timeout(CONNECT_S):
                await handler.connect_async()
        except BaseException as exc:  # cancelled (the gateway stops) included: nothing is left open
            await handler.close_async()
            if not isinstance(exc, Exception):
                raise
            raise _not_connected(exc) from None
        return handler

    async def _socket_round(self, handler: AsyncSocketModeHandler | None = None) -> None:
        """The WebSocket while this worker holds it (slack_sdk reconnects a dropped one itself)."""
        handler = handler or await self._connect_socket()
        try:
            self._report(None)
            self.receiving.run(self._catch_up(), name="slack catch-up")  # a failure there keeps the socket
            await self._watch(handler)
        finally:  # the next holder's connection must be the only one
            await handler.close_async()

    async def _watch(self, handler: AsyncSocketModeHandler) -> None:
        """While this worker holds the WebSocket: status says when it is down (slack_sdk
        reconnects it on its own) and when it is back."""
        down = False
        while True:
            await asyncio.sleep(self.watch_s)
            connected = await handler.client.is_connected()
            if connected == down:
                down = not connected
                self._report("Socket Mode is disconnected, reconnecting" if down else None)

    async def stop(self) -> None:
        await self.stop_receiving()
        await self.events.stop()

    # -- incoming ------------------------------------------------------------------------
    async def _http_event(self, request: web.Request) -> web.Response:
        """An Events API request: bolt verifies it, runs ``_on_event``, answers (401 unsigned)."""
        try:
            await read_body(request, MAX_EVENT_BYTES)  # in time, or the connection is let go (bolt reads it again)
        except BadBody as exc:
            return web.Response(status=exc.status, text=str(exc))
        response = await to_aiohttp_response(await self.app.async_dispatch(await to_bolt_request(request)))
        if response.status == 401:
            log.info("slack events: refused a request from %s without a valid signature", request.remote)
        return response

    async def _on_event(self, ack: Any, event: dict[str, Any]) -> None:
        """Recorded first, then acknowledged: an exception (the store down) leaves the event
        unacknowledged, and Slack sends it again."""
        async with self._chat_locks.hold(str(event.get("channel"))):
            await self._intake(event)
        await ack()

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        """A slash command (``/nanobot new``, ``/nanobot what is on today?``): a message in the
        user's DM with the bot, wherever it was typed (Slack takes every message that starts
        with "/" as a command of its own). Only the user sees where it went."""
        user = str(command.get("user_id") or "")
        try:
            dm = (await self.client.conversations_open(users=user))["channel"]["id"]
        except (SlackApiError, aiohttp.ClientError, OSError) as exc:
            log.warning("slack: could not open a DM with %s for a slash command: %s (the app needs the im:write "
                        "scope)", user, _reason(exc))
            return await ack(text="I could not open a direct message with you: please write to me there.")
        text = as_chat_message(str(command.get("command") or ""), str(command.get("text") or ""))
        async with self._chat_locks.hold(dm):
            await self._handle(InboundMessage(self.name, dm, user, text, is_private=True,
                                              delivery_key=f"{dm}:{command.get('trigger_id')}"))
        # In the DM the command stays shown above the answer; elsewhere the user alone is told.
        await ack(**({"response_type": "in_channel"} if command.get("channel_id") == dm else
                     {"text": "I answer in our direct messages."}))

    async def _on_pick(self, ack: Any, body: dict[str, Any]) -> None:
        """A button under one of our answers pressed (``/mode code``): that command, from whoever
        pressed it (Slack vouches for the user id), in the chat of the message it is under."""
        await ack()
        action, message = (body.get("actions") or [{}])[0], body.get("message") or {}
        user, channel, command = (body.get("user") or {}).get("id"), (body.get("channel") or {}).get("id"), \
            picked(str(action.get("value") or ""))
        if user and channel and command:
            is_private = channel.startswith("D")
            thread = message.get("thread_ts") or (None if is_private else message.get("ts"))
            chat_id = channel if is_private else f"{channel}:{thread}"
            await self._handle(InboundMessage(self.name, chat_id, user, command, is_private=is_private,
                                              delivery_key=f"{channel}:{body.get('trigger_id')}",
                                              reply_context={"message_id": thread} if thread and is_private else None),
                               mentioned=True)

    async def _intake(self, event: dict[str, Any]) -> None:
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not user or not channel or not ts or event.get("bot_id") or user == self.bot_user \
                or event.get("subtype") not in MESSAGE_SUBTYPES:
            return  # never answer ourselves or other bots: two bots can loop forever
        is_private = event.get("channel_type") == "im" or channel.startswith("D")
        text = event.get("text") or ""
        mentioned = event.get("type") == "app_mention" or f"<@{self.bot_user}>" in text
        if not is_private and self.config.group_policy == "allowlist":
            if channel not in self.config.group_allow_from:
                return
            mentioned = True  # a listed channel: every message is for the bot
        if not self._addressed(is_private, mentioned):
            return  # checked before any download
        chat_id = channel if is_private else f"{channel}:{event.get('thread_ts') or ts}"
        who = Identity(user)  # Slack vouches for the user id; names are anyone's to set
        sender = Sender(self.name, chat_id, who, is_private)
        files = event.get("files") or []
        media = await self._download(files, await self.chat_root(sender)) if files and await self._may_download(who) \
            else []
        text, untrusted = re.sub(rf"<@{self.bot_user}>", "", text).strip(), None
        if event.get("thread_ts") not in (None, ts) and await self._may_download(who):
            text, untrusted = await self._after_thread(event, chat_id, text)
        thread = event.get("thread_ts") if is_private else None  # a DM's thread: answered in it
        if await self._handle(InboundMessage(
                self.name, chat_id, who.id, noting_lost(text, len(files), media), media=media, is_private=is_private,
                delivery_key=f"{channel}:{ts}", untrusted=untrusted,
                reply_context={"message_id": thread} if thread else None),
                mentioned=mentioned):
            await self._read.note(chat_id, ts)
            self.working.heard(chat_id, channel, ts)

    async def _after_thread(self, event: dict[str, Any], chat_id: str, text: str) -> tuple[str, str | None]:
        """A message in a thread after what the thread said before it that this chat has not read
        (all of it, the first time): "@bot sum this thread up" needs it. Allowed people's words
        only (a stranger's never reach the model); others' mark the turn."""
        thread, ts, since = event["thread_ts"], str(event["ts"]), dict(await self._read.chats_to_read()).get(chat_id)
        try:
            answer = await self.client.conversations_replies(channel=event["channel"], ts=thread, limit=THREAD_MESSAGES,
                                                              **({"oldest": since} if since else {}))
        except (SlackApiError, aiohttp.ClientError, OSError) as exc:  # a scope not granted: the message alone
            log.info("slack: could not read the thread %s: %s", thread, exc)
            return text, None
        earlier = sorted((m for m in answer.get("messages") or [] if ts_order(str(m.get("ts"))) < ts_order(ts)
                          and m.get("user") not in (None, self.bot_user) and str(m.get("text") or "").strip()),
                         key=lambda m: ts_order(str(m.get("ts"))))
        allowed = {user for user in {m["user"] for m in earlier} if await self._may_download(Identity(user))}
        earlier = [m for m in earlier if m["user"] in allowed]
        if not earlier:
            return text, None
        lines = "\n".join(f"<@{m['user']}>: {str(m['text'])[:THREAD_LINE_CHARS]}" for m in earlier)
        others = any(m.get("user") != event["user"] for m in earlier)
        return f"[the thread so far:\n{lines}]\n{text}", "a thread's earlier messages" if others else None

    async def _catch_up(self) -> None:
        """What each chat heard from lately got while no worker listened, oldest first (a
        repeat of what was recorded is dropped by the intake)."""
        unread: list[str] = []
        for chat_id, after in await self._read.chats_to_read():
            channel, thread = target(chat_id)
            try:
                answer = await (self.client.conversations_replies(channel=channel, ts=thread, oldest=after,
                                                                  limit=MISSED_MAX) if thread else
                                self.client.conversations_history(channel=channel, oldest=after, limit=MISSED_MAX))
            except (SlackApiError, aiohttp.ClientError, OSError) as exc:  # a scope not granted, a chat gone
                unread.append(f"{chat_id} ({_reason(exc)})")
                continue
            missed = [m for m in answer.get("messages") or [] if ts_order(m.get("ts") or "0") > ts_order(after)]
            for message in sorted(missed, key=lambda m: ts_order(m["ts"])):
                async with self._chat_locks.hold(channel):
                    await self._intake({**message, "channel": channel})  # as the event would have had it
        if unread:
            log.warning("slack: could not read what %d chat(s) got while away: %s", len(unread), ", ".join(unread[:3]))

    async def _download(self, files: list[dict[str, Any]], root: Path) -> list[str]:
        """Root-relative paths of the files fetched (with the bot token, from Slack's file host only)."""
        paths = []
        limit = self.ctx.max_media_bytes
        for file in files:
            url = file.get("url_private_download") or file.get("url_private") or ""
            name = safe_filename(file.get("name") or "file")
            if int(file.get("size") or 0) > limit or not token_may_go_to(url, self.api_base):
                log.warning("slack: skipped file %s (over %d bytes, or not on Slack's file host)", name, limit)
                continue
            try:
                data = await fetch_file(url, self.config.bot_token, limit)
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                log.warning("slack: could not download %s: %s", name, exc)
                continue
            paths.append(await self._keep(root, safe_filename(str(file.get("id") or "")), name, data))
        return [p for p in paths if p]

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        if not msg.content.strip():
            return
        channel, thread = where(msg)
        preview = self._previews.pop(msg.stream_id, None)  # the streamed message takes the first chunk
        chunks = mrkdwn_chunks(msg.content)
        parts = [partial(self._post, channel, thread, chunk) for chunk in chunks]
        if msg.offer:  # the last part with buttons to pick from
            parts[-1] = partial(parts[-1], blocks=pick_blocks(chunks[-1], msg.offer))
        await send_parts(msg, [partial(parts[0], preview=preview), *parts[1:]])
        await self.working.answered(msg.chat_id)

    async def _post(self, channel: str, thread: str | None, text: str, preview: tuple[str, str] | None = None,
                    blocks: list[dict[str, Any]] | None = None) -> None:
        """A message, or the streamed ``preview`` edited to be it."""
        shown = {"blocks": blocks} if blocks else {}
        if preview is None or not await self._call("chat_update", channel=preview[0], ts=preview[1], text=text,
                                                   quiet=True, **shown):
            await self._call("chat_postMessage", channel=channel, thread_ts=thread, text=text, **NO_UNFURL, **shown)

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far, in one message: posted once, then edited (about once a second)."""
        if not msg.content.strip():
            return
        channel, thread = where(msg)
        text = markdown_to_mrkdwn(msg.content[:MAX_TEXT - 2] + (" …" if len(msg.content) > MAX_TEXT else ""))
        preview = self._previews.get(msg.stream_id)
        if preview is None:
            posted = await self._call("chat_postMessage", channel=channel, thread_ts=thread, text=text, quiet=True,
                                      **NO_UNFURL)
            if posted:
                self._previews[msg.stream_id] = (posted["channel"], posted["ts"])
        else:
            await self._call("chat_update", channel=preview[0], ts=preview[1], text=text, quiet=True)

    async def send_file(self, msg: OutboundMessage) -> None:
        """An upload into the chat (its thread), the caption as its comment."""
        if msg.file is None:
            return
        channel, thread = where(msg)
        await self._call("files_upload_v2", channel=channel, thread_ts=thread, file=msg.file.data,
                         filename=msg.file.name, initial_comment=markdown_to_mrkdwn(msg.content) or None)
        await self.working.answered(msg.chat_id)

    async def send_typing(self, chat_id: str) -> None:
        await self.working.working(chat_id)  # Slack shows no typing indicator for a bot's messages

    async def _call(self, method: str, *, quiet: bool = False, **arguments: Any) -> Any:
        """A Web API call. SendFailed when it did not go (retry: a 5xx, a 429 left over, no
        connection; not: Slack refused it). ``quiet``: a stream preview, not worth a retry."""
        try:
            return await getattr(self.client, method)(**{k: v for k, v in arguments.items() if v is not None})
        except (SlackApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            status = exc.response.status_code if isinstance(exc, SlackApiError) else None
            if quiet:
                log.debug("slack: %s to %s failed: %s", method, arguments.get("channel"), _reason(exc))
                return None
            raise SendFailed(f"slack: {method} to {arguments.get('channel')} failed: {_reason(exc)}",
                             retry=status is None or status >= 500 or status == 429) from exc


def _reason(exc: BaseException) -> str:
    """Slack's error code ("invalid_auth"), or what went wrong with the connection."""
    return exc.response["error"] if isinstance(exc, SlackApiError) else f"{type(exc).__name__}: {exc}"


def _not_connected(exc: BaseException) -> RuntimeError:
    reason = f"no connection within {CONNECT_S:g} s" if isinstance(exc, TimeoutError) else _reason(exc)
    return RuntimeError(f"slack: Socket Mode did not connect ({reason}); check channels.slack.appToken")


def _authorized_as(channel: SlackChannel) -> Callable[..., Awaitable[AuthorizeResult]]:
    """Bolt's ``authorize``: the bot as auth.test described it at start (a plain function: bolt
    passes arguments by the names it finds in the signature)."""
    async def authorize(team_id: str | None) -> AuthorizeResult:
        return AuthorizeResult(enterprise_id=None, team_id=team_id or channel.team, bot_user_id=channel.bot_user,
                               bot_token=channel.config.bot_token)
    return authorize
