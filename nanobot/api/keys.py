"""API keys: made by ``nanobot api keys add``, stored as SHA-256 hashes (a key is 256 random
bits, so a fast hash is enough), checked by comparing the hash with every active one in
constant time. Checking costs no database write; the active keys are read again every few
seconds, so a key revoked from the CLI stops working within that time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from nanobot.database import Database, Migrations
from nanobot.trust import OwnerKeys

MIGRATIONS: Migrations = {
    "sqlite": ["CREATE TABLE api_keys (name TEXT PRIMARY KEY, key_hash TEXT NOT NULL, owner INTEGER NOT NULL, "
               "created REAL NOT NULL, revoked REAL);"],
    "postgresql": ["CREATE TABLE api_keys (name TEXT PRIMARY KEY, key_hash TEXT NOT NULL, owner INTEGER NOT NULL, "
                   "created DOUBLE PRECISION NOT NULL, revoked DOUBLE PRECISION);"],
}
KEY_PREFIX = "nb-"
NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")
REFRESH_S = 5.0


@dataclass(frozen=True)
class ApiKey:
    name: str
    owner: bool
    created: float
    revoked: float | None = None


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    async def open(cls, db: Database) -> ApiKeys:
        keys = cls(db)
        await keys.migrate()
        return keys

    async def migrate(self) -> None:
        await self.db.migrate("api_keys", MIGRATIONS)

    async def add(self, name: str, *, owner: bool = False) -> str:
        """A new key for ``name`` (returned once, never stored); ValueError for a bad or taken name."""
        if not NAME.fullmatch(name):
            raise ValueError(f"a key name is 1 to 40 letters, digits, '.', '_' or '-', not {name!r}")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        if not await self.db.execute(
                "INSERT INTO api_keys (name, key_hash, owner, created) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (name) DO NOTHING", name, key_hash(key), int(owner), time.time()):
            raise ValueError(f"there is a key named {name!r} already (revoked keys keep their name: "
                             "its chat history is theirs)")
        return key

    async def list(self) -> list[ApiKey]:
        return [ApiKey(r["name"], bool(r["owner"]), r["created"], r["revoked"])
                for r in await self.db.fetch("SELECT name, owner, created, revoked FROM api_keys ORDER BY created")]

    async def revoke(self, name: str) -> bool:
        return await self.db.execute("UPDATE api_keys SET revoked = $1 WHERE name = $2 AND revoked IS NULL",
                                     time.time(), name) > 0

    async def active(self) -> list[tuple[str, str, bool]]:
        """(name, hash, owner) of every key not revoked."""
        return [(r["name"], r["key_hash"], bool(r["owner"]))
                for r in await self.db.fetch("SELECT name, key_hash, owner FROM api_keys WHERE revoked IS NULL")]


class KeyCheck:
    """Which key a request carries: the active keys, read at most every ``refresh_s``."""

    def __init__(self, keys: ApiKeys, owners: OwnerKeys, *, refresh_s: float = REFRESH_S) -> None:
        self.keys = keys
        self.refresh_s = refresh_s  # a key added or revoked in another process counts after this
        self._active: list[tuple[str, str, bool]] = []
        self._read_at = float("-inf")
        self.owners = owners  # names of the owner keys, kept current (the agent decides trust from it)

    async def refresh(self) -> None:
        self._active = await self.keys.active()
        self._read_at = time.monotonic()
        self.owners.replace(name for name, _, owner in self._active if owner)

    @property
    def any_active(self) -> bool:
        """Whether a key existed at the last read."""
        return bool(self._active)

    async def find(self, key: str) -> tuple[str, bool] | None:
        """(name, owner) of the key, or None; every active hash is compared, in constant time."""
        if time.monotonic() - self._read_at > self.refresh_s:
            await self.refresh()
        wanted, found = key_hash(key), None
        for name, stored, owner in self._active:
            if hmac.compare_digest(wanted, stored):
                found = (name, owner)
        return found
