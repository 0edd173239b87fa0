"""``nanobot onboard`` in a terminal: a few questions instead of 190 lines of JSON.

The model server (its URL and key, checked with one call that lists its models), the model,
the mode, and optionally one chat channel (what its section needs, checked with one call to the
platform and asked again if refused, and the owner's user id, checked as the config checks it;
email asks for the mailbox's servers, WhatsApp for Meta's app and says what to set there).
Every answer has a default (Enter keeps it), and each question has a flag for scripts, which
skips it. ``--non-interactive``, or a stdin that is no terminal, asks nothing: the flags given
are written, the defaults for the rest.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import typer
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from nanobot.cli import credentials
from nanobot.cli.credentials import OPENAI
from nanobot.config import ChannelSection, Config, own_account, write_private
from nanobot.config.base import url_trouble
from nanobot.utf8 import for_terminal

MODES = ("code", "tools", "hybrid")
CHANNELS = ("none", "telegram", "discord", "slack", "matrix", "signal", "email", "whatsapp")
# How onboard asks for each key a channel's section lists as missing (``missing()``).
QUESTIONS = {
    "token": "{Name} bot token",
    "bot_token": "Slack bot token (xoxb-...; make the app from docs/slack-app-manifest.json)",
    "app_token": "Slack app-level token, for Socket Mode (xapp-...)",
    "homeserver": "Matrix homeserver URL (https://matrix.example.org)",
    "user_id": "The bot's Matrix user id (@bot:example.org)",
    "password": "The bot account's password (it signs in as a device of its own, which encrypted chats need)",
    "account": "The bot's own Signal number (not yours), registered or linked with signal-cli (+15550001111)",
    "phone_number_id": "The phone number's ID (Meta app: WhatsApp, API Setup; not the number itself)",
    "access_token": "A permanent access token (a system user's, with whatsapp_business_messaging)",
    "app_secret": "The app secret (App settings, Basic): Meta signs each webhook post with it",
}
OWNER_IDS = {"telegram": "a number; Enter: send the bot a message instead", "discord": "a number",
             "slack": "U...: a profile's menu, Copy member ID", "matrix": "@you:example.org", "signal": "+15550002222",
             "email": "your address, ada@example.org", "whatsapp": "your number with its country code, +15550002222"}
BRANDS = {"whatsapp": "WhatsApp"}  # as the platform writes its name, where str.capitalize() would not
SHOWN_MODELS = 8


@dataclass
class Answers:
    """What flags already said (None: ask)."""

    api_base: str | None = None
    api_key: str | None = None
    model: str | None = None
    mode: str | None = None
    channel: str | None = None
    page: bool | None = None


def ask(config: Config, given: Answers, *, interactive: bool) -> Config:
    """``config`` with the answers in it (the model server, model, mode, one channel): what a
    flag gave, else (``interactive``) what the user typed, else the default."""
    def answer(flag: str | None, question: str, default: str, choices: tuple[str, ...] = (),
               check: Callable[[str], str | None] = lambda said: None, **prompt: Any) -> str:
        if flag is not None or not interactive:
            said = default if flag is None else flag
            if trouble := check(said):
                raise typer.BadParameter(trouble)
            return said
        while trouble := (check(said := str(typer.prompt(question, default=default, **prompt)).strip()) or
                          (f"One of: {', '.join(choices)}" if choices and said not in choices else None)):
            typer.echo(f"  {trouble}.")
        return said

    provider = config.provider_config()
    # Checked before the key goes there (``_models``): never in plain text across the network.
    base = answer(given.api_base, "Model server URL (OpenAI, or a local one such as http://127.0.0.1:11434/v1)",
                  provider.api_base or OPENAI, check=url_trouble)
    key = answer(given.api_key, "API key (Enter for none: local servers)", provider.api_key,
                 hide_input=True, show_default=False)
    models = _models(base, key)
    model = answer(given.model, "Model", _suggested(config.agents.defaults.model, models))
    if models and model not in models:  # a typo would fail every turn; some servers list less than they serve
        _say(f"  It lists no {model}: check the name (written as given).")
    mode = answer(given.mode, "Mode: code (the model writes Python), tools (one call at a time) or hybrid", "code",
                  MODES)
    channel = answer(given.channel, f"Chat channel: {', '.join(CHANNELS)}", "none", CHANNELS)
    provider.api_base = None if base.rstrip("/") == OPENAI else base
    provider.api_key = key
    config.agents.defaults.model, config.agents.defaults.execution_mode = model, mode
    if channel != "none":
        setattr(config.channels, channel, _channel(getattr(config.channels, channel), channel))
    page = answer({True: "y", False: "n"}.get(given.page), f"The web page and the API on "
                  f"http://{config.gateway.api.listen}/ (y/n)", "n", ("y", "n"))
    config.gateway.api.enabled = page == "y"
    return config


def page_key(config: Config) -> None:
    """The first owner key, shown once, for signing in on the page; none when the home has an
    owner key already (``nanobot api keys add NAME --owner`` makes more)."""
    from nanobot.cli.api import with_keys

    async def make(keys) -> str | None:  # type: ignore[no-untyped-def]
        if any(owner for _, _, owner in await keys.active()):
            return None
        taken = {key.name for key in await keys.list()}  # a revoked key keeps its name (and its chats)
        return await keys.add(next(name for name in ("page", *(f"page-{n}" for n in range(2, 1000)))
                                   if name not in taken), owner=True)

    if key := with_keys(config, make):
        typer.echo(f"Your owner key for the page (shown once; keep it like a password): {key}")


def amend(path: Path, config: Config, given: Answers) -> bool:
    """``onboard`` with a config there: ``--channel NAME`` sets that channel up (its questions),
    ``--page``/``--no-page`` turns the page and the API on or off; each written into the file's
    own JSON with the rest as it was (what the environment sets stays out of the file), the old
    file backed up. Whether either was asked for."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    changed = []
    if given.channel not in (None, "none"):
        channels = raw.setdefault("channels", {})
        section = type(getattr(config.channels, given.channel)).model_validate(channels.get(given.channel) or {})
        channels[given.channel] = _channel(section, given.channel).model_dump(by_alias=True, mode="json")
        changed.append(f"channels.{given.channel}")
    if given.page is not None and raw.get("gateway", {}).get("api", {}).get("enabled") is not given.page:
        raw.setdefault("gateway", {}).setdefault("api", {})["enabled"] = given.page
        changed.append("gateway.api.enabled")
    if changed:
        back_up(path, f"everything but {' and '.join(changed)} kept")
        write_private(path, json.dumps(raw, indent=2) + "\n")
        typer.echo(f"Wrote {' and '.join(changed)} into {path}")
    return bool(changed) or given.page is not None


def back_up(path: Path, kept: str) -> None:
    backup = path.with_name(path.name + ".bak")
    write_private(backup, path.read_text(encoding="utf-8"))
    typer.echo(f"Backed up the old config to {backup} ({kept})")


def check_flags(given: Answers, *, interactive: bool) -> None:
    """The flags' answers checked before anything is backed up, asked or written: a mode or channel
    that does not exist, a channel whose credentials only a terminal can give."""
    if given.mode is not None and given.mode not in MODES:
        raise typer.BadParameter(f"--mode is one of {', '.join(MODES)}")
    if given.channel is not None and given.channel not in CHANNELS:
        raise typer.BadParameter(f"--channel is one of {', '.join(CHANNELS)}")
    if given.channel not in (None, "none") and not interactive:
        raise typer.BadParameter(f"--channel {given.channel} asks for its credentials: run onboard in a terminal, "
                                 f"or set channels.{given.channel} in the config file")


def _models(base: str, key: str) -> list[str]:
    """One call to the server (``GET /models``): says whether it answered, and what it serves."""
    try:
        names = credentials.served_models(base, key)
    except credentials.Refused as exc:
        _say(f"  {exc}; you can change them later in the config file.")
        return []
    except credentials.NoAnswer as exc:
        _say(f"  No answer: {exc}. It is written anyway; start the server, or change the URL later in the "
             "config file.")
        return []
    more = f", and {len(names) - SHOWN_MODELS} more" if len(names) > SHOWN_MODELS else ""
    _say(f"  The server answered: {len(names)} models ({', '.join(names[:SHOWN_MODELS])}{more}).")
    return names


def _brand(name: str) -> str:
    return BRANDS.get(name, name.capitalize())


def _say(line: str) -> None:
    """A line with what a server or a stranger wrote in it: their control characters written out,
    so none moves the cursor or retitles the terminal."""
    typer.echo(for_terminal(line))


def _suggested(configured: str, served: list[str]) -> str:
    """The configured model if the server has it (or said nothing), else the first it serves."""
    return configured if not served or configured in served else served[0]


def _channel(section: ChannelSection, name: str) -> ChannelSection:
    """The section, enabled, with what it lacked asked for (tokens typed unseen), then the
    owner's id until the section takes it: an id of the wrong shape would admit nobody."""
    section.enabled = True
    if name == "whatsapp" and not section.verify_token:  # ours to choose: made here, pasted into Meta's app
        section.verify_token = secrets.token_urlsafe(24)
    section = _credentials(name, section)
    if name == "whatsapp":
        webhook = section.webhook
        typer.echo(f"  In Meta's app (WhatsApp, Configuration): callback URL https://<your host>{webhook.path}, "
                   f"served over TLS in front of {webhook.listen}; verify token {section.verify_token}; "
                   "subscribe to messages.")
    if section.owners:  # set up before (onboard --channel on a config there): who may talk stays as it was
        typer.echo(f"  Owners kept: {', '.join(section.owners)} (channels.{name}.owners and allowFrom in the file)")
        return section
    return _taken(
        section, f"Your own {_brand(name)} user id ({OWNER_IDS[name]}; the bot answers only you until you let "
                 "others in)", lambda owner: {"allowFrom": [owner], "owners": [owner]}, check=_not_the_bots,
        ask_with=_id_or_message(section) if name == "telegram" else typer.prompt)


def _id_or_message(section: ChannelSection) -> Callable[..., str]:
    """Telegram's question for the owner's id, where Enter reads it off a message they send the
    bot now (Telegram shows nobody their own id), taken once they say the name is theirs."""
    def prompt_or_wait(question: str, **prompt: Any) -> str:
        while not (said := str(typer.prompt(question, default="", show_default=False, **prompt)).strip()):
            typer.echo("  Send your bot any message on Telegram now (I wait up to 2 minutes).")
            for user_id, name in credentials.telegram_senders(section):
                if typer.confirm(for_terminal(f"  {name} (id {user_id}) wrote to the bot: is that you?"),
                                 default=False):
                    return user_id
            typer.echo("  No message of yours came (a gateway running with this token would read them first).")
        return said
    return prompt_or_wait


def _credentials(name: str, section: ChannelSection) -> ChannelSection:
    """``section`` with what it lacks asked for (tokens typed unseen; email: the mailbox), again
    while the platform refuses it (a typo); what the platform said is shown."""
    mailbox = name == "email"  # asked whole each time
    asked = [] if mailbox else [key for key, _ in section.missing()]
    while True:
        if mailbox:
            section = _mailbox(section)
        for key in asked:
            section = _taken(section, QUESTIONS[key].format(Name=_brand(name)),
                             lambda said: {to_camel(key): said}, secret=key.endswith(("token", "secret", "password")))
        try:
            _say(f"  {credentials.check(name, section)}")
            return section
        except credentials.NoAnswer as exc:
            _say(f"  No answer ({exc}). It is written anyway; check it later with: nanobot status --check")
            return section
        except credentials.Refused as exc:
            said = str(exc).rstrip(".")
            if exc.key not in asked and not mailbox:  # kept from the old config: theirs to mend there
                _say(f"  {said}: change it in the config file.")
                return section
            _say(f"  {said}. Once more:")


def _mailbox(section: ChannelSection) -> ChannelSection:
    """The bot's mailbox: its address, then its servers (named after its domain unless told
    otherwise) with one login for both, and the receiving server's name in Authentication-Results
    (without it no sender is vouched for, and every mail chat is a member chat)."""
    while "@" not in (address := typer.prompt("The bot's email address (assistant@example.org)").strip()):
        typer.echo("  An address has an @.")
    domain = address.rpartition("@")[2]
    imap = typer.prompt("IMAP server (TLS on 993)", default=f"imap.{domain}").strip()
    smtp = typer.prompt("SMTP server (STARTTLS on 587)", default=f"smtp.{domain}").strip()
    password = typer.prompt(f"The password of {address} (for both servers)", hide_input=True)
    login = {"username": address, "password": password}
    return _taken(section, "Your mail server's name in Authentication-Results, its authserv-id (mx.example.org; "
                           "Enter to skip: then every mail chat is a member chat)",
                  lambda name: {"address": address, "imap": {**section.imap.model_dump(), "host": imap, **login},
                                "smtp": {**section.smtp.model_dump(), "host": smtp, **login},
                                "trustedAuthServId": name or None}, default="", show_default=False)


def _taken(section: ChannelSection, question: str, values: Callable[[str], dict[str, Any]], *,
           secret: bool = False, check: Callable[[ChannelSection], str | None] = lambda taken: None,
           ask_with: Callable[..., Any] = typer.prompt, **prompt: Any) -> ChannelSection:
    """``section`` with the answer in it (``values``), asked (``ask_with``) again until the section
    takes it (and ``check`` finds nothing wrong)."""
    while True:
        said = str(ask_with(question, hide_input=secret, **prompt)).strip()
        try:
            taken = type(section).model_validate({**section.model_dump(by_alias=True), **values(said)})
        except ValidationError as exc:
            typer.echo(f"  {exc.errors()[0]['msg'].removeprefix('Value error, ')}.")
            continue
        if not (trouble := check(taken)):
            return taken
        typer.echo(f"  {trouble}.")


def _not_the_bots(section: ChannelSection) -> str | None:
    """The owner is someone else than the bot's own account (the config refuses that too)."""
    if (own := own_account(section)) and own in section.owners:
        return f"{own} is the bot's own account, whose messages it never reads: give it one of its own"
    return None
