"""Email adapter: a mailbox read over IMAP (IDLE, else a poll), replies sent over SMTP in the
thread of the mail they answer.

Durable like the other channels: a mail is recorded by the intake (its Message-ID, else
UIDVALIDITY:UID, drops a repeat) before it is marked seen, and it is fetched with BODY.PEEK so
reading it marks nothing. A crash before the mark leaves it unseen: read again, recorded
already, not answered twice. The turn itself resumes once, as for every channel, and replies go
through the outbox; each reply's Message-ID comes from its outbox id, so one sent again after a
crash mid-send is the same mail to the receiver.

Trust: see ``email_parse.vouched``. With ``trustedAuthServId`` a mail whose From the receiving
server does not vouch for is not answered (one log line); without it every email chat is a
member chat (``trust.py``). Strangers get no reply and no pairing code: an answering robot
would be a spam reflector. One worker reads the mailbox (a singleton); every worker sends.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any, Sequence

import aioimaplib
import aiosmtplib

from nanobot.channel_plugin import BaseChannel, ChannelContext, SendFailed, Sender
from nanobot.message_context import noting_lost
from nanobot_channels.email_parse import Mail, Unreadable, read_body, read_headers, vouched
from nanobot_channels.markdown_html import to_html
from nanobot.bus import Identity, InboundMessage, OutboundMessage
from nanobot.config import EmailConfig
from nanobot.eventloop import raise_if_cancelled

log = logging.getLogger(__name__)

READER = "email reader"  # the singleton: one worker reads the mailbox
IDLE_RENEW_S = 5 * 60  # IDLE is renewed this often: servers drop one after 30 min, and a dead link shows at the renewal
RETRY_S = (1.0, 5.0, 30.0, 60.0)  # pauses before reconnecting, the last one repeated
FETCH_TIMEOUT_S = 60.0
IMAP_TIMEOUT_S = 30.0  # for the greeting and each command


class MailboxError(Exception):
    """The IMAP server refused something (login, select); the reason is in the message."""


class MailboxUnavailable(RuntimeError):
    """The mailbox cannot be reached now (no connection, a timeout, the server's [UNAVAILABLE]):
    worth trying again, unlike a refused password."""


@dataclass
class Mailbox:
    """An open IMAP connection with the mailbox selected."""

    imap: aioimaplib.IMAP4
    uidvalidity: str
    lost: asyncio.Event  # set when the server closes the connection


class EmailChannel(BaseChannel):
    name = "email"
    max_message_len = 1_000_000

    def __init__(self, config: EmailConfig, ctx: ChannelContext, *, retry_s: Sequence[float] = RETRY_S,
                 imap_timeout_s: float = IMAP_TIMEOUT_S) -> None:
        super().__init__(config, ctx)
        self.config: EmailConfig = config
        self.retry_s, self.imap_timeout_s = tuple(retry_s), imap_timeout_s
        self.domain = config.address.rpartition("@")[2] or "localhost"
        self._threads: dict[str, dict[str, str]] = {}  # chat_id -> the last mail's reply context

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        first = None  # the reader's first round, with the connection opened here
        held = await self.ctx.singletons.try_hold(READER)
        if held is None:
            log.info("email: another worker reads the mailbox; this one sends, and takes over if it stops")
        else:
            try:
                first = self._read(await self._open())  # a wrong password fails start(), with the reason
            # A server still starting or away: unlike a failed start (which the supervisor retries),
            # the channel runs, so replies and cron output still go out by SMTP; the reader retries.
            except MailboxUnavailable as exc:
                why = str(exc).removeprefix("email: ")
                log.warning("email: the mailbox is unreachable at start (%s); the reader keeps trying", why)
            except BaseException:
                await self.ctx.singletons.release(held)
                raise
        self.read_while_held(READER, lambda: self._read(None), first)

    async def stop(self) -> None:
        await self.stop_receiving()

    # -- reading -------------------------------------------------------------------------
    async def _open(self) -> Mailbox:
        """A logged-in connection with the mailbox selected."""
        server, lost = self.config.imap, asyncio.Event()
        imap = aioimaplib.IMAP4(server.host, server.port, timeout=self.imap_timeout_s, conn_lost_cb=lambda exc: lost.set(),
                                ssl_context=ssl.create_default_context() if server.tls else None)
        try:
            await imap.wait_hello_from_server()
            login = await imap.login(server.username, server.password)
            if login.result != "OK" and "[UNAVAILABLE]" in _said(login):
                raise MailboxUnavailable(f"login as {server.username} not possible now: {_said(login)}")
            if login.result != "OK":
                raise MailboxError(f"login as {server.username} refused: {_said(login)}")
            selected = await imap.select(server.mailbox)
            if selected.result != "OK":
                raise MailboxError(f"mailbox {server.mailbox!r} could not be opened: {_said(selected)}")
        except (MailboxError, MailboxUnavailable, OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            await _close(imap)
            lasting = isinstance(exc, (MailboxError, ssl.SSLError))
            raise (RuntimeError if lasting else MailboxUnavailable)(
                f"email: IMAP {server.host}:{server.port}: {exc or type(exc).__name__}") from None
        found = re.search(rb"UIDVALIDITY (\d+)", b" ".join(line for line in selected.lines if isinstance(line, bytes)))
        return Mailbox(imap, found.group(1).decode() if found else "0", lost)

    async def _read(self, opened: Mailbox | None) -> None:
        """New mail as it comes, reconnecting after trouble (with a pause that grows)."""
        failures = 0
        while True:
            mailbox = None
            try:
                mailbox = opened or await self._open()
                if failures:
                    self._report(None, "mailbox")
                opened, failures = None, 0
                while True:
                    # Mail that came while a batch was taken, or the search ran, is announced with
                    # those commands' answers, not in the IDLE after them: look again until it is quiet.
                    while await self._take_new(mailbox):
                        pass
                    await self._wait_for_mail(mailbox)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server went away, a timeout, a refusal: try again
                pause = self.retry_s[min(failures, len(self.retry_s) - 1)]
                failures += 1
                why = f"{exc or type(exc).__name__}".removeprefix("email: ")
                log.warning("email: reading the mailbox failed (%s); again in %g s", why, pause)
                self._report(f"the mailbox is unreachable, retrying ({why})", "mailbox")
                raise_if_cancelled()
                await asyncio.sleep(pause)
            finally:
                if mailbox is not None:
                    await _close(mailbox.imap, said_goodbye=mailbox.lost.is_set())

    async def _wait_for_mail(self, mailbox: Mailbox) -> None:
        """Until the server says something changed (IDLE), or ``pollSeconds`` without it; a
        closed connection ends the wait at once (ConnectionError)."""
        imap = mailbox.imap
        raise_if_cancelled()  # a stop that came as the last command's answer did (aioimaplib's wait_for)
        if "IDLE" not in imap.protocol.capabilities:
            await _unless_lost(mailbox, asyncio.sleep(self.config.poll_seconds))
            return
        # The server may go between our last command and IDLE: its "+ idling" then never comes.
        idle = await _unless_lost(mailbox, imap.idle_start(timeout=IDLE_RENEW_S))
        try:
            while True:
                pushed = await _unless_lost(mailbox, imap.wait_server_push(timeout=IDLE_RENEW_S + 60))
                if pushed == aioimaplib.STOP_WAIT_SERVER_PUSH or any(b"EXISTS" in line for line in pushed
                                                                       if isinstance(line, bytes)):
                    break
        finally:
            if not mailbox.lost.is_set():
                imap.idle_done()
                await asyncio.wait_for(idle, FETCH_TIMEOUT_S)
            else:
                idle.cancel()

    async def _take_new(self, mailbox: Mailbox) -> bool:
        """Read and mark every unseen mail; whether to look again: there was some, or mail came
        while the search ran (announced beside its answer, never in the IDLE after it)."""
        imap, uidvalidity = mailbox.imap, mailbox.uidvalidity
        # A NOOP beside the search takes what the server says besides (aioimaplib drops an untagged
        # EXISTS that no NOOP waits for): a mail that came while the search ran, not among its results.
        found, told = await asyncio.gather(imap.uid_search("UNSEEN", charset=None), imap.noop())
        if found.result != "OK":
            raise MailboxError(f"search failed: {_said(found)}")
        words = b" ".join(line for line in found.lines[:1] if isinstance(line, bytes)).split()
        uids = [word.decode() for word in words if word.isdigit()]
        for uid in uids:
            fetched = await imap.uid("fetch", uid, "(BODY.PEEK[])")
            raw = next((line for line in fetched.lines if isinstance(line, bytearray)), None)
            if fetched.result != "OK" or raw is None:
                raise MailboxError(f"fetching mail {uid} failed: {_said(fetched)}")
            try:
                await self._intake(bytes(raw), f"{uidvalidity}:{uid}")  # recorded (or refused) before the mark
            except Unreadable as exc:  # passed over once, never read again (marked seen below)
                log.warning("email: mail %s not read: %s", uid, exc)
            stored = await imap.uid("store", uid, "+FLAGS.SILENT", r"(\Seen)")
            if stored.result != "OK":
                raise MailboxError(f"marking mail {uid} seen failed: {_said(stored)}")
        return bool(uids) or any(line.endswith(b" EXISTS") for line in told.lines if isinstance(line, bytes))

    async def _intake(self, raw: bytes, uid_key: str) -> None:
        """Who sent it is decided from the headers; only then is the body read (bounded, off
        the event loop): a stranger's 8,000-part mail costs a header parse."""
        mail = read_headers(raw)
        if mail.auto or mail.sender == self.config.address.lower():
            return  # never answer a robot (or ourselves): two of them can loop forever
        if not _plausible_address(mail.sender):
            log.info("email: not answering mail from %r: not an address a chat can have", mail.sender)
            return
        authserv = self.config.trusted_auth_serv_id
        if authserv and not vouched(mail.headers, mail.sender, authserv):
            log.info("email: not answering mail from %s: %s does not vouch for it (no DMARC or aligned DKIM pass)",
                     mail.sender, authserv)
            return
        # The address is the id (vouched for by trustedAuthServId when set); the From name is shown only.
        who = Identity(mail.sender, None, mail.sender_name)
        if not await self._may_download(who):
            log.info("email: not answering mail from %s: not in channels.email.allowFrom", mail.sender)
            return
        sender = Sender(self.name, mail.sender, who, True)
        mail = await asyncio.to_thread(read_body, raw, mail)
        media = await self._save(mail, await self.chat_root(sender))
        self._threads[mail.sender] = mail.reply_context()
        text = mail.text if not mail.subject or mail.subject.lower().startswith("re:") \
            else f"{mail.subject}\n\n{mail.text}"
        # A repeat is known by its Message-ID, which the sender writes: only among their own mail.
        key = f"mail:{mail.sender}:{mail.message_id or uid_key}"
        text = noting_lost(text, len(mail.attachments), media)
        await self._handle(InboundMessage(self.name, mail.sender, mail.sender, text, sender_name=mail.sender_name,
                                          media=media, is_private=True, delivery_key=key,
                                          reply_context=mail.reply_context(),
                                          untrusted="a forwarded mail" if mail.forwarded else None))

    async def _save(self, mail: Mail, root: Path) -> list[str]:
        paths = []
        for index, (name, data) in enumerate(mail.attachments):
            if len(data) > self.ctx.max_media_bytes:
                log.warning("email: skipped attachment %s (%d bytes)", name, len(data))
                continue
            paths.append(await self._keep(root, f"{int(time.time())}_{index}", name, data))
        return [p for p in paths if p]

    # -- sending -------------------------------------------------------------------------
    async def send(self, msg: OutboundMessage) -> None:
        if msg.content.strip():
            await self._send_mail(msg, self._compose(msg, msg.content))

    async def send_file(self, msg: OutboundMessage) -> None:
        if msg.file is None:
            return
        mail = self._compose(msg, msg.content or f"{msg.file.name} is attached.")
        mail.add_attachment(msg.file.data, maintype="application", subtype="octet-stream", filename=msg.file.name)
        await self._send_mail(msg, mail)

    async def send_stream(self, msg: OutboundMessage) -> None:
        return None  # a mail is sent whole: only the final text goes out

    async def send_typing(self, chat_id: str) -> None:
        return None

    def _compose(self, msg: OutboundMessage, text: str) -> EmailMessage:
        """A reply in the thread of the chat's mail (or of the last one read here), else a new mail."""
        thread: dict[str, Any] = msg.reply_context or self._threads.get(msg.chat_id) or {}
        subject = str(thread.get("subject") or "").strip()
        mail = EmailMessage()
        mail["From"], mail["To"] = self.config.address, msg.chat_id
        mail["Subject"] = (subject if subject.lower().startswith("re:") else f"Re: {subject}") if subject \
            else "A message from your assistant"
        if thread.get("message_id"):
            mail["In-Reply-To"] = thread["message_id"]
            mail["References"] = thread.get("references") or thread["message_id"]
        outbox_id, recorded = msg.outbox_id, msg.outbox_created
        # The same Message-ID for every attempt at one recorded reply: a resend is one mail.
        mail["Message-ID"] = f"<nanobot.{outbox_id}.{int(recorded or 0)}@{self.domain}>" \
            if outbox_id is not None else make_msgid(domain=self.domain)
        mail["Date"] = formatdate(localtime=True)
        mail["Auto-Submitted"] = "auto-replied"  # RFC 3834: other robots must not answer it
        mail.set_content(text)
        # The same words formatted, for the clients that show HTML (most): Markdown read as
        # written would show its marks and tables raw.
        mail.add_alternative(f"<!DOCTYPE html><html><body>{to_html(text)}</body></html>", subtype="html")
        return mail

    async def _send_mail(self, msg: OutboundMessage, mail: EmailMessage) -> None:
        """Send, and say in ``status`` and ``/readyz`` while replies cannot go out."""
        try:
            await self._smtp_send(msg, mail)
        except SendFailed as exc:
            if exc.retry:
                self._report(f"replies cannot go out: {str(exc).removeprefix('email: ')}", "smtp")
            raise
        self._report(None, "smtp")

    async def _smtp_send(self, msg: OutboundMessage, mail: EmailMessage) -> None:
        server, where = self.config.smtp, f"{self.config.smtp.host}:{self.config.smtp.port}"
        try:
            await aiosmtplib.send(mail, hostname=server.host, port=server.port, username=server.username or None,
                                  password=server.password or None, start_tls=server.starttls and not server.tls,
                                  use_tls=server.tls, timeout=60)
        except aiosmtplib.SMTPResponseException as exc:
            permanent = 500 <= exc.code < 600
            raise SendFailed(f"email: the SMTP server refused mail to {msg.chat_id}: {exc.code} {exc.message}",
                             retry=not permanent) from None
        except (aiosmtplib.SMTPConnectError, aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError,
                OSError, asyncio.TimeoutError) as exc:
            raise SendFailed(f"email: could not reach the SMTP server {where}: {exc or type(exc).__name__}",
                             retry=True) from None
        except aiosmtplib.SMTPException as exc:
            if "STARTTLS" in str(exc) and server.starttls:  # reached, but it has no TLS to offer
                raise SendFailed(f"email: the SMTP server {where} does not offer STARTTLS; for a local relay "
                                 "without TLS set channels.email.smtp.starttls: false", retry=True) from None
            raise SendFailed(f"email: the SMTP server {where} failed: {exc}", retry=True) from None


async def _unless_lost(mailbox: Mailbox, work: Any) -> Any:
    """``work``'s result, or ConnectionError once the server closes the connection."""
    task, lost = asyncio.ensure_future(work), asyncio.ensure_future(mailbox.lost.wait())
    try:
        await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ConnectionError("the server closed the connection")
    return task.result()


async def _close(imap: aioimaplib.IMAP4, *, said_goodbye: bool = False) -> None:
    """Log out (unless the server already closed the connection), then drop the connection."""
    try:
        if not said_goodbye and imap.protocol is not None and imap.get_state() in ("AUTH", "SELECTED"):
            await asyncio.wait_for(imap.logout(), 5)
    except Exception:
        pass
    finally:
        if imap.protocol is not None and imap.protocol.transport is not None:
            imap.protocol.transport.close()
        for task in list(imap.tasks):  # a command the server left unanswered as it went would wait for ever
            task.cancel()


def _said(response: Any) -> str:
    return " ".join(line.decode(errors="replace") if isinstance(line, (bytes, bytearray)) else str(line)
                    for line in response.lines[-1:]) or response.result


_ADDRESS = re.compile(r"[a-z0-9!#$%&'*+=?^_`{|}~.-]+@[a-z0-9.-]+")


def _plausible_address(address: str) -> bool:
    """An address a chat may be named by: no ``/``, spaces, quotes or other characters an
    address has no business holding (a ``/task-`` in one once reached another chat's folder)."""
    return _ADDRESS.fullmatch(address) is not None and ".." not in address
