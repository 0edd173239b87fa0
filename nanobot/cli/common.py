"""What every ``nanobot`` command shares: the one-line failure, the loaded config, a table."""

from __future__ import annotations

import typer

from nanobot import logs
from nanobot.config import Config, ConfigError, load_config
from nanobot.utf8 import for_terminal


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


def table(rows: list[list[str]]) -> str:
    """Columns lined up; cells shown safely (a member's job name, a run's output, a key's name)."""
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
