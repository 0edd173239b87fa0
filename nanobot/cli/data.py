"""``nanobot db migrate --to URL`` (a home into PostgreSQL), ``nanobot history list`` and
``export KEY`` (the chats; a chat's history as JSONL, from either store), ``nanobot backup
FILE`` and ``nanobot restore FILE``."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, TypeVar

import typer

from nanobot.chat_names_legacy import rename_legacy_chats
from nanobot.cli.common import fail, get_config
from nanobot.config import Config, url_without_password
from nanobot.config.gateway_settings import unencrypted_database
from nanobot.usage import plural
from nanobot.utf8 import for_terminal, json_for_terminal

T = TypeVar("T")

db_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="The store: copy a home into PostgreSQL.")
history_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Chat histories.")


@db_app.command("migrate")
def db_migrate(ctx: typer.Context,
               to: str = typer.Option(..., "--to", metavar="URL", help="postgresql://USER:PASSWORD@HOST:PORT/DATABASE"),
               replace: bool = typer.Option(False, "--replace", help="empty nanobot's tables in the target first, "
                                            "then copy this home afresh")) -> None:
    """Copy this home's nanobot.db and JSONL histories into PostgreSQL and compare the counts
    (exit 1 on a mismatch, nothing left half-done; running it again copies nothing twice).
    The home's gateway must be stopped."""
    from nanobot.gateway_lock import running_gateway_pid

    config = get_config(ctx)
    if not to.startswith(("postgresql://", "postgres://")):
        fail(f"--to must be a postgresql:// URL, not {url_without_password(to)!r}")
    if trouble := unencrypted_database(to):
        fail(f"--to: {trouble}")
    pid = running_gateway_pid(config.home)
    if pid:
        fail(f"a gateway is running on {config.home} (PID {pid}) and still writes this home: stop it first", 1)
    sys.exit(asyncio.run(_migrate(config, to, replace)))


async def _migrate(config: Config, url: str, replace: bool) -> int:
    from nanobot.database import SqliteDatabase
    from nanobot.home_copy import CountMismatch, copy_home
    from nanobot.postgres import PostgresDatabase, where
    from nanobot.session_files import SessionStore

    started = time.monotonic()
    sqlite = await SqliteDatabase.open(config.home / "nanobot.db")
    try:
        await rename_legacy_chats(sqlite, config.home / "sessions", config.workspace_path)  # a home from before
        target = await PostgresDatabase.open(url)
        try:
            report = await copy_home(sqlite, SessionStore(config.home / "sessions"), target, replace=replace)
        except CountMismatch as exc:
            typer.echo(f"nanobot: the counts differ, nothing was copied: {exc}. PostgreSQL holds rows this "
                       "home does not (a gateway wrote there, or an earlier copy ran while this home's gateway "
                       "was running). To make it this home's copy, run it again with --replace (it empties "
                       f"nanobot's tables at {where(url)} first)", err=True)
            return 1
        finally:
            await target.close()
    finally:
        await sqlite.close()
    for line in report.lines():
        typer.echo(line)
    if not report.copied:
        typer.echo(f"Nothing to copy: PostgreSQL at {where(url)} holds this home already. Set database.url to it "
                   "to use it.")
        return 0
    typer.echo(f"Copied {config.home} into PostgreSQL at {where(url)} in {time.monotonic() - started:.1f} s. "
               "Set database.url to it to use it.")
    return 0


@db_app.command("set-workspace")
def db_set_workspace(ctx: typer.Context, path: Path = typer.Argument(..., help="the assistant's workspace, "
                                                                      "the same path on every worker")) -> None:
    """Record PATH as the assistant's workspace in PostgreSQL (the first worker records its own;
    every worker must use that one). Set agents.defaults.workspace to it on every worker too."""
    from nanobot.cluster.registry import record_workspace
    from nanobot.postgres import PostgresDatabase

    config = get_config(ctx)
    if not config.database.url:
        fail("database.url: the workspace is recorded for workers on PostgreSQL; this home uses SQLite")
    if not path.is_absolute() or not path.is_dir():
        fail(f"{path}: give the workspace's absolute path, a folder that exists")

    async def record() -> str | None:
        db = await PostgresDatabase.open(config.database.url)
        try:
            return await record_workspace(db, str(path))
        finally:
            await db.close()

    before = asyncio.run(record())
    typer.echo(f"The assistant's workspace is {path} (it was {before or 'not recorded'}). Restart the workers.")


@history_app.command("list")
def history_list(ctx: typer.Context,
                 prefix: str = typer.Argument("", help="only the chats whose key starts so, e.g. telegram:"),
                 limit: int = typer.Option(100, "--limit", min=1, metavar="N", help="at most this many")) -> None:
    """The chats with a history, most recently written first: their keys, for export."""
    keys = asyncio.run(_from_store(get_config(ctx), lambda store: store.chats(prefix, limit)))
    typer.echo("\n".join(for_terminal(key) for key in keys) if keys else "No chat has a history"
               + (f" whose key starts with {prefix!r}." if prefix else "."))


@history_app.command("export")
def history_export(ctx: typer.Context, key: str = typer.Argument(..., help="the chat, e.g. telegram:123456"),
                   out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="write here, not to stdout")) -> None:
    """A chat's history as JSONL (every record, in order), from the configured store."""
    records = asyncio.run(_from_store(get_config(ctx), lambda store: store.records(key)))
    if not records:
        fail(f"no history for {key!r} (nanobot history list shows the chats)", 1)
    text = "".join(json_for_terminal(r) + "\n" for r in records)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"Wrote {len(records)} records to {out}", err=True)


async def _from_store(config: Config, read: Callable[[Any], Awaitable[T]]) -> T:
    """``read(store)`` on the home's history store (the JSONL files, or PostgreSQL's rows)."""
    from nanobot.database import open_database
    from nanobot.session_files import SessionStore
    from nanobot.session_rows import DatabaseSessionStore

    db = await open_database(config)
    try:
        if config.database.engine == "sqlite":
            await rename_legacy_chats(db, config.home / "sessions", config.workspace_path)  # a home from before
            return await read(SessionStore(config.home / "sessions"))
        return await read(await DatabaseSessionStore.create(db))
    finally:
        await db.close()


def backup(ctx: typer.Context, file: Path = typer.Argument(..., metavar="FILE", help="the .tar.gz to write"),
           with_workspace: bool = typer.Option(False, "--with-workspace", help="the workspace too")) -> None:
    """Back this home up into one file, also while the gateway runs: the database (consistently),
    the histories, config.json; counts in its manifest."""
    from nanobot.backup import BackupError
    from nanobot.backup import backup as write_backup
    from nanobot.postgres import where

    config = get_config(ctx)
    if config.database.engine == "postgresql":
        fail(f"this home's state is in PostgreSQL ({where(config.database.url)}): back it up with pg_dump, "
             "e.g. pg_dump -Fc -d DATABASE > nanobot.dump (restore with pg_restore)")
    started = time.monotonic()
    try:
        manifest = write_backup(config.home, config.workspace_path, file, with_workspace=with_workspace)
    except (BackupError, OSError, sqlite3.Error) as exc:
        fail(f"backup failed: {exc}", 1)
    rows = sum(manifest["tables"].values())
    records = sum(manifest["histories"].values())
    typer.echo(f"Wrote {file}: {plural(rows, 'row')} in {plural(len(manifest['tables']), 'table')}, "
               f"{plural(records, 'history record')} in {plural(len(manifest['histories']), 'chat')}"
               f"{', and the workspace' if with_workspace else ''} "
               f"({time.monotonic() - started:.1f} s)")
    if left_out := manifest["links_left_out"]:
        typer.echo(f"Left out {plural(len(left_out), 'link')} in the workspace (links and named pipes are not "
                   "backed up): " + ", ".join(left_out[:5]) + (" …" if len(left_out) > 5 else ""))


def restore(ctx: typer.Context, file: Path = typer.Argument(..., metavar="FILE", help="a file nanobot backup wrote"),
            workspace: Path = typer.Option(None, "--workspace", metavar="PATH",
                                           help="restore the workspace here (the restored config then names it)")) -> None:
    """Restore a backup into an empty home (NANOBOT_HOME), checking its counts: all of it, or
    nothing."""
    from nanobot.backup import BackupError
    from nanobot.backup import restore as read_backup
    from nanobot.config import nanobot_home

    home = nanobot_home()
    try:
        manifest = read_backup(file, home, lambda: get_config(ctx).workspace_path,
                               workspace.expanduser().absolute() if workspace else None)
    except (BackupError, OSError, tarfile.TarError, KeyError, ValueError) as exc:
        fail(f"restore failed: {exc}", 1)
    typer.echo(f"Restored {file} into {home}: {sum(manifest['tables'].values())} rows, "
               f"{sum(manifest['histories'].values())} history records, counts checked")
