"""``nanobot db migrate --to URL``: a home's state (nanobot.db and the JSONL histories) copied
into PostgreSQL, then counted on both sides.

Everything goes in one transaction: a failure or a count that does not match leaves the target
as it was. Rows keep their ids (a reply's ``finishes``, a run's job), rows already there are
kept, so running it again copies nothing twice. ``replace`` first empties nanobot's tables in
the target (the way forward after a copy made while the home's gateway still ran, or a target
a gateway already wrote to).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from nanobot.access import MIGRATIONS as PAIRING
from nanobot.handles import MIGRATIONS as NAME_HOLDERS
from nanobot.api.keys import MIGRATIONS as API_KEYS
from nanobot.cron.store import MIGRATIONS as CRON
from nanobot.database import Migrations, Queries, SqliteDatabase
from nanobot.delivery.store import MIGRATIONS as DELIVERY
from nanobot.notices import MIGRATIONS as NOTICES
from nanobot.postgres import PostgresDatabase
from nanobot.sandbox.executor import STATE_MIGRATIONS as CODE_STATE
from nanobot.session_files import SessionStore
from nanobot.session_rows import MIGRATIONS as HISTORY
from nanobot.tasks import MIGRATIONS as TASKS
from nanobot.usage import MIGRATIONS as USAGE

# component -> (its migrations, its tables)
COMPONENTS: dict[str, tuple[Migrations, list[str]]] = {
    "usage": (USAGE, ["model_calls", "executions"]),
    "pairing": (PAIRING, ["pairing_requests", "paired_users", "denied_users", "owner_chats"]),
    "name_holders": (NAME_HOLDERS, ["name_holders"]),
    "cron": (CRON, ["cron_jobs", "cron_runs", "cron_meta"]),
    "delivery": (DELIVERY, ["inbound", "outbox", "channel_positions", "overheard", "kept"]),
    "code_state": (CODE_STATE, ["code_state"]),
    "api_keys": (API_KEYS, ["api_keys"]),
    "tasks": (TASKS, ["tasks"]),  # background tasks: the queued and running ones are resumed there
    "notices": (NOTICES, ["owner_notices"]),  # the last 30 days' notices, for the page
}
# Kept by triggers as the rows they count are copied: emptied with the rest by ``replace``, never copied.
DERIVED = ["usage_totals", "execution_totals"]
_CONVERT: dict[str, Callable[[Any], Any]] = {"double precision": float, "integer": int, "bigint": int, "text": str}


class CountMismatch(Exception):
    """After the copy a table (or a history) has another number of rows than the source."""


@dataclass
class CopyReport:
    # table -> (rows in the home, in PostgreSQL before, in PostgreSQL after)
    rows: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"{table}: {source} in the home, {after} in PostgreSQL ({after - before} copied now)"
                for table, (source, before, after) in self.rows.items()]

    @property
    def copied(self) -> int:
        return sum(after - before for _, before, after in self.rows.values())

    def differing(self) -> list[str]:
        return [f"{table}: {source} in the home, {after} in PostgreSQL"
                for table, (source, _, after) in self.rows.items() if source != after]


async def copy_home(sqlite: SqliteDatabase, histories: SessionStore, target: PostgresDatabase, *,
                    replace: bool = False) -> CopyReport:
    for component, (migrations, _) in COMPONENTS.items():
        await sqlite.migrate(component, migrations)  # a home an older nanobot wrote has its tables too
        await target.migrate(component, migrations)
    await target.migrate("history", HISTORY)
    report = CopyReport()
    async with target.transaction() as tx:
        if replace:
            tables = [t for _, (_, names) in COMPONENTS.items() for t in names if t != "cron_meta"]
            await tx.execute(f"TRUNCATE {', '.join([*tables, *DERIVED, 'history'])}")
            await tx.execute("DELETE FROM cron_meta WHERE key != 'change_token'")
        for component, (_, tables) in COMPONENTS.items():
            if await sqlite.fetchval("SELECT version FROM schema_versions WHERE component = $1", component):
                for table in tables:
                    report.rows[table] = await _copy_table(sqlite, tx, table)
        report.rows["history (records)"] = await _copy_histories(histories, tx)
        if report.differing():
            raise CountMismatch("; ".join(report.differing()))
    return report


async def _copy_table(sqlite: SqliteDatabase, tx: Queries, table: str) -> tuple[int, int, int]:
    rows = await sqlite.fetch(f"SELECT * FROM {table}")
    before = int(await tx.fetchval(f"SELECT count(*) FROM {table}"))
    types = {r[0]: r[1] for r in await tx.fetch(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1", table)}
    if rows:
        columns = list(rows[0].keys())
        values = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
        await tx.executemany(f"INSERT INTO {table} ({', '.join(columns)}) OVERRIDING SYSTEM VALUE VALUES ({values}) "
                             "ON CONFLICT DO NOTHING",
                             [[_as(types.get(c, ""), row[c]) for c in columns] for row in rows])
    if "id" in types and types["id"] == "bigint":  # the next id comes after the copied ones
        await tx.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                         f"GREATEST((SELECT max(id) FROM {table}), 1))")
    return len(rows), before, int(await tx.fetchval(f"SELECT count(*) FROM {table}"))


def _as(pg_type: str, value: Any) -> Any:
    """A SQLite value as the PostgreSQL column takes it (SQLite keeps 3 in a REAL column as 3)."""
    convert = _CONVERT.get(pg_type)
    return value if value is None or convert is None or isinstance(value, bytes) else convert(value)


async def _copy_histories(histories: SessionStore, tx: Queries) -> tuple[int, int, int]:
    """Each chat's records in order; a chat already copied whole is left alone."""
    source = before = after = 0
    for key in histories.keys():
        records = await histories.records(key)
        there = int(await tx.fetchval("SELECT count(*) FROM history WHERE session_key = $1", key))
        before += there
        if there == 0:
            await tx.executemany("INSERT INTO history (session_key, record) VALUES ($1, $2)",
                                 [(key, json.dumps(r, ensure_ascii=False)) for r in records])
            there = len(records)
        source, after = source + len(records), after + there
    return source, before, after
