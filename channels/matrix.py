"""Matrix adapter: the client-server API through matrix-nio's ``AsyncClient``.

- One worker syncs (long-polls ``/sync``) at a time. The sync token is kept (``ctx.store``)
  only after every message it delivered is recorded, so a restart reads on from there: what
  was sent while the gateway was down is answered once, nothing twice (an event id is a
  message's delivery key); when more came than a sync carries, the rest is fetched
  (``_missed``). The first start reads no history: it begins at "now".
- Rooms: it joins those an allowed user invites it to and declines the rest. A room of two
  (the bot and one person) is that person's private chat; any other room is a group chat,
  answered when mentioned (``groupPolicy``). Chats are ``matrix:<room id>``; when a room
  changes hands (grows, shrinks, another person), the chat starts over (``Agent.meet``).
- Identity is the sender's Matrix user id, which the homeserver vouches for; a display name
  is anyone's to set and is only shown.
- Replies are Markdown rendered to Matrix HTML; a streamed reply is one message edited as it
  grows (``m.replace``). Files go both ways through the homeserver's media repository
  (``mxc://``); the access token goes to ``homeserver`` only.
- End-to-end encrypted rooms are read and answered encrypted (``matrix_crypto``); with
  ``encryption`` off, or among workers, a message there gets one plain reply saying it cannot be
  read, never silence, and nothing else goes there in clear.
"""

from __future__ import annotations

import asyncio
import io
import logging
import mimetypes
import re
from functools import partial
import time
from typing import Any

import aiohttp
from nio import AsyncClient, AsyncClientConfig, LocalProtocolError, LoginResponse, RoomGetEventResponse, \
    RoomMessagesResponse, RoomSendResponse, SyncError, UploadResponse, WhoamiResponse
from nio.exceptions import EncryptionError, GroupEncryptionError

from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.channel_plugin import BaseChannel, ChannelContext, SendFailed, Sender, send_parts
from nanobot.message_context import noting_lost, with_quote
from nanobot.config import MatrixConfig
from nanobot.listener import read_whole
from nanobot_channels.matrix_crypto import UNREADABLE_REPLY, exchange, keys_dir, make_private, opened, sealed_content, \
    taken_by_another
from nanobot_channels.matrix_events import POLL_STARTS, edit_message, file_name, mapping, relation, \
    text_message, transaction_id, without_reply_fallback, words
from nanobot_channels.matrix_signing import CrossSigning
from nanobot_channels.text import split_message, tables_as_lists

log = logging.getLogger(__name__)

SYNC = "matrix sync"  # the singleton: one worker syncs
SYNC_MS = 30_000  # the long poll
# nio retries a request whose connection failed for ever by default: a homeserver that is away
# then held the start for its deadline and a sync or a send with no word in status. After these
# quick retries the error reaches us, and status, the reconnect and the outbox's retries take over.
NIO_RETRIES = 2
# Only what a turn needs: no presence, account data or typing (each would move the token).
TIMELINE_LIMIT = 50  # events a sync brings per room; what came before them is fetched (``_missed``)
MISSED_MAX = 1000  # events fetched per room after a long time away: older ones are not answered
MEDIA_KINDS = ("m.image", "m.file", "m.audio", "m.video")
VOICE = "org.matrix.msc3245.voice"
ENCRYPTED_REPLY = ("This room is end-to-end encrypted, and I cannot read encrypted messages. Talk to me in a room "
                   "without encryption (in Element: create the room with encryption turned off).")
# A room joined with history: what was said before the invitation is not for the bot. The
# invitation's time is not in the state Matrix shows an invitee, so the join's time counts,
# less this grace (what the inviter wrote while the bot was joining; clocks a little apart).
JOIN_GRACE_MS = 60_000
# The spec's server name and media id: nothing else of a sender's URL reaches the request made
# with the bot's token (dot segments in it would make it another request to the homeserver).
MXC = re.compile(r"mxc://([A-Za-z0-9.:\[\]-]+)/([A-Za-z0-9_-]+)")


class MatrixChannel(BaseChannel):
    name = "matrix"
    max_message_len = 16_000  # far below the 65 KB event limit, HTML included

    def __init__(self, config: MatrixConfig, ctx: ChannelContext, *, join_grace_ms: int = JOIN_GRACE_MS,
                 timeline_limit: int = TIMELINE_LIMIT) -> None:
        super().__init__(config, ctx)
        self.join_grace_ms = join_grace_ms  # messages this much older than our join are still answered
        self.filter = {"presence": {"types": []}, "account_data": {"types": []}, "room": {
            "ephemeral": {"types": []}, "account_data": {"types": []}, "timeline": {"limit": timeline_limit}}}
        self.config: MatrixConfig = config
        self.homeserver = config.homeserver.rstrip("/")
        self.keys = keys_dir(ctx.keys_dir, config.encryption)
        self.client = AsyncClient(self.homeserver, config.user_id, device_id=config.device_id or None,
                                  store_path=str(self.keys or ""),
                                  config=AsyncClientConfig(encryption_enabled=self.keys is not None,
                                                           store_sync_tokens=False, request_timeout=SYNC_MS / 1000 + 30,
                                                           max_timeouts=NIO_RETRIES))
        self.client.access_token = config.access_token  # sends may come before the start (the outbox's)
        self._previews: dict[int, tuple[str, str]] = {}  # stream_id -> (room, event id) of the growing message
        self._told_encrypted: set[str] = set()
        self._key_failures: set[str] = set()  # each said once in the log
        self._keys_lock = asyncio.Lock()  # one key exchange at a time: the sync's, or a send's
        self.signing = CrossSigning(self.keys, config.password, ctx.store)  # the device signed as the account's own
        self._joined_at: dict[str, float] = {}  # room -> when we joined it here (ms since the epoch)
        self.position_key = f"{self.name} {config.user_id}"  # another account's token would not do
        self.device_key = f"{self.name} device {config.user_id}"  # the encrypting device a password login reuses

    async def start(self) -> None:
        try:
            await self._sign_in()
        except BaseException:
            await self.client.close()
            raise
        self.read_while_held(SYNC, self._sync)

    async def _sign_in(self) -> None:
        if self.keys:
            make_private(self.keys)  # before nio opens the device's keys there
        try:
            await self._log_in()
            if self.keys:
                await self._open_keys()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise RuntimeError(f"matrix: {self.homeserver} is unreachable ({type(exc).__name__}: {exc})") from None

    async def _log_in(self) -> None:
        c, client = self.config, self.client
        if c.access_token:  # whose is it, and which device?
            client.access_token = c.access_token
            answer: Any = await client.whoami()
            if isinstance(answer, WhoamiResponse) and answer.user_id != c.user_id:
                raise RuntimeError(f"the access token is {answer.user_id}'s, not {c.user_id}'s")
            ok = isinstance(answer, WhoamiResponse)
        else:
            if self.keys and not c.device_id:  # the device whose keys are kept here, if there is one yet
                client.device_id = await self.ctx.store.position(self.device_key) or ""
            answer = await client.login(c.password, device_name="nanobot")
            ok = isinstance(answer, LoginResponse)
        if not ok:
            how = "access token" if c.access_token else "password"
            raise RuntimeError(f"matrix: {self.homeserver} did not accept the {how} of {c.user_id} "
                               f"({getattr(answer, 'message', answer)})")

    async def _open_keys(self) -> None:
        """The device's keys, kept here since its first start (made then). A device whose keys
        another client uploaded is not the bot's: a password login leaves it for a device of its
        own; a token's (or a configured ``deviceId``'s) goes on without encryption, saying why."""
        c, client = self.config, self.client
        if c.access_token and client.device_id:
            client.restore_login(c.user_id, client.device_id, c.access_token)
        if (c.access_token and not client.device_id) or await taken_by_another(client, self.homeserver):
            if c.access_token or c.device_id:
                return self._without_encryption()
            log.warning("matrix: the device %s has keys that are not in %s any more: logging in as a new device",
                        client.device_id, self.keys)
            client.device_id, client.olm, client.store = "", None, None
            await client.login(c.password, device_name="nanobot")
        if not c.access_token:
            await self.ctx.store.keep_position(self.device_key, client.device_id)

    def _without_encryption(self) -> None:
        """As before encryption came (a token copied from Element, as the docs then said, kept working)."""
        log.warning("matrix: the device %s is not the bot's alone (its encryption keys on the homeserver are not "
                    "in %s: another client's, such as the Element session a token was copied from), or the token "
                    "names no device: going on without end-to-end encryption, and encrypted rooms are told they "
                    "cannot be read. For encryption, give the bot its password (and no deviceId) instead",
                    self.client.device_id or "(none)", self.keys)
        self.keys, self.client.olm, self.client.store = None, None, None

    async def stop(self) -> None:
        await self.stop_receiving()
        await self.client.close()

    # -- incoming ------------------------------------------------------------------------
    async def _sync(self) -> None:
        since = await self.ctx.store.position(self.position_key)
        first, whole = since is None, True  # whole: every room's state too (who is in it), once per connection
        while True:
            await self._exchange_keys()  # before the first sync too: others can encrypt for us at once
            answer = await self.client.sync(timeout=0 if first else SYNC_MS, since=since, sync_filter=self.filter,
                                            full_state=whole)
            if isinstance(answer, SyncError):
                raise RuntimeError(f"sync failed: {answer.message}")
            self._report(None)
            for room_id, invited in answer.rooms.invite.items():
                await self._invited(room_id, invited.invite_state)
            if not first:  # the first sync is history from before this assistant listened
                for room_id, joined in answer.rooms.join.items():
                    timeline = joined.timeline
                    missed = await self._missed(room_id, timeline.prev_batch, since) if timeline.limited else []
                    for event in [*missed, *(e.source for e in timeline.events)]:
                        await self._event(room_id, event)
            if answer.next_batch != since:  # an idle long poll ends where it began: nothing to write
                await self.ctx.store.keep_position(self.position_key, answer.next_batch)
            since, first, whole = answer.next_batch, False, False

    async def _missed(self, room_id: str, before: str | None, since: str | None) -> list[dict[str, Any]]:
        """A room's events between our last sync and those this one brought, oldest first: more
        came while we were away than a sync carries (``limited``), and none may go unanswered."""
        events: list[dict[str, Any]] = []
        while before and len(events) < MISSED_MAX:
            page = await self.client.room_messages(room_id, start=before, end=since, limit=100)
            if not isinstance(page, RoomMessagesResponse):
                raise RuntimeError(f"reading what came while away failed: {page.message}")
            events += [event.source for event in page.chunk]
            before = page.end if page.chunk else None
        if before:
            log.warning("matrix: over %d events came in %s while away; the older ones are not answered",
                        MISSED_MAX, room_id)
        return events[::-1]

    async def _invited(self, room_id: str, state: list[Any]) -> None:
        """Join when an allowed user invited us; decline anyone else's invitation."""
        inviter = next((e.sender for e in state if getattr(e, "membership", None) == "invite"
                        and getattr(e, "state_key", None) == self.config.user_id), None)
        if inviter and await self._may_download(Identity(inviter)):
            joined = await self.client.join(room_id)
            self._joined_at[room_id] = time.time() * 1000
            log.info("matrix: joined %s, invited by %s (%s)", room_id, inviter, type(joined).__name__)
        else:
            await self.client.room_leave(room_id)
            log.info("matrix: declined an invitation to %s from %s (not allowed)", room_id, inviter)

    async def _event(self, room_id: str, event: dict[str, Any]) -> None:
        sender, content = str(event.get("sender") or ""), event.get("content")
        if event.get("type") not in ("m.room.message", "m.room.encrypted", *POLL_STARTS) \
                or sender == self.config.user_id \
                or not isinstance(content, dict) or relation(content) == "m.replace" \
                or content.get("msgtype") == "m.notice" \
                or int(event.get("origin_server_ts") or 0) < self._joined_at.get(room_id, 0) - self.join_grace_ms:
            # State, our own messages, edits of earlier messages, history from before we came, and
            # notices: what other bots say, never answered (the spec's rule: two bots would loop).
            return
        room = self.client.rooms.get(room_id)
        is_private = room is not None and room.member_count == 2
        who = Identity(sender, name=room.user_name(sender) if room else None)
        body = words(content)
        mentions = mapping(content.get("m.mentions")).get("user_ids")
        mentioned = isinstance(mentions, list) and self.config.user_id in mentions \
            or self.config.user_id in body + str(content.get("formatted_body") or "")
        if not self._addressed(is_private, mentioned):
            return await self._overhear(room_id, who, body)  # for the next message to us
        if event["type"] == "m.room.encrypted" or room is not None and room.encrypted and not self.client.olm:
            # No encryption here, or its key did not reach us; or words in clear that no reply could answer.
            return await self._cannot_read(room_id, who)
        sender_of = Sender(self.name, room_id, who, is_private)
        media = await self._download(content, sender_of) if content.get("msgtype") in MEDIA_KINDS \
            and await self._may_download(who) else []
        answered = mapping(mapping(content.get("m.relates_to")).get("m.in_reply_to")).get("event_id")
        answered = answered if isinstance(answered, str) and answered.startswith("$") else None  # an event id only
        if answered:
            body = without_reply_fallback(body)
        text = "" if media else body.replace(self.config.user_id, "").strip().removeprefix(":").strip()
        quoted = await self._answered(room_id, answered) if answered and await self._may_download(who) else {}
        text, untrusted = with_quote(text, quoted.get("body"), quoted.get("sender"), who.id, self.config.user_id)
        event_id = str(event.get("event_id"))
        await self._handle(InboundMessage(
            self.name, room_id, who.id, noting_lost(text, int(content.get("msgtype") in MEDIA_KINDS), media),
            sender_name=who.name, media=media, is_private=is_private, delivery_key=event_id, untrusted=untrusted,
            reply_context=None if is_private else {"message_id": event_id}), mentioned=mentioned)  # answered as a reply

    async def _answered(self, room_id: str, event_id: str) -> dict[str, str]:
        """The sender and words of the message a reply answers (its event fetched); {} if it cannot be."""
        found = await self.client.room_get_event(room_id, event_id)
        if not isinstance(found, RoomGetEventResponse):
            log.info("matrix: could not read the message %s answers: %s", event_id, getattr(found, "message", found))
            return {}
        source = found.event.source
        latest = mapping(mapping(mapping(source.get("unsigned")).get("m.relations")).get("m.replace"))
        if latest.get("sender") == source.get("sender"):  # as edited last (a streamed reply: its end)
            body = mapping(mapping(latest.get("content")).get("m.new_content")).get("body")
        else:
            body = words(mapping(source.get("content")))
        return {"sender": str(source.get("sender")), "body": without_reply_fallback(body) if isinstance(body, str) else ""}

    async def _cannot_read(self, room_id: str, who: Identity) -> None:
        if room_id not in self._told_encrypted and await self._may_download(who):
            self._told_encrypted.add(room_id)
            why = UNREADABLE_REPLY if self.client.olm else ENCRYPTED_REPLY  # its key did not come, or no encryption
            await self._room_send(room_id, text_message(why), in_clear_too=True)

    async def _download(self, content: dict[str, Any], sender: Sender) -> list[str]:
        """The file a message carries, from the homeserver's media repository (the token goes there only)."""
        sealed = mapping(content.get("file"))  # in an encrypted room: the URL with the file's key
        url = MXC.fullmatch(str(sealed.get("url") or content.get("url") or ""))
        size = mapping(content.get("info")).get("size")
        limit = self.ctx.max_media_bytes
        if url is None or isinstance(size, int) and size > limit:
            log.warning("matrix: skipped a file (no mxc://server/id URL, or over %d bytes)", limit)
            return []
        server, media_id = url.groups()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http, http.get(
                    f"{self.homeserver}/_matrix/client/v1/media/download/{server}/{media_id}",
                    headers={"Authorization": f"Bearer {self.client.access_token}"}, allow_redirects=False) as got:
                got.raise_for_status()
                data = await read_whole(got.content, limit)
            data = opened(sealed, data) if sealed else data
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("matrix: could not download %s: %s", url[0], exc)
            return []
        name = "voice.ogg" if VOICE in content else file_name(content)
        kept = await self._keep(await self.chat_root(sender), media_id[:12], name, data)
        return [kept] if kept else []

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        preview = self._previews.pop(msg.stream_id, None) if msg.stream_id is not None else None
        first, *rest = [partial(self._send_chunk, msg.chat_id, chunk, transaction_id(msg, i))
                        for i, chunk in enumerate(split_message(tables_as_lists(msg.content), self.max_message_len))]
        await send_parts(msg, [partial(first, answers=msg.answers, preview=preview), *rest])

    async def _send_chunk(self, room: str, chunk: str, txn: str, answers: str | None = None,
                          preview: tuple[str, str] | None = None) -> None:
        """A message in ``room``, or the streamed ``preview`` replaced by it."""
        if preview is not None:
            await self._room_send(preview[0], edit_message(preview[1], chunk), txn)
        else:
            await self._room_send(room, text_message(chunk, answers), txn)

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply so far, in one message: sent once, then replaced (about once a second)."""
        if not msg.content.strip() or msg.stream_id is None:
            return
        text = msg.content[:self.max_message_len]
        preview = self._previews.get(msg.stream_id)
        try:
            if preview is None:
                sent = await self._room_send(msg.chat_id, text_message(text, msg.answers))
                self._previews[msg.stream_id] = (msg.chat_id, sent)
            else:
                await self._room_send(preview[0], edit_message(preview[1], text))
        except SendFailed as exc:
            log.debug("matrix: a stream preview in %s failed: %s", msg.chat_id, exc)

    async def send_file(self, msg: OutboundMessage) -> None:
        if msg.file is None:
            return
        file = msg.file
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        encrypt = self._encrypts(msg.chat_id)
        try:
            uploaded, keys = await self.client.upload(
                io.BytesIO(file.data), content_type="application/octet-stream" if encrypt else kind,
                filename=file.name, filesize=len(file.data), encrypt=encrypt)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # the homeserver away: sent again later
            raise SendFailed(f"matrix: uploading {file.name}: {type(exc).__name__}: {exc}", retry=True) from None
        if not isinstance(uploaded, UploadResponse):
            raise SendFailed(f"matrix: uploading {file.name} failed: {getattr(uploaded, 'message', uploaded)}",
                             retry=True)
        content = sealed_content({"msgtype": "m.image" if file.photo else "m.audio" if file.voice else "m.file",
                                  "body": file.name, "filename": file.name,
                                  "info": {"mimetype": kind, "size": len(file.data)}, "m.mentions": {}},
                                 uploaded.content_uri, keys)
        if file.voice:
            content[VOICE] = {}
        await self._room_send(msg.chat_id, content, transaction_id(msg, 0))
        if msg.content:
            await self._room_send(msg.chat_id, text_message(msg.content), transaction_id(msg, 1))

    async def send_typing(self, chat_id: str) -> None:
        try:
            await self.client.room_typing(chat_id, True, timeout=5000)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("matrix: typing in %s: %s", chat_id, exc)

    async def _exchange_keys(self) -> None:
        async with self._keys_lock:
            await exchange(self.client, self._key_failures)
            await self.signing.after_upload(self.client)  # once its keys are up

    def _encrypts(self, room_id: str, in_clear_too: bool = False) -> bool:
        """Whether what goes to ``room_id`` is encrypted. Before the device's keys are open and the
        room synced, it cannot be known: SendFailed, retried (never a guess that sends it plain).
        Without encryption here, nothing goes in clear to a room that is encrypted (a job's output,
        a notice), but for the one reply saying the bot cannot read it (``in_clear_too``)."""
        if self.keys is None:
            room = self.client.rooms.get(room_id)
            if room is not None and room.encrypted and not in_clear_too:
                raise SendFailed(f"matrix: {room_id} is end-to-end encrypted, and encryption is off here: "
                                 "nothing is sent there in clear", retry=False)
            return False
        if self.client.olm is None or not self.client.next_batch:
            raise SendFailed(f"matrix: {room_id} is not known here yet (the first sync is under way)", retry=True)
        if room_id not in self.client.rooms:  # after a sync: a room the bot was never in
            raise SendFailed(f"matrix: the bot is not in {room_id}", retry=False)
        return self.client.rooms[room_id].encrypted

    async def _room_send(self, room_id: str, content: dict[str, Any], txn: str | None = None, *,
                         in_clear_too: bool = False) -> str:
        """The event id, encrypted in an encrypted room (nio shares the room key with its members'
        devices first); SendFailed when the homeserver did not take it (retry unless refused)."""
        try:
            if self._encrypts(room_id, in_clear_too) and self.client.should_query_keys:
                await self._exchange_keys()  # someone's devices changed: the new ones get this reply's key too
            answer = await self.client.room_send(room_id, "m.room.message", content, tx_id=txn,
                                                 ignore_unverified_devices=True)
        except (aiohttp.ClientError, OSError, TimeoutError, LocalProtocolError, EncryptionError,
                GroupEncryptionError) as exc:  # away, or the room's keys could not be shared yet
            raise SendFailed(f"matrix: sending to {room_id}: {type(exc).__name__}: {exc}", retry=True) from None
        if isinstance(answer, RoomSendResponse):
            return answer.event_id
        status = getattr(answer, "status_code", None) or ""
        raise SendFailed(f"matrix: sending to {room_id} failed: {status} {getattr(answer, 'message', answer)}",
                         retry=status not in ("M_FORBIDDEN", "M_UNKNOWN_TOKEN", "M_NOT_FOUND", "M_TOO_LARGE"))
