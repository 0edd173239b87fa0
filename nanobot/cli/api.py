"""``nanobot api keys add NAME [--owner] | list | revoke NAME``: keys for the gateway's API."""

from __future__ import annotations

import asyncio
import sys
import time

import typer

from nanobot.cli.common import get_config, table
from nanobot.config import Config

api_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="The OpenAI-compatible API (gateway.api).")
keys_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="API keys: add one (shown once), list them, revoke one.")
api_app.add_typer(keys_app, name="keys")


@keys_app.command("add")
def keys_add(ctx: typer.Context, name: str = typer.Argument(..., help="who or what uses it; its chat is api:NAME"),
             owner: bool = typer.Option(False, "--owner", help="an owner key: its chats act for the owner")) -> None:
    """Make a key; it is printed once (only its hash is kept)."""

    async def add(keys):  # type: ignore[no-untyped-def]
        return await keys.add(name, owner=owner)

    key = with_keys(get_config(ctx), add)
    typer.echo(key)
    typer.echo(f"(the key for {name}, {'an owner' if owner else 'a member'} key; it is not shown again)", err=True)


@keys_app.command("list")
def keys_list(ctx: typer.Context) -> None:
    """Every key's name, kind and state (never the key)."""

    async def listing(keys):  # type: ignore[no-untyped-def]
        return await keys.list()

    found = with_keys(get_config(ctx), listing)
    if not found:
        typer.echo("No API keys (nanobot api keys add NAME).")
        return
    rows = [[key.name, "owner" if key.owner else "member", _day(key.created),
             f"revoked {_day(key.revoked)}" if key.revoked else "active"] for key in found]
    typer.echo(table([["NAME", "KIND", "MADE", "STATE"], *rows]))


def _day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(at))


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context, name: str = typer.Argument(..., help="the key's name")) -> None:
    """Stop a key from working (a running gateway notices within seconds)."""

    async def revoke(keys):  # type: ignore[no-untyped-def]
        return await keys.revoke(name)

    if not with_keys(get_config(ctx), revoke):
        typer.echo(f"nanobot: no active key named {name!r} (see: nanobot api keys list)", err=True)
        sys.exit(1)
    typer.echo(f"Revoked {name}.")


def with_keys(config: Config, action):  # type: ignore[no-untyped-def]
    """``action(keys)`` on the home's API keys (the database opened and closed around it); a
    ValueError it raises is one line, exit 2."""
    from nanobot.api.keys import ApiKeys
    from nanobot.database import open_database

    async def run():  # type: ignore[no-untyped-def]
        db = await open_database(config)
        try:
            return await action(await ApiKeys.open(db))
        finally:
            await db.close()

    try:
        return asyncio.run(run())
    except ValueError as exc:
        typer.echo(f"nanobot: {exc}", err=True)
        sys.exit(2)
