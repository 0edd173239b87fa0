"""How a config entry names a sender: by id, or by a handle the platform vouches for; and the
names that change hands.

A platform vouches for a name only while its account keeps it. A Telegram or Discord username
given up may be taken by anyone next; a phone number given up is handed by the carrier to a
stranger, who registers Signal or WhatsApp with it (a new account: a new Signal UUID, a new
WhatsApp business-scoped id). So a name the config lists counts only for the account it was
first seen with here (``NameHolders``); whoever holds it later is known by their account alone
(``AccessGate.vouched``).
"""

from __future__ import annotations

from nanobot.bus import Identity, Moves
from nanobot.database import Database, Migrations

_HOLDERS = """CREATE TABLE name_holders (  -- a name the config lists, and the account first seen with it
    channel TEXT NOT NULL, name TEXT NOT NULL, holder TEXT NOT NULL, PRIMARY KEY (channel, name));"""
MIGRATIONS: Migrations = {"sqlite": [_HOLDERS], "postgresql": [_HOLDERS]}


def names_handle(entry: str, handle: str | None) -> bool:
    """Whether a config entry ("@ada", "ada") names this handle. An all-digit entry is an id and
    never matches a handle: a stranger must not get in by picking someone's id as their name."""
    entry = entry.strip().removeprefix("@")
    return bool(handle) and not entry.isdigit() and entry.lower() == str(handle).lower()


def listed(allow_from: list[str], who: Identity) -> bool:
    """Whether ``allowFrom`` names this sender: ``*``, their id, or the handle the platform
    vouches for (never a display name: ``Identity``)."""
    return any(entry.strip() in ("*", who.id) or names_handle(entry, who.handle) for entry in allow_from)


def moving_name(who: Identity, moves: Moves, entries: list[str]) -> tuple[str, str] | None:
    """(the name that may change hands, the account it names now), when ``entries`` list it and
    the platform gave both; else None (nothing to hold)."""
    if not (who.handle and who.id):
        return None
    if moves == "handle":
        return (who.handle.lower(), who.id) if any(names_handle(entry, who.handle) for entry in entries) else None
    return (who.id, who.handle) if who.id in (entry.strip() for entry in entries) else None


class NameHolders:
    """Which account each name the config lists belongs to here: the first seen with it.
    Written once per name (the first writer wins among workers), then known in memory."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._known: dict[tuple[str, str], str] = {}

    @classmethod
    async def open(cls, db: Database) -> NameHolders:
        await db.migrate("name_holders", MIGRATIONS)
        return cls(db)

    async def all(self) -> dict[tuple[str, str], str]:
        """(channel, name) -> the account each is held to (``nanobot status``)."""
        return {(row["channel"], row["name"]): row["holder"]
                for row in await self.db.fetch("SELECT channel, name, holder FROM name_holders")}

    async def held(self, channel: str, name: str) -> bool:
        """Whether ``name`` was ever held to an account here: it stays held once its listing or
        pairing is gone, so the account approved since it changed hands stays who it is."""
        return await self._read((channel, name)) is not None

    async def holder(self, channel: str, name: str, account: str) -> str:
        """The account ``name`` belongs to on ``channel``: ``account`` if it is seen first."""
        key = (channel, name)
        if (known := await self._read(key)) is None:
            await self.db.execute("INSERT INTO name_holders (channel, name, holder) VALUES ($1, $2, $3) "
                                  "ON CONFLICT DO NOTHING", *key, account)
            known = str(await self._read(key))  # the first writer's, among workers
        return known

    async def _read(self, key: tuple[str, str]) -> str | None:
        """The holder of ``key``, known in memory once read (a holder never changes)."""
        if key not in self._known and (holder := await self.db.fetchval(
                "SELECT holder FROM name_holders WHERE channel = $1 AND name = $2", *key)) is not None:
            self._known[key] = str(holder)
        return self._known.get(key)
