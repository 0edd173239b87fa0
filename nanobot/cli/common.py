"""What every ``nanobot`` command shares: the one-line failure and the loaded config."""

from __future__ import annotations

import typer

from nanobot import logs
from nanobot.config import Config, ConfigError, load_config


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"nanobot: {message}", err=True)
    raise typer.Exit(code)


def get_config(ctx: typer.Context) -> Config:
    try:
        config = load_config(ctx.obj.get("config") if ctx.obj else None)[0]
        logs.remember_secrets(config)
        return config
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable


def show_waiting(messages: list[str]) -> None:
    """What arrived in the terminal chat while nobody was there (cron jobs' output, say)."""
    if messages:
        typer.echo(f"While you were away ({len(messages)}):")
        for text in messages:
            typer.echo(f"  {text}")
        typer.echo("")
