"""``nanobot onboard`` in a terminal: a few questions instead of 190 lines of JSON.

The model server (its URL and key, checked with one call that lists its models), the model,
the mode, and optionally one chat channel (its token and the owner's user id). Every answer
has a default (Enter keeps it), and each question has a flag for scripts, which skips it.
``--non-interactive``, or a stdin that is no terminal, asks nothing: the flags given are
written, the defaults for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer

from nanobot.config import Config

OPENAI = "https://api.openai.com/v1"
MODES = ("code", "tools", "hybrid")
CHANNELS = ("none", "telegram", "discord")
SHOWN_MODELS = 8


@dataclass
class Answers:
    """What flags already said (None: ask)."""

    api_base: str | None = None
    api_key: str | None = None
    model: str | None = None
    mode: str | None = None
    channel: str | None = None


def ask(config: Config, given: Answers, *, interactive: bool) -> Config:
    """``config`` with the answers in it (the model server, model, mode, one channel): what a
    flag gave, else (``interactive``) what the user typed, else the default."""
    def answer(flag: str | None, question: str, default: str, choices: tuple[str, ...] = (), **prompt: Any) -> str:
        if flag is not None or not interactive:
            return default if flag is None else flag
        while (said := str(typer.prompt(question, default=default, **prompt)).strip()) not in choices and choices:
            typer.echo(f"  One of: {', '.join(choices)}.")
        return said

    provider = config.provider_config()
    base = answer(given.api_base, "Model server URL (OpenAI, or a local one such as http://127.0.0.1:11434/v1)",
                  provider.api_base or OPENAI)
    key = answer(given.api_key, "API key (Enter for none: local servers)", provider.api_key,
                 hide_input=True, show_default=False)
    models = _models(base, key)
    model = answer(given.model, "Model", _suggested(config.agents.defaults.model, models))
    mode = answer(given.mode, "Mode: code (the model writes Python), tools (one call at a time) or hybrid", "code",
                  MODES)
    channel = answer(given.channel, "Chat channel: none, telegram or discord", "none", CHANNELS)
    if mode not in MODES or channel not in CHANNELS:
        raise typer.BadParameter(f"--mode is one of {', '.join(MODES)}; --channel one of {', '.join(CHANNELS)}")
    provider.api_base = None if base.rstrip("/") == OPENAI else base
    provider.api_key = key
    config.agents.defaults.model, config.agents.defaults.execution_mode = model, mode
    if channel != "none":
        if not interactive:
            raise typer.BadParameter(f"--channel {channel} asks for its token: run onboard in a terminal, "
                                     f"or set channels.{channel}.token in the config file")
        _channel(config, channel)
    return config


def _models(base: str, key: str) -> list[str]:
    """One call to the server (``GET /models``): says whether it answered, and what it serves."""
    import openai

    client = openai.OpenAI(base_url=base, api_key=key or "none", max_retries=0, timeout=15)
    try:
        names = sorted(m.id for m in client.models.list())
    except openai.APIStatusError as exc:
        typer.echo(f"  The server answered {exc.status_code}: {_reason(exc)}. Check the URL and key; "
                   "you can change them later in the config file.")
        return []
    except openai.APIError as exc:
        typer.echo(f"  The server did not answer ({type(exc).__name__}: {exc}). It is written anyway; "
                   "start the server, or change the URL later in the config file.")
        return []
    finally:
        client.close()
    more = f", and {len(names) - SHOWN_MODELS} more" if len(names) > SHOWN_MODELS else ""
    typer.echo(f"  The server answered: {len(names)} models ({', '.join(names[:SHOWN_MODELS])}{more}).")
    return names


def _reason(exc: object) -> str:
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or getattr(exc, "message", exc))


def _suggested(configured: str, served: list[str]) -> str:
    """The configured model if the server has it (or said nothing), else the first it serves."""
    return configured if not served or configured in served else served[0]


def _channel(config: Config, name: str) -> None:
    section = getattr(config.channels, name)
    section.token = typer.prompt(f"{name.capitalize()} bot token", hide_input=True)
    owner = typer.prompt(f"Your own {name.capitalize()} user id (a number; the bot answers only you "
                         "until you let others in)")
    section.enabled, section.allow_from, section.owners = True, [owner.strip()], [owner.strip()]
