"""Discord adapter: discord.py's ``Client`` running inside our loop, wired to the bus.

discord.py does the hard parts: gateway heartbeats, RESUME or re-IDENTIFY after a dropped
connection (with its own backoff), and 429 handling (it sleeps ``retry_after`` and retries).
We add what it leaves to us: who is talking and whether they addressed the bot, attachment
downloads, splitting replies at 2000 characters, and retrying other send failures.

A new session (a start, a re-IDENTIFY) replays nothing: what was sent while no worker was
connected is read at READY from each chat heard from lately, after the last message recorded
there (``_catch_up``; a repeat is dropped by the intake, as after a RESUME).

Limitation: discord.py keeps the REST base (``Route.BASE``) and the gateway URL
(``DiscordWebSocket.DEFAULT_GATEWAY``) as class attributes, so ``start()`` sets them for the
whole process: one Discord server (real or fake) per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from nanobot.channel_plugin import BaseChannel, ChannelContext, LastRead, SendFailed, Sender, send_parts
from nanobot.message_context import noting_lost, shared_poll, with_quote
from nanobot_channels.discord_commands import ONLY_HERE, answer, as_message, pick_buttons, register
from nanobot_channels.text import split_message, tables_as_code
from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.config import DiscordConfig
from nanobot.coordination import Held, run_while_held
from nanobot.eventloop import ChatLocks

log = logging.getLogger(__name__)

DEFAULT_API_BASE = "https://discord.com/api/v10"
DEFAULT_GATEWAY = "wss://gateway.discord.gg"
SHARD = "discord shard 0"  # the singleton: one worker holds the gateway connection at a time
MISSED_MAX = 200  # messages read per chat at a catch-up (two pages): what came after them is not


class _Client(discord.Client):
    """Forwards the events we care about to the channel."""

    def __init__(self, channel: DiscordChannel, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self._channel = channel

    def dispatch(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        if not self.is_closed():  # its "ready", delayed after a READY, came once close() had dropped the loop
            super().dispatch(event, *args, **kwargs)

    async def on_ready(self) -> None:
        log.info("discord: connected as %s (%s)", self.user, getattr(self.user, "id", "?"))
        self._channel._ready.set()
        self._channel.receiving.run(self._channel._catch_up(), name="discord catch-up")
        self._channel.receiving.run(register(self), name="discord slash commands")

    async def on_message(self, message: discord.Message) -> None:
        await self._channel._on_message(message)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        if interaction.type in (discord.InteractionType.application_command, discord.InteractionType.component):
            await self._channel._on_command(interaction)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # discord.py waits 5 s before each re-IDENTIFY (Discord's identify rate limit).
        if not initial:
            await asyncio.sleep(self._channel.reidentify_delay)


class DiscordChannel(BaseChannel):
    name = "discord"
    max_message_len = 2000
    def __init__(self, config: DiscordConfig, ctx: ChannelContext, *, ready_timeout: float = 30.0,
                 guild_ready_timeout: float = 0.5, retry_delays: Sequence[float] = (1.0, 2.0, 4.0),
                 reidentify_delay: float = 5.0) -> None:
        super().__init__(config, ctx)
        self.config: DiscordConfig = config
        self.ready_timeout = ready_timeout  # how long start() waits for READY
        # How long discord.py waits for more GUILD_CREATEs before on_ready (2 s by default): no cache is needed
        self.guild_ready_timeout = guild_ready_timeout
        # Pauses between attempts at a failed send (429s excluded: discord.py retries those itself).
        self.retry_delays = tuple(retry_delays)
        # Pause before a fresh IDENTIFY after an invalidated session (RESUMEs are immediate).
        self.reidentify_delay = reidentify_delay
        self._previews: dict[Any, discord.Message] = {}  # stream_id -> the message a reply streams into
        intents = discord.Intents.default()
        intents.message_content = True  # else guild messages arrive with empty content
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False  # no voice here: no warning
        self._client = _Client(
            self, intents=intents, guild_ready_timeout=self.guild_ready_timeout,
            # A reply pings only the person it answers: a web page or a member can make it name
            # anyone (<@id>, @everyone, a role), and naming is not a reason to notify them.
            allowed_mentions=discord.AllowedMentions(everyone=False, roles=False, users=False, replied_user=True))
        self._ready = asyncio.Event()
        self._chat_locks = ChatLocks()
        # Where each chat was read up to, per bot account (another bot's chats are not ours to read)
        self._read = LastRead(ctx.store, lambda: f"{self.name} {getattr(self._client.user, 'id', '')}", int)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        Route.BASE = (self.config.api_base or DEFAULT_API_BASE).rstrip("/")
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.config.gateway_url or DEFAULT_GATEWAY)
        try:
            await self._client.login(self.config.token)  # REST: every worker sends
        except Exception as exc:
            await self.stop()
            raise RuntimeError(f"discord: could not log in at {Route.BASE} ({type(exc).__name__}: {exc})") from exc
        held = await self.ctx.singletons.try_hold(SHARD)
        connection = self.receiving.run(self._connect_while_held(held), name="discord client")
        if held is None:
            log.info("discord: another worker holds the connection; this one sends, and takes over if it stops")
            return
        ready = asyncio.ensure_future(self._ready.wait())
        done, _ = await asyncio.wait({ready, connection}, timeout=self.ready_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            return
        ready.cancel()
        cause = connection.exception() if connection in done and not connection.cancelled() else None
        await self.stop()
        reason = f"{type(cause).__name__}: {cause}" if cause else f"no READY within {self.ready_timeout:g} s"
        if isinstance(cause, discord.PrivilegedIntentsRequired):  # the commonest first-start mistake
            reason = "its Message Content intent is off: Developer Portal, the app, Bot, Privileged Gateway Intents"
        raise RuntimeError(f"discord: could not connect to {Route.BASE} ({reason})") from cause

    async def _connect_while_held(self, held: Held | None) -> None:
        """The gateway connection (what receives messages), on one worker at a time."""
        client, singletons = self._client, self.ctx.singletons
        while not client.is_closed():
            if held is None:
                held = await singletons.hold(SHARD)
                log.info("discord: this worker now holds the connection")

            async def disconnect() -> None:  # the next holder's connection must be the only one
                if client.ws is not None and not client.is_closed():
                    await client.ws.close(code=1000)

            connect = await run_while_held(singletons, held, client.connect(), after=disconnect)
            if not connect.cancelled() and connect.exception() is not None:
                raise connect.exception()  # fatal (a bad token, a missing intent): logged as it ends
            held = None

    async def stop(self) -> None:
        try:
            await self._client.close()  # ends the gateway loop and the HTTP session
        except Exception:
            log.exception("discord: error while closing the client")
        await self.receiving.stop()

    # -- incoming ------------------------------------------------------------------------
    async def _on_message(self, message: discord.Message) -> None:
        # discord.py runs each on_message as its own task; a per-chat lock (FIFO) keeps a
        # chat's messages in order even when one of them waits on a download.
        async with self._chat_locks.hold(message.channel.id):
            await self._intake(message)

    async def _intake(self, message: discord.Message) -> None:
        me = self._client.user
        if me is None or message.author.id == me.id or message.author.bot:
            return  # never answer ourselves or other bots: two bots can loop forever
        is_private = isinstance(message.channel, discord.DMChannel)
        mentioned, who = _addresses(message, me.id), _identity(message.author, message.webhook_id)
        if not self._addressed(is_private, mentioned):  # no download for chatter: kept for the next that is for us
            return await self._overhear(str(message.channel.id), who, _words(message))
        # A forward is empty itself; the message it carries (someone else's words) is a snapshot.
        forwards = message.message_snapshots
        content = "\n\n".join(filter(None, [re.sub(rf"<@!?{me.id}>", "", _words(message)).strip(),
                                             *(snapshot.content.strip() for snapshot in forwards)]))
        attachments = [*message.attachments, *(a for snapshot in forwards for a in snapshot.attachments)]
        # A stranger's files never touch the disk: only admitted senders' attachments are fetched.
        allowed = await self._may_download(who)
        sender = Sender(self.name, str(message.channel.id), who, is_private)
        media, durations = await self._download(attachments, await self.chat_root(sender)) if allowed else ([], {})
        answered = message.reference.resolved if message.type == discord.MessageType.reply and message.reference \
            else None  # the message this one replies to, as Discord sent it along
        answered = answered if isinstance(answered, discord.Message) else None
        content, quoted = with_quote(noting_lost(content, len(attachments), media), answered and _words(answered),
                                     answered and str(answered.author.id), who.id, str(me.id))
        if await self._handle(InboundMessage(
                self.name, str(message.channel.id), who.id, content, sender_name=who.name, sender_handle=who.handle,
                media=media, is_private=is_private, delivery_key=str(message.id), durations=durations,
                reply_context=None if is_private else {"message_id": str(message.id)},  # answered as a reply
                untrusted="a forwarded message" if forwards else quoted), mentioned=mentioned):
            await self._read.note(str(message.channel.id), str(message.id))

    async def _on_command(self, interaction: discord.Interaction) -> None:
        """A slash command, or a button pressed: the chat message it stands for, addressed to the
        bot, answered in place of the "thinking…" Discord shows meanwhile (removed when nothing
        will answer)."""
        text = as_message(interaction)
        if text is None or interaction.channel_id is None:
            return await interaction.response.send_message(ONLY_HERE, ephemeral=True)
        if not text:  # a press of nothing we offered: taken for nothing
            return await interaction.response.defer()
        try:
            await interaction.response.defer(thinking=True)
        except discord.HTTPException as exc:  # too late (over 3 s): the answer is posted instead
            log.info("discord: could not take the slash command in time: %s", exc)
        who, taken = _identity(interaction.user), False
        try:
            async with self._chat_locks.hold(interaction.channel_id):
                taken = await self._handle(InboundMessage(
                    self.name, str(interaction.channel_id), who.id, text, sender_name=who.name,
                    sender_handle=who.handle, is_private=interaction.guild_id is None,
                    delivery_key=f"command {interaction.id}", reply_context={"interaction": interaction.token}),
                    mentioned=True)
        finally:  # not taken (a stranger's, or the store down): no "thinking…" left for 15 minutes
            if not taken and interaction.response.is_done():
                with contextlib.suppress(discord.HTTPException):
                    await interaction.delete_original_response()

    async def _catch_up(self) -> None:
        """What each chat heard from lately got while no worker was connected, oldest first."""
        for chat_id, after in await self._read.chats_to_read():
            try:
                channel = await self._client.fetch_channel(int(chat_id))
                if not isinstance(channel, discord.abc.Messageable):
                    continue
                missed = [m async for m in channel.history(after=discord.Object(int(after)), oldest_first=True,
                                                           limit=MISSED_MAX)]
            except discord.HTTPException as exc:  # a chat gone or closed to us: the others go on
                log.warning("discord: could not read what %s got while away: %s", chat_id, exc)
                continue
            if len(missed) == MISSED_MAX:
                log.warning("discord: %d or more messages came in %s while away; only the first %d are read",
                            MISSED_MAX, chat_id, MISSED_MAX)
            for message in missed:
                await self._on_message(message)

    async def _download(self, attachments: list[discord.Attachment], root: Path) -> tuple[list[str], dict[str, float]]:
        """(root-relative paths, seconds of each voice message)."""
        paths: list[str] = []
        durations: dict[str, float] = {}
        limit = self.ctx.max_media_bytes
        for att in attachments:
            if att.size > limit:
                log.warning("discord: skipped attachment %s (%d bytes > %d)", att.filename, att.size, limit)
                continue
            try:
                data = await att.read()
            except Exception as exc:
                log.warning("discord: could not download %s: %s", att.filename, exc)
                continue
            if len(data) > limit:  # the announced size was wrong
                continue
            if (kept := await self._keep(root, str(att.id), att.filename, data)) is None:
                continue
            paths.append(kept)
            if att.duration is not None:  # a voice message
                durations[kept] = float(att.duration)
        return paths, durations

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        if not msg.content.strip():
            return
        self._check_target(msg)
        preview = self._previews.pop(msg.stream_id, None)
        # A partial messageable needs no GET /channels and no cache: just the id.
        channel = self._client.get_partial_messageable(int(msg.chat_id))
        reference = _reference(msg, channel.id)
        chunks = split_message(tables_as_code(msg.content), self.max_message_len)
        buttons = [{}] * (len(chunks) - 1) + [pick_buttons(msg.offer)]  # under the last part
        first, *rest = [partial(self._send_chunk, channel, chunk, _nonce(msg, i), **buttons[i])
                        for i, chunk in enumerate(chunks)]
        first = partial(first, reference=reference, preview=preview)
        if token := (msg.reply_context or {}).get("interaction"):  # a slash command's answer
            first = partial(self._answer_command, token, chunks[0], first, **buttons[0])
        await send_parts(msg, [first, *rest])

    async def _answer_command(self, token: str, text: str, post: Callable[[], Awaitable[None]],
                              **view: discord.ui.View) -> None:
        if not await answer(self._client, token, text, self._client.allowed_mentions, **view):
            await post()

    def _check_target(self, msg: OutboundMessage) -> None:
        if not msg.chat_id.isdigit():
            raise SendFailed(f"discord: {msg.chat_id!r} is not a channel id", retry=False)
        if self._client.is_closed():
            raise SendFailed("discord: stopped", retry=True)

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far, in one message: sent once, then edited."""
        if self._client.is_closed() or not msg.chat_id.isdigit() or not msg.content.strip():
            return
        stream_id = msg.stream_id
        text = msg.content if len(msg.content) <= self.max_message_len else msg.content[:self.max_message_len - 2] + " …"
        preview = self._previews.get(stream_id)
        try:
            if preview is None:
                channel = self._client.get_partial_messageable(int(msg.chat_id))
                self._previews[stream_id] = await channel.send(text, suppress_embeds=True,
                                                               reference=_reference(msg, channel.id))
            elif preview.content != text:
                self._previews[stream_id] = await preview.edit(content=text)
        except Exception as exc:  # a missed preview is not worth a retry: the final text follows
            log.debug("discord: streaming to %s failed: %r", msg.chat_id, exc)

    async def _edit(self, message: discord.Message, text: str) -> bool:
        try:
            await message.edit(content=text)
            return True
        except Exception as exc:
            log.warning("discord: could not finish the streamed message: %r", exc)
            return False

    async def send_file(self, msg: OutboundMessage) -> None:
        """An attachment (Discord shows pictures inline), its caption as the message text."""
        file = msg.file
        if file is None:
            return
        self._check_target(msg)
        channel = self._client.get_partial_messageable(int(msg.chat_id))
        chunks = split_message(tables_as_code(msg.content), self.max_message_len) if msg.content.strip() else [None]
        def attach() -> dict[str, Any]:
            return {"content": chunks[0], "file": discord.File(io.BytesIO(file.data), filename=file.name),
                    "nonce": _nonce(msg, 0)}

        await send_parts(msg, [partial(self._post, channel, attach),
                               *(partial(self._send_chunk, channel, chunk, _nonce(msg, i))
                                 for i, chunk in enumerate(chunks[1:], start=1))])

    async def _send_chunk(self, channel: discord.PartialMessageable, chunk: str, nonce: str | None,
                          reference: discord.MessageReference | None = None,
                          preview: discord.Message | None = None, **view: discord.ui.View) -> None:
        """A message, or the streamed ``preview`` edited to be it."""
        if preview is None or not await self._edit(preview, chunk):
            await self._post(channel, lambda: {"content": chunk, "reference": reference, "nonce": nonce, **view})

    async def _post(self, channel: discord.PartialMessageable, message: Callable[[], dict[str, Any]]) -> None:
        """Send, retrying a few times what may pass soon; ``message`` makes the arguments afresh
        for each attempt (a discord.File is used up by a send). SendFailed when it did not go."""
        for delay in (*self.retry_delays, None):
            try:
                # No embeds: Discord fetches a link to preview it at once, so a reply a web page
                # steered could hand what the chat knows to an address in a link, unclicked.
                await channel.send(**message(), suppress_embeds=True)
                return
            except Exception as exc:  # the daemon must outlive any one failed reply
                permanent = isinstance(exc, discord.HTTPException) and 400 <= exc.status < 500
                if permanent or delay is None:
                    raise SendFailed(f"discord: send to {channel.id} failed: {exc!r}", retry=not permanent) from exc
                log.warning("discord: send to %s failed (%r), retrying in %g s", channel.id, exc, delay)
                await asyncio.sleep(delay)

    async def send_typing(self, chat_id: str) -> None:
        if self._client.is_closed():
            return
        try:
            await self._client.get_partial_messageable(int(chat_id)).typing()  # one POST .../typing
        except Exception as exc:
            log.debug("discord: typing in %s failed: %r", chat_id, exc)


def _nonce(msg: OutboundMessage, chunk: int) -> str | None:
    """The same for every attempt at one chunk of one recorded reply: sent with
    ``enforce_nonce``, so Discord shows it once even if a crash makes us send it again."""
    outbox_id = msg.outbox_id
    return f"nb{outbox_id}.{chunk}" if outbox_id is not None else None  # Discord allows 25 characters


def _addresses(message: discord.Message, bot_id: int) -> bool:
    """Mentioned by id, or a reply to one of the bot's messages."""
    if any(user.id == bot_id for user in message.mentions):
        return True
    replied = message.reference.resolved if message.reference else None
    return isinstance(replied, discord.Message) and replied.author.id == bot_id




def _reference(msg: OutboundMessage, channel_id: int) -> discord.MessageReference | None:
    """A reply to the message it answers (in a server's channel, which question it is for)."""
    answers = msg.answers
    return discord.MessageReference(message_id=int(answers), channel_id=channel_id, fail_if_not_exists=False) \
        if answers and answers.isdigit() else None


def _words(message: discord.Message) -> str:
    """What a message says: its text, and a poll it started as words."""
    poll = message.poll and shared_poll(message.poll.question, [answer.text for answer in message.poll.answers])
    return "\n".join(filter(None, [message.content, poll]))


def _identity(author: discord.abc.User, webhook_id: int | None = None) -> Identity:
    """The user's id; their username as a handle only where Discord keeps it unique (accounts
    moved to the new names have discriminator "0") and not a webhook's (its poster picks any
    name). The display name is only shown."""
    unique = webhook_id is None and getattr(author, "discriminator", "0") in ("0", "")
    return Identity(str(author.id), author.name if unique else None, getattr(author, "display_name", None))
