"""``nanobot pairing``: admit people who wrote to the bot (list, approve, deny, revoke)."""

from __future__ import annotations

import asyncio
import sys

import typer

from nanobot.cli.common import get_config
from nanobot.config import Config
from nanobot.utf8 import for_terminal

pairing_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Admit people who wrote to the bot: list codes, approve or deny one, revoke an approval.")


@pairing_app.command("list")
def pairing_list(ctx: typer.Context) -> None:
    """Pending pairing codes and approved users."""
    asyncio.run(_pairing_list(get_config(ctx)))


@pairing_app.command("approve")
def pairing_approve(ctx: typer.Context, code: str = typer.Argument(..., help="the code the user was sent")) -> None:
    """Let the user behind CODE talk to the bot; a running gateway admits them at once."""
    sys.exit(asyncio.run(_pairing_approve(get_config(ctx), code)))


@pairing_app.command("deny")
def pairing_deny(ctx: typer.Context, code: str = typer.Argument(..., help="the code the user was sent")) -> None:
    """Refuse the user behind CODE: the code is dropped and they get no new one."""
    sys.exit(asyncio.run(_with_pairing(get_config(ctx), lambda store: store.deny(code),
                                       "Denied {channel} user {sender_id}.")))


@pairing_app.command("revoke")
def pairing_revoke(ctx: typer.Context, channel: str = typer.Argument(..., help="telegram, discord, ..."),
                   user_id: str = typer.Argument(..., help="the user's id, as `pairing list` shows it")) -> None:
    """Take back an approval; the user no longer reaches the bot (they may ask again)."""

    async def revoke(store):
        if not await store.revoke(channel, user_id):
            raise ValueError(f"{channel} user {user_id} is not an approved user (see: nanobot pairing list)")
        return {"channel": channel, "sender_id": user_id}

    sys.exit(asyncio.run(_with_pairing(get_config(ctx), revoke, "Revoked {channel} user {sender_id}.")))


async def _with_pairing(config: Config, action, done: str) -> int:
    from nanobot.access import PairingStore
    from nanobot.database import open_database

    db = await open_database(config)
    try:
        result = await action(await PairingStore.open(db))
    except ValueError as exc:
        typer.echo(f"nanobot: {exc}", err=True)
        return 1
    finally:
        await db.close()
    fields = result if isinstance(result, dict) else vars(result)
    typer.echo(for_terminal(done.format(**{k: "?" if v is None else v for k, v in fields.items()})))
    return 0


async def _pairing_list(config: Config) -> None:
    import time

    from nanobot.access import PairingStore
    from nanobot.database import open_database

    db = await open_database(config)
    try:
        store = await PairingStore.open(db)
        pending, paired = await store.pending(), await store.paired()
    finally:
        await db.close()
    typer.echo("Pending codes:" if pending else "Pending codes: none")
    for r in pending:
        minutes = max(0, int((r.expires_at - time.time()) // 60))
        typer.echo(for_terminal(f"  {r.code}  {r.channel} {r.sender_id} ({r.sender_name or '?'}), "
                                f"expires in {minutes} min"))  # a stranger's name and address
    typer.echo("Approved users:" if paired else "Approved users: none")
    for u in paired:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(u.approved_at))
        typer.echo(for_terminal(f"  {u.channel} {u.sender_id} ({u.sender_name or '?'}), since {since}"))


async def _pairing_approve(config: Config, code: str) -> int:
    return await _with_pairing(config, lambda store: store.approve(code),
                               "Approved {channel} user {sender_id} ({sender_name}); a running gateway tells them.")
