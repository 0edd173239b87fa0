"""Real mail servers for the email tests: Debian's Dovecot as the IMAP server (configured in a
temporary folder: a password file, a maildir, a loopback port), and aiosmtpd as the SMTP
server that receives what the bot sends.

Usage::

    async with Dovecot() as imap, SmtpReceiver() as smtp:
        config.imap.port, config.smtp.port = imap.port, smtp.port   # user imap.user / imap.password
        await imap.deliver(raw_mail_bytes)       # APPEND into INBOX, as the MTA would deliver it
        await imap.pause(); await imap.resume()  # an outage
        sent = await smtp.wait_sent(1)           # [email.message.EmailMessage, ...]

Without Dovecot the tests that need it skip, saying ``apt-get install dovecot-imapd``.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import imaplib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from tests.fakes.loopback import free_port

DOVECOT = shutil.which("dovecot") or next((p for p in ("/usr/sbin/dovecot",) if Path(p).exists()), None)
needs_dovecot = pytest.mark.skipif(DOVECOT is None, reason="the email tests need a real IMAP server: "
                                                           "apt-get install dovecot-imapd")


class Dovecot:
    user, password = "bot@example.org", "imap-test-password"

    def __init__(self) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="nanobot-dovecot-"))
        self._process: subprocess.Popen[bytes] | None = None

    def _config(self) -> str:
        # As root, Dovecot's helpers run as its own users (from the package); mail is then stored
        # as "dovecot". As anyone else, everything runs as that user.
        root = os.getuid() == 0
        login, internal = ("dovenull", "dovecot") if root else (pwd.getpwuid(os.getuid()).pw_name,) * 2
        owner = pwd.getpwnam("dovecot") if root else pwd.getpwuid(os.getuid())
        mail = self.folder / "mail"
        mail.mkdir()
        os.chown(mail, owner.pw_uid, owner.pw_gid)
        (self.folder / "passwd").write_text(f"{self.user}:{{PLAIN}}{self.password}\n")
        (self.folder / "passwd").chmod(0o644)  # Dovecot's auth user reads it; the gateway tests leave a 077 umask
        return f"""
base_dir = {self.folder}/run
state_dir = {self.folder}/state
log_path = {self.folder}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
default_login_user = {login}
default_internal_user = {internal}
first_valid_uid = 1
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {self.folder}/passwd
}}
userdb {{
  driver = static
  args = uid={owner.pw_uid} gid={owner.pw_gid} home={mail}/%u
}}
mail_location = maildir:{mail}/%u
# IDLE learns of new mail through inotify; where the machine's inotify instances run out (a
# loaded test run: Chromium, other Dovecots), it looks every this often instead of every 30 s.
mailbox_idle_check_interval = 1 secs
# A refused login answers at once, and the next login from 127.0.0.1 is not held back (2 s, then
# a penalty doubled after each failure: guards against guessing, which only slow tests here).
auth_failure_delay = 0
service anvil {{
  chroot =
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
"""

    async def __aenter__(self) -> Dovecot:
        self.folder.chmod(0o755)  # Dovecot's own users must reach the maildir inside
        (self.folder / "dovecot.conf").write_text(self._config())
        (self.folder / "dovecot.conf").chmod(0o644)
        return await self.resume()

    async def pause(self) -> None:
        """Stop the server (the mail stays), as an outage would: every Dovecot process of this
        instance at once (its master alone lets idle clients linger for ten seconds)."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGTERM)
            await asyncio.to_thread(self._process.wait, 10)
            self._process = None

    async def resume(self) -> Dovecot:
        assert DOVECOT is not None
        conf = self.folder / "dovecot.conf"
        self._process = subprocess.Popen([DOVECOT, "-F", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # listening comes first; its auth process may still be starting
            try:
                await asyncio.to_thread(lambda: self._imap(timeout=2).logout())
                return self
            except (OSError, imaplib.IMAP4.error) as exc:
                failure = exc
                if self._process.poll() is not None:
                    break
                await asyncio.sleep(0.02)
        log = (self.folder / "dovecot.log").read_text()[-1500:] if (self.folder / "dovecot.log").exists() else ""
        raise RuntimeError(f"dovecot took no login within 20 s ({failure!r}); its log ends:\n{log}")

    async def __aexit__(self, *exc: object) -> None:
        await self.pause()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _imap(self, timeout: float = 10) -> imaplib.IMAP4:
        client = imaplib.IMAP4("127.0.0.1", self.port, timeout=timeout)
        client.login(self.user, self.password)
        client.select("INBOX")
        return client

    async def deliver(self, raw: bytes) -> None:
        """Into INBOX, unseen (as the mail server's delivery would put it)."""
        def append() -> None:
            client = self._imap()
            try:
                client.append("INBOX", None, None, raw)
            finally:
                client.logout()

        await asyncio.to_thread(append)

    async def unseen(self) -> int:
        def count() -> int:
            client = self._imap()
            try:
                return len(client.uid("search", None, "UNSEEN")[1][0].split())
            finally:
                client.logout()

        return await asyncio.to_thread(count)


Answer = Callable[[str, str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class ScriptedImap:
    """An IMAP server that says what a test scripts, for what Dovecot does only by chance (a
    shutdown at one moment, an announcement beside one answer). It greets and answers
    CAPABILITY; ``answer(tag, command, reader, writer)`` writes the untagged lines of every other
    command and says whether the tagged OK follows and the session goes on (False: it ended it)."""

    user, password = "bot@example.org", "secret"

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.port = 0

    async def __aenter__(self) -> ScriptedImap:
        self.server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"* OK [CAPABILITY IMAP4rev1 IDLE] ready\r\n")
        while line := await reader.readline():
            tag, _, command = line.decode().strip().partition(" ")
            if command.startswith("CAPABILITY"):
                writer.write(b"* CAPABILITY IMAP4rev1 IDLE\r\n")
            elif not await self.answer(tag, command, reader, writer):
                return
            writer.write(f"{tag} OK done\r\n".encode())
            await writer.drain()


def fetched(writer: asyncio.StreamWriter, uid: int, raw: bytes) -> None:
    """A ``ScriptedImap`` answer's untagged line for ``UID FETCH uid (BODY.PEEK[])``: the mail."""
    writer.write(f"* {uid} FETCH (UID {uid} BODY[] {{{len(raw)}}}\r\n".encode() + raw + b")\r\n")


async def idle_quietly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A ``ScriptedImap`` answer to IDLE that pushes nothing until the client's DONE (at the
    renewal or the stop): mail told of only here would wait that long."""
    writer.write(b"+ idling\r\n")
    await writer.drain()
    await reader.readline()


def email_section(imap: Dovecot, smtp: SmtpReceiver, allow_from: list[str] | None = None) -> dict[str, Any]:
    """``channels.email`` (as config.json spells it) reading ``imap`` and sending through ``smtp``,
    plain text on loopback."""
    return {"enabled": True, "address": imap.user, "allowFrom": allow_from or ["bob@example.org"],
            "imap": {"host": "127.0.0.1", "port": imap.port, "username": imap.user, "password": imap.password,
                     "tls": False},
            "smtp": {"host": "127.0.0.1", "port": smtp.port, "starttls": False}}


def plain_text(mail: EmailMessage) -> str:
    """What a mail says, from its plain part (the reader's words, without the HTML beside them)."""
    return mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]


class SmtpReceiver:
    """aiosmtpd on loopback (its own thread): every mail it is given, parsed."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sent: list[EmailMessage] = []
        self.envelopes: list[Any] = []
        self.refuse_next: list[str] = []  # SMTP answers for the next DATA commands ("550 ...", "451 ...")
        self._controller: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick = asyncio.Event()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        if self.refuse_next:
            return self.refuse_next.pop(0)
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._received, message, envelope)
        return "250 OK"

    def _received(self, message: Any, envelope: Any) -> None:
        self.sent.append(message)
        self.envelopes.append(envelope)
        self._tick.set()
        self._tick = asyncio.Event()

    async def wait_sent(self, count: int, timeout: float = 10.0) -> list[EmailMessage]:
        async with asyncio.timeout(timeout):
            while len(self.sent) < count:
                await self._tick.wait()
        return self.sent

    async def __aenter__(self) -> SmtpReceiver:
        from aiosmtpd.controller import Controller

        self._loop = asyncio.get_running_loop()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)
        await asyncio.to_thread(self._controller.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self._controller.stop)
