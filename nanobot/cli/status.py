"""``nanobot status``: where everything is, what runs, who the owner is, and usage so far."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nanobot.cli.common import get_config
from nanobot.config import Config, ProviderConfig, config_path
from nanobot.sqlite_file import HomeError, check_writable
from nanobot.usage import plural
from nanobot.utf8 import for_terminal

if TYPE_CHECKING:
    from nanobot.bus import Identity
    from nanobot.database import Database


def status(ctx: typer.Context,
           check: bool = typer.Option(False, "--check", help="also ask each model server whether it takes the key "
                                                             "and serves the models, and each enabled chat platform "
                                                             "whether it takes the credentials (one reading call "
                                                             "each); exit 1 if one refuses")) -> None:
    """Config path, workspace, provider, channels, cron jobs and usage so far."""
    config = get_config(ctx)
    path, _ = config_path(ctx.obj.get("config"))
    asyncio.run(_status(config, path))
    if check and not all([_checked(label, ask) for label, ask in _checks(config)]):  # every one asked
        raise typer.Exit(1)


def _checks(config: Config) -> list[tuple[str, Callable[[], str]]]:
    """What ``--check`` asks: each model server the config names (with the models asked of it:
    the default's, the fallbacks', /model's choices, the overrides', transcription's, speech's),
    then each enabled built-in channel's platform (a plugin's channel says it at its start)."""
    from nanobot.cli import credentials

    wanted: dict[str, list[str]] = {}
    for provider, model in config.models_in_use():
        wanted.setdefault(provider, []).append(model)
    return [(f"model server {name}", partial(_served, config.provider_config(name), models))
            for name, models in wanted.items()] + \
        [(name, partial(credentials.check, name, getattr(config.channels, name)))
         for name in config.channels.enabled_names() if name in credentials.CHECKS]


def _served(server: ProviderConfig, models: list[str]) -> str:
    from nanobot.cli.credentials import OPENAI, served_models

    served = served_models(server.api_base or OPENAI, server.api_key)
    unlisted = [model for model in dict.fromkeys(models) if served and model not in served]  # a typo?
    return f"answered, {plural(len(served), 'model')}" + (f"; it lists no {', '.join(unlisted)}" if unlisted else "")


def _checked(label: str, ask: Callable[[], str]) -> bool:
    """One line: what ``ask`` learnt; False when it was refused."""
    from nanobot.cli.credentials import NoAnswer, Refused

    try:
        said, taken = ask(), True
    except NoAnswer as exc:
        said, taken = f"no answer ({exc})", True
    except Refused as exc:
        said, taken = f"REFUSED: {exc}", False
    typer.echo(for_terminal(f"Check:     {label}: {said}"))
    return taken


async def _status(config: Config, path: Path) -> None:
    from nanobot.access import PairingStore
    from nanobot.database import open_database
    from nanobot.tasks import TaskStore
    from nanobot.postgres import where
    from nanobot.usage import UsageStore

    check_writable(config.home)
    settings = config.agents.defaults
    provider = config.providers.get(settings.provider)
    typer.echo(f"Config:    {path}{'' if path.exists() else ' (missing: defaults in use; run nanobot onboard)'}")
    typer.echo(f"Home:      {config.home}")
    typer.echo(f"Workspace: {config.workspace_path}")
    typer.echo(f"Provider:  {settings.provider} ({provider.api_base if provider and provider.api_base else 'default base'}"
               f", key {'set' if provider and provider.api_key else 'not set'}), model {settings.model}, "
               f"mode {settings.execution_mode}")
    typer.echo(f"Voice:     {voice_line(config)}")
    typer.echo(f"Budget:    {budget_line(config)}")
    for line in gateway_lines(config):
        typer.echo(for_terminal(line))  # why a channel or an MCP server is down: a server's words, maybe
    sqlite = config.database.engine == "sqlite"
    typer.echo(f"Database:  {'SQLite, ' + str(config.home / 'nanobot.db') if sqlite else 'PostgreSQL at ' + where(config.database.url)}")
    typer.echo(f"Disk:      {_disk_line(config.home)}")
    try:
        db = await open_database(config)
    except HomeError as exc:  # what needs the database waits for it: say so, after what could be said
        typer.echo("           UNREACHABLE now: a running gateway keeps messages and replies waiting until it "
                   "is back")
        for line in trust_lines(config, None):
            typer.echo(line)
        typer.echo(f"nanobot: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        pairing = await PairingStore.open(db)
        held = await pairing.holders.all()  # the account each listed name is held to
        for line in trust_lines(config, await _owner_keys(db), await pairing.owner_chats(), held):
            typer.echo(for_terminal(line))  # an owner's handle, as the platform gave it
        typer.echo(for_terminal(f"Cron jobs: {await _cron_line(db)}"))  # (a member's job names)
        typer.echo(f"Delivery:  {await _delivery_line(db)}")
        typer.echo(f"Tasks:     {await (await TaskStore.open(db)).status_line()}")
        if not sqlite:
            for line in await _worker_lines(db):
                typer.echo(line)
        typer.echo(f"API:       {await _api_line(config, db)}")
        totals = await (await UsageStore.create(db)).totals()
        if not totals:
            typer.echo("Usage:     none yet")
        for mode, t in sorted(totals.items()):
            typer.echo(f"Usage [{mode}]: {t.summary()}")
        for line in await (await UsageStore.create(db)).cost_lines(settings.timezone):
            typer.echo(for_terminal(line))  # why a call failed: the model server's words
    finally:
        await db.close()


DISK_LOW_BYTES = 16 * 1024 * 1024  # below this the database and histories cannot be relied on to grow


def _disk_line(home: Path) -> str:
    import shutil

    free = shutil.disk_usage(home).free
    if free < DISK_LOW_BYTES:
        return (f"FULL ({free / 1048576:.1f} MB free on {home}): new messages cannot be stored; they wait "
                "with the platform and are answered once there is room")
    return f"{free / 1073741824:.1f} GB free on {home}"


async def _owner_keys(db: Database) -> list[str]:
    from nanobot.api.keys import ApiKeys

    return [name for name, _, owner in await (await ApiKeys.open(db)).active() if owner]


async def _api_line(config: Config, db: Database) -> str:
    from nanobot.api.keys import ApiKeys

    keys = await (await ApiKeys.open(db)).active()
    owners = sum(1 for _, _, owner in keys if owner)
    counted = f"{plural(len(keys), 'active key')}, {owners} of them owner keys"
    api = config.gateway.api
    return f"http://{api.listen}/v1 when the gateway runs; {counted}" if api.enabled else \
        f"off (gateway.api.enabled); {counted}"


async def _delivery_line(db: Database) -> str:
    """What the durable intake and the outbox hold: messages not yet answered, replies not yet
    taken by their platform, and replies refused in the last 3 days."""
    from nanobot.delivery.store import DeliveryStore

    store = await DeliveryStore.open(db)
    try:
        waiting, unsent, failed = await store.backlog()
    finally:
        await store.close()
    return f"{plural(waiting, 'message')} not yet answered, {plural(unsent, 'reply', 'replies')} not yet sent, " \
        f"{failed} refused"


async def _worker_lines(db: Database) -> list[str]:
    from nanobot.cluster.registry import worker_lines

    if await db.fetchval("SELECT to_regclass('workers')") is None:
        return ["Workers:   none has run on this database yet"]
    return await worker_lines(db)


def gateway_lines(config: Config) -> list[str]:
    """Whether a gateway runs on this home, and each enabled channel's state in it."""
    from nanobot.gateway_lock import gateway_states, running_gateway_pid

    pid = running_gateway_pid(config.home)
    states = gateway_states(config.home, pid, "channels") if pid else {}
    mcp = gateway_states(config.home, pid, "mcp") if pid else {}
    channels = [f"{name}: {states.get(name, 'not running' if pid else 'gateway not running')}"
                for name in config.channels.enabled_names()]
    servers = [f"{name}: {mcp.get(name, 'gateway not running' if not pid else 'not started')}"
               if s.enabled else f"{name}: disabled" for name, s in config.tools.mcp_servers.items()]
    lines = [f"Gateway:   {f'running (PID {pid})' if pid else 'not running'}",
             *_one_a_line("Channels:  ", channels or ["none enabled"])]
    lines += _one_a_line("MCP:       ", servers)
    cooling = {name: until - time.time() for name, until in
               (gateway_states(config.home, pid, "cooling_until") if pid else {}).items() if until > time.time()}
    if cooling:
        lines.append("Cooldown:  " + ", ".join(f"{name} ({left:.0f} s left, fallbacks first)"
                                               for name, left in cooling.items()))
    return lines


def _one_a_line(label: str, items: list[str]) -> list[str]:
    """``items`` one a line under ``label``: a channel's reason for being down is long."""
    return [(label if i == 0 else " " * len(label)) + item for i, item in enumerate(items)]


def trust_lines(config: Config, owner_keys: list[str] | None, heard: dict[str, tuple[str, Identity]] | None = None,
                held: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Who the owner is (``owner_keys``: the owner API keys' names, None when the database is
    unreachable; ``held``: the account each listed name is held to), where notices go
    (``heard``: the owner chats remembered), where the shell stands, and what steers the
    assistant unexpectedly."""
    from nanobot.skills import shadowing_skills
    from nanobot.tools.shell import shell_status
    from nanobot.trust import owner_chat, owner_ids

    held = held or {}

    def shown(channel: str, entry: str) -> str:
        account = held.get((channel, entry)) or held.get((channel, entry.removeprefix("@").lower()))
        return f"{entry} (account {account})" if account and account != entry else entry

    owners = [f"{name} {', '.join(shown(name, o) for o in owner_ids(section)) or '(none)'} in private chats"
              if section.owners_verified
              else f"{name} none (its senders are unverified without trustedAuthServId)"
              for name in config.channels.enabled_names() if (section := config.channels.section(name))]
    if owner_keys:
        owners.append(f"the API key{'s' if len(owner_keys) > 1 else ''} {', '.join(owner_keys)}")
    elif owner_keys is None:
        owners.append("owner API keys (unknown: the database is unreachable)")
    lines = [*_one_a_line("Owners:    ", [*owners, "the terminal"]),
             f"Notices:   {owner_chat(config, heard, notices=True) or _unsent_notices(config)}",
             f"Shell:     {shell_status(config)}"]
    shadowing = shadowing_skills(config.workspace_path)
    if shadowing:
        lines.append(f"Skills:    workspace skills REPLACE built-ins: {', '.join(shadowing)}")
    return lines


SPOKEN_WHEN = {"whenVoice": "to a voice note", "always": "always", "never": "never"}


def voice_line(config: Config) -> str:
    """Whether voice notes are heard, and when replies are spoken (a chat's /voice aside)."""
    heard, spoken = config.tools.transcription, config.tools.speech
    hears = f"voice notes transcribed ({heard.provider}/{heard.model})" if heard.provider \
        else "voice notes not transcribed (tools.transcription)"
    speaks = f"replies spoken {SPOKEN_WHEN.get(spoken.reply, spoken.reply)} ({spoken.provider}/{spoken.model}, " \
             f"voice {spoken.voice}; /voice per chat)" if spoken.provider else "replies not spoken (tools.speech)"
    return f"{hears}; {speaks}"


def budget_line(config: Config) -> str:
    """The daily budgets, and the models whose calls they cannot see (no price: they cost 0)."""
    daily, share = config.agents.defaults.daily_budget_usd, config.member_budget_usd()
    if daily is None and share is None:
        return "none (agents.defaults.dailyBudgetUsd)"
    parts = [f"${daily:.2f} a day"] if daily is not None else []
    if share is not None:
        parts.append(f"member chats ${share:.2f}")
    if unpriced := config.unpriced_models():
        parts.append(f"NOT COUNTED, no price (providers.<name>.prices): {', '.join(unpriced)}")
    return "; ".join(parts)


async def _cron_line(db: Database) -> str:
    """How many jobs, how many paused, and which failed at their last run (nanobot cron runs JOB says why)."""
    try:
        rows = await db.fetch("SELECT id, name, enabled, last_status FROM cron_jobs ORDER BY name")
    except Exception:  # no cron table yet: nothing was ever scheduled
        return "0"
    paused = sum(1 for row in rows if not row["enabled"])
    failing = [f"{row['name']} ({row['id']})" for row in rows if row["last_status"] == "error"]
    return ", ".join([str(len(rows)), *([f"{paused} paused"] if paused else []),
                      *([f"last run failed: {'; '.join(failing)}"] if failing else [])])


def _unsent_notices(config: Config) -> str:
    """Where notices are when no owner chat takes them (with the API and the page alone, no
    private chat can ever come)."""
    why = "no owner has written to me in private yet" if config.channels.enabled_names() else "no chat channel is enabled"
    page = "on the page's Status view" if config.gateway.api.enabled \
        else "kept for the page's Status view (gateway.api.enabled)"
    return f"not sent ({why}): in the log, {page}"
