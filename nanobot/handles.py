"""How a config entry names a sender: by id, or by a handle the platform vouches for.

A Telegram or Discord username is vouched for by the platform only while its user keeps it:
one given up may be taken by anyone next. So a handle named in ``allowFrom`` or ``owners`` is
held to the user id it was first seen with here (``HandleHolders``); someone who takes it later
is matched by their id alone (``AccessGate.vouched``).
"""

from __future__ import annotations

from nanobot.bus import Identity
from nanobot.database import Database, Migrations

_HOLDERS = """CREATE TABLE handle_holders (  -- a handle named in the config, and the user id first seen with it
    channel TEXT NOT NULL, handle TEXT NOT NULL, user_id TEXT NOT NULL, PRIMARY KEY (channel, handle));"""
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


class HandleHolders:
    """Which user id each handle named in the config belongs to here: the first seen with it.
    Written once per handle (the first writer wins among workers), then known in memory."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._known: dict[tuple[str, str], str] = {}

    @classmethod
    async def open(cls, db: Database) -> HandleHolders:
        await db.migrate("handles", MIGRATIONS)
        return cls(db)

    async def holder(self, channel: str, handle: str, user_id: str) -> str:
        """The user id ``handle`` belongs to on ``channel``: ``user_id``'s if it is seen first."""
        key = (channel, handle.lower())
        if (known := self._known.get(key)) is None:
            await self.db.execute("INSERT INTO handle_holders (channel, handle, user_id) VALUES ($1, $2, $3) "
                                  "ON CONFLICT DO NOTHING", *key, user_id)
            known = self._known[key] = str(await self.db.fetchval(
                "SELECT user_id FROM handle_holders WHERE channel = $1 AND handle = $2", *key))
        return known
