"""Who may talk to the bot: each channel's ``allowFrom`` list, plus users paired by the owner.

Pairing lets the owner admit someone without editing the config: an unknown user who writes
to the bot in a private chat gets a one-time code, and the owner runs ``nanobot pairing
approve CODE``. Codes and approvals live in ``nanobot.db``; the gate asks the database on
every message from someone not on the list, so an approval made by the CLI (another process,
same SQLite file in WAL mode) counts from the user's very next message.

Unknown senders in groups get no answer at all: a code posted there would be visible to
everyone and would let a stranger make the bot talk in any group it sits in.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable


from nanobot.bus import Identity, Moves
from nanobot.database import Database, Migrations, StoreUnavailable
from nanobot.handles import NameHolders, listed, moving_name

log = logging.getLogger(__name__)

# No 0/O, 1/I/L: codes are read off a phone screen and typed into a terminal.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8

# Where an owner is reached: on Discord, Slack, Matrix or Signal a private chat's id is not its
# user's, so the chat where an owner last wrote privately is remembered (``Agent.meet``).
OWNER_CHATS = """
CREATE TABLE owner_chats (  -- each channel's private chat where an owner last wrote: notices go there
    channel TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    owner_handle TEXT
);
"""
SQLITE_MIGRATIONS = ["""
CREATE TABLE pairing_requests (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    sender_name TEXT,
    code TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    notified_at REAL NOT NULL,          -- when the code was last sent to the user
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE paired_users (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    sender_name TEXT,
    approved_at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
""", """
ALTER TABLE pairing_requests ADD COLUMN chat_id TEXT;   -- the private chat the code went to
ALTER TABLE paired_users ADD COLUMN chat_id TEXT;
ALTER TABLE paired_users ADD COLUMN welcomed INTEGER NOT NULL DEFAULT 1;  -- told of the approval yet?
CREATE TABLE denied_users (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    denied_at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
""", OWNER_CHATS]
MIGRATIONS: Migrations = {"sqlite": SQLITE_MIGRATIONS, "postgresql": ["""
CREATE TABLE pairing_requests (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    sender_name TEXT,
    code TEXT NOT NULL UNIQUE,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    notified_at DOUBLE PRECISION NOT NULL,
    chat_id TEXT,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE paired_users (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    sender_name TEXT,
    approved_at DOUBLE PRECISION NOT NULL,
    chat_id TEXT,
    welcomed INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE denied_users (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    denied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
""", OWNER_CHATS]}

WELCOME = "You're approved: I'll answer your messages from now on."


@dataclass(frozen=True)
class PairingPolicy:
    code_ttl: float = 3600.0  # a code is good for an hour
    # At most one code message per user in this window: someone who keeps writing does not
    # get a reply to each message (that would let strangers make the bot spam on command).
    resend_interval: float = 600.0
    # Beyond this many pending codes the oldest is dropped for the newcomer: a flood of strangers
    # must not silence every real newcomer for an hour (a dropped one gets a new code next time).
    max_pending: int = 20
    sweep_interval: float = 60.0  # expired codes are deleted at most this often (each sweep commits)
    # New codes per minute across all strangers: past it a stranger's message costs one lookup
    # and nothing else (no write, no log line, no reply), so a flood of them stays cheap.
    codes_per_minute: int = 10


@dataclass(frozen=True)
class PairingRequest:
    channel: str
    sender_id: str
    sender_name: str | None
    code: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class PairedUser:
    channel: str
    sender_id: str
    sender_name: str | None
    approved_at: float
    chat_id: str | None = None  # where to tell them they were approved


_REQUEST_COLUMNS = "channel, sender_id, sender_name, code, created_at, expires_at"
_USER_COLUMNS = "channel, sender_id, sender_name, approved_at, chat_id"


def normalize_code(code: str) -> str:
    """Forgive case, spaces and dashes when the owner types a code."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class PairingStore:
    """Pending codes and approved users, in the database. Times are wall-clock seconds,
    because the gateway and the CLI (two processes) compare them."""

    def __init__(self, db: Database, holders: NameHolders, policy: PairingPolicy = PairingPolicy(),
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.holders = holders  # whose each name the config lists is
        self.policy = policy
        self.clock = clock
        self._swept_at = float("-inf")
        self._owner_chats: dict[str, tuple[str, str, str | None]] = {}  # what this process last wrote

    @classmethod
    async def open(cls, db: Database, policy: PairingPolicy = PairingPolicy(),
                   clock: Callable[[], float] = time.time) -> PairingStore:
        await db.migrate("pairing", MIGRATIONS)
        return cls(db, await NameHolders.open(db), policy, clock)

    async def is_paired(self, channel: str, sender_id: str) -> bool:
        return await self.db.fetchrow("SELECT 1 FROM paired_users WHERE channel = $1 AND sender_id = $2",
                                      channel, sender_id) is not None

    async def request(self, channel: str, sender_id: str, sender_name: str | None,
                      chat_id: str | None = None) -> str | None:
        """The code to send this user now, or None if one was sent recently or the owner denied
        them (a full queue drops its oldest)."""
        if await self._denied(channel, sender_id):
            return None
        now = self.clock()
        await self._drop_expired(now)
        row = await self.db.fetchrow("SELECT code, notified_at, expires_at FROM pairing_requests "
                                     "WHERE channel = $1 AND sender_id = $2", channel, sender_id)
        if row is not None and row["expires_at"] <= now:  # expired, not swept yet
            await self.db.execute("DELETE FROM pairing_requests WHERE code = $1", row["code"])
            row = None
        if row is not None:
            if now - row["notified_at"] < self.policy.resend_interval:
                return None
            await self.db.execute("UPDATE pairing_requests SET notified_at = $1 WHERE channel = $2 AND sender_id = $3",
                                  now, channel, sender_id)
            return row["code"]
        code = await self._insert(channel, sender_id, sender_name, now, chat_id or sender_id)
        if code is not None:  # room is made after the insert: a repeat of a request drops nobody
            await self._make_room(code)
        return code

    async def _make_room(self, new: str) -> None:
        """Over ``max_pending``: the oldest codes go, never the one just made."""
        pending = await self.pending()
        excess = len(pending) - self.policy.max_pending
        if excess > 0:
            log.warning("pairing: %d codes pending; dropping the %d oldest", len(pending), excess)
            await self.db.executemany("DELETE FROM pairing_requests WHERE code = $1",
                                      [(r.code,) for r in [r for r in pending if r.code != new][:excess]])

    async def _insert(self, channel: str, sender_id: str, sender_name: str | None, now: float,
                      chat_id: str) -> str | None:
        for _ in range(5):  # a clash among 31^8 codes is unlikely; retry rather than fail
            code = new_code()
            if await self.db.execute(
                    f"INSERT INTO pairing_requests ({_REQUEST_COLUMNS}, notified_at, chat_id) "
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                    channel, sender_id, sender_name, code, now, now + self.policy.code_ttl, now, chat_id):
                return code
            # Nothing inserted: a concurrent message from the same user inserted first (that one
            # replies), or the code is taken (try another).
            if await self.db.fetchrow("SELECT 1 FROM pairing_requests WHERE channel = $1 AND sender_id = $2",
                                      channel, sender_id) is not None:
                return None
        return None

    async def approve(self, code: str) -> PairedUser:
        """Admit the user behind ``code``; ValueError if there is no such pending code. A running
        gateway tells them (``unwelcomed``)."""
        row = await self._pending_row(code)
        user = PairedUser(row["channel"], row["sender_id"], row["sender_name"], self.clock(), row["chat_id"])
        async with self.db.transaction() as tx:
            await tx.execute(f"INSERT INTO paired_users ({_USER_COLUMNS}, welcomed) VALUES ($1, $2, $3, $4, $5, 0) "
                             "ON CONFLICT (channel, sender_id) DO UPDATE SET sender_name = excluded.sender_name, "
                             "approved_at = excluded.approved_at, chat_id = excluded.chat_id, welcomed = 0",
                             user.channel, user.sender_id, user.sender_name, user.approved_at, user.chat_id)
            await tx.execute("DELETE FROM pairing_requests WHERE code = $1", row["code"])
        return user

    async def deny(self, code: str) -> PairingRequest:
        """Refuse the user behind ``code``: the code is gone and they get no new one."""
        row = await self._pending_row(code)
        async with self.db.transaction() as tx:
            await tx.execute("INSERT INTO denied_users (channel, sender_id, denied_at) VALUES ($1, $2, $3) "
                             "ON CONFLICT (channel, sender_id) DO UPDATE SET denied_at = excluded.denied_at",
                             row["channel"], row["sender_id"], self.clock())
            await tx.execute("DELETE FROM pairing_requests WHERE code = $1", row["code"])
        return PairingRequest(*(row[k] for k in _REQUEST_COLUMNS.split(", ")))

    async def revoke(self, channel: str, sender_id: str) -> bool:
        """Take back an approval (they may ask again); False if they were not approved."""
        return await self.db.execute("DELETE FROM paired_users WHERE channel = $1 AND sender_id = $2",
                                     channel, sender_id) > 0

    async def unwelcomed(self) -> list[PairedUser]:
        return [PairedUser(*row) for row in await self.db.fetch(
            f"SELECT {_USER_COLUMNS} FROM paired_users WHERE welcomed = 0")]

    async def mark_welcomed(self, user: PairedUser) -> None:
        await self.db.execute("UPDATE paired_users SET welcomed = 1 WHERE channel = $1 AND sender_id = $2",
                              user.channel, user.sender_id)

    async def _pending_row(self, code: str):
        now = self.clock()
        await self._drop_expired(now)
        row = await self.db.fetchrow("SELECT * FROM pairing_requests WHERE code = $1 AND expires_at > $2",
                                     normalize_code(code), now)
        if row is None:
            raise ValueError(f"no pending pairing code {code!r} (codes expire after "
                             f"{self.policy.code_ttl / 60:g} minutes; see: nanobot pairing list)")
        return row

    async def _denied(self, channel: str, sender_id: str) -> bool:
        return await self.db.fetchrow("SELECT 1 FROM denied_users WHERE channel = $1 AND sender_id = $2",
                                      channel, sender_id) is not None

    async def pending(self) -> list[PairingRequest]:
        return [PairingRequest(*row) for row in await self.db.fetch(
            f"SELECT {_REQUEST_COLUMNS} FROM pairing_requests WHERE expires_at > $1 ORDER BY created_at", self.clock())]

    async def paired(self) -> list[PairedUser]:
        return [PairedUser(*row) for row in await self.db.fetch(
            f"SELECT {_USER_COLUMNS} FROM paired_users ORDER BY approved_at")]

    async def heard_owner(self, channel: str, chat_id: str, owner: Identity) -> None:
        """Remember the private chat where an owner of ``channel`` wrote (written once per change)."""
        row = (chat_id, owner.id, owner.handle)
        if self._owner_chats.get(channel) == row:
            return
        try:
            await self.db.execute("INSERT INTO owner_chats (channel, chat_id, owner_id, owner_handle) "
                                  "VALUES ($1, $2, $3, $4) ON CONFLICT (channel) DO UPDATE SET chat_id = "
                                  "excluded.chat_id, owner_id = excluded.owner_id, owner_handle = excluded.owner_handle",
                                  channel, *row)
        except StoreUnavailable as exc:  # the owner's message goes on; their next one tries again
            log.warning("pairing: could not note %s:%s as the owner's chat: %s", channel, chat_id, exc)
            return
        self._owner_chats[channel] = row

    async def forget_owner_chat(self, channel: str, chat_id: str) -> None:
        """A chat that changed hands is no longer where an owner is reached."""
        self._owner_chats.pop(channel, None)
        await self.db.execute("DELETE FROM owner_chats WHERE channel = $1 AND chat_id = $2", channel, chat_id)

    async def owner_chats(self) -> dict[str, tuple[str, Identity]]:
        """Each channel's remembered owner chat, and the owner who wrote there."""
        return {row["channel"]: (row["chat_id"], Identity(row["owner_id"], row["owner_handle"]))
                for row in await self.db.fetch("SELECT channel, chat_id, owner_id, owner_handle FROM owner_chats")}

    async def _drop_expired(self, now: float) -> None:
        if now - self._swept_at < self.policy.sweep_interval:
            return  # pending() and approve() compare expires_at themselves
        self._swept_at = now
        await self.db.execute("DELETE FROM pairing_requests WHERE expires_at <= $1", now)


OWNER_NOTICES_PER_HOUR = 10


def pairing_message(code: str, ttl: float) -> str:
    return (f"Hi! I only talk to people my owner has approved.\n"
            f"Your pairing code is {code} (valid for {ttl / 60:g} minutes). "
            f"Ask the owner to run:\n\nnanobot pairing approve {code}")


class AccessGate:
    """The ``channels.base.AccessGate`` every channel consults before anything reaches the bus."""

    def __init__(self, store: PairingStore, notify_owner: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.store = store
        self.notify_owner = notify_owner
        self._notices: list[float] = []  # when the owner was last told of requests (rate-limited)
        # Strangers answered recently, until when: their next messages cost one lookup (were they
        # approved meanwhile?) and no write, no log line. Strangers can send thousands.
        self._quiet_until: dict[tuple[str, str], float] = {}
        self._codes: deque[float] = deque()  # when pairing work was last done, for codes_per_minute
        self._told_taken: set[tuple[str, str, str]] = set()  # names seen with a new holder, already said

    async def vouched(self, channel: str, who: Identity, entries: list[str], moves: Moves) -> Identity:
        """``who``, as far as the name ``entries`` list (``moves``: a username, or a phone number)
        is still the account first seen with it here; else known by their account alone
        (``nanobot.handles``), said once in the log (and to the owner, of a username)."""
        if (held := moving_name(who, moves, entries)) is None and moves == "id" and who.handle and (
                await self.store.is_paired(channel, who.id) or await self.store.holders.held(channel, who.id)):
            held = (who.id, who.handle)  # pairing named the number as much as the config does
        if held is None or (holder := await self.store.holders.holder(channel, *held)) == held[1]:
            return who
        name, account = held
        if (channel, name, account) not in self._told_taken:
            self._told_taken.add((channel, name, account))
            shown = f"@{who.handle}" if moves == "handle" else name
            log.warning("%s: %s is now account %s's, not %s's as when first seen; not matched by it", channel, shown,
                        account, holder)
            if moves == "handle":  # (a number's owner chat may be that number: the notice would reach its new holder)
                await self._tell_owner(f"{channel}: {shown} is now account {account}'s, not {holder}'s as when your "
                                       "config named it first; they are not let in by it (if it is the same person, "
                                       f"list {account} in allowFrom or owners)")
        return Identity(who.id, None, who.name) if moves == "handle" else Identity(account, None, who.name)

    async def is_allowed(self, channel: str, who: Identity, allow_from: list[str]) -> bool:
        """Admitted already (listed or paired)? Side-effect free: no code is issued."""
        return listed(allow_from, who) or await self.store.is_paired(channel, who.id)

    async def check(self, channel: str, who: Identity, allow_from: list[str], is_private: bool,
                    chat_id: str | None = None) -> tuple[bool, str | None]:
        if await self.is_allowed(channel, who, allow_from):
            return True, None
        # What the owner is shown: a vouched handle as such, a display name as what it is (a claim).
        sender_id, sender_name = who.id, f"@{who.handle}" if who.handle else who.name and f"calls itself {who.name!r}"
        if not is_private:
            return False, None
        now = self.store.clock()
        if self._quiet_until.get((channel, sender_id), 0.0) > now or self._pairing_busy(now):
            return False, None
        if len(self._quiet_until) > 10_000:
            self._quiet_until = {k: t for k, t in self._quiet_until.items() if t > now}
        self._quiet_until[(channel, sender_id)] = now + self.store.policy.resend_interval
        code = await self.store.request(channel, sender_id, sender_name, chat_id)
        if code:
            log.warning("pairing: %s user %s (%s) asked to talk; code %s", channel, sender_id, sender_name, code)
            await self._tell_owner(f"{channel} user {sender_id} ({sender_name or '?'}) asked to talk to me. "
                                   f"Approve: nanobot pairing approve {code} (or: nanobot pairing deny {code})")
        return False, pairing_message(code, self.store.policy.code_ttl) if code else None

    def _pairing_busy(self, now: float) -> bool:
        """Whether this minute's pairing work is used up; if not, take one unit of it."""
        while self._codes and now - self._codes[0] >= 60:
            self._codes.popleft()
        if len(self._codes) >= self.store.policy.codes_per_minute:
            return True
        self._codes.append(now)
        return False

    async def _tell_owner(self, text: str) -> None:
        """At most ``OWNER_NOTICES_PER_HOUR``: a crowd of strangers must not flood the owner."""
        now = self.store.clock()
        self._notices = [t for t in self._notices if now - t < 3600]
        if self.notify_owner is None or len(self._notices) >= OWNER_NOTICES_PER_HOUR:
            return
        self._notices.append(now)
        await self.notify_owner(text)
