"""The ``nanobot`` command. Heavy libraries (channels, scheduler, web) are imported inside the
commands that need them, so a one-shot ``nanobot agent -m`` starts fast. Each command group
has its module: agent.py (+ remote_chat.py, terminal_channel.py), status.py, pairing.py, data.py, api.py,
cron.py here, and mcp/cli.py."""

from __future__ import annotations

import logging
import os
import re
import resource
import sys
from functools import partial
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel

from nanobot import logs
from nanobot.cli.agent import agent
from nanobot.cli.api import api_app
from nanobot.cli.common import fail, get_config
from nanobot.cli.data import backup, db_app, history_app, restore
from nanobot.cli.pairing import pairing_app
from nanobot.cli.status import status
from nanobot.config import (Config, ConfigError, config_path, defaults_and_environment, load_config, private_dir,
                            write_private)
from nanobot.coordination import worker_id
from nanobot.sqlite_file import HomeError, check_writable
from nanobot.workspace_template import copy_template

log = logging.getLogger(__name__)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="nanobot: a self-hosted AI assistant whose model can answer with code.")


def _print_version(value: bool) -> None:
    if value:
        from nanobot import __version__

        typer.echo(f"nanobot {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(ctx: typer.Context,
                 config: Optional[Path] = typer.Option(None, "--config", metavar="PATH", help="config file (default $NANOBOT_HOME/config.json)"),
                 verbose: bool = typer.Option(False, "--verbose", "-v", help="log what the agent does"),
                 version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                              help="print the version and exit")) -> None:
    # Everything nanobot creates is its owner's alone (0600 files, 0700 folders): the home,
    # the logs, the terminal history, and the workspace, which may live outside the home.
    os.umask(0o077)
    ctx.obj = {"config": config, "validate_code": partial(_validate_job_code, config_file=config)}
    logs.setup(verbose)


async def _validate_job_code(code: str, *, config_file: Path | None) -> str | None:
    """Refuse a broken cron program when it is added, not when it first fires (typeCheck as configured)."""
    from nanobot.sandbox.executor import validate_code

    return await validate_code(code, load_config(config_file)[0])


def onboard(ctx: typer.Context,
            force: bool = typer.Option(False, "--force", help="rewrite the config with defaults "
                                                              "(keys and tokens kept, the old file backed up)"),
            non_interactive: bool = typer.Option(False, "--non-interactive", help="ask nothing: write the defaults"),
            api_base: Optional[str] = typer.Option(None, "--api-base", metavar="URL", help="the model server's URL (not asked)"),
            api_key: Optional[str] = typer.Option(None, "--api-key", metavar="KEY", help="its API key (not asked)"),
            model: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help="the model (not asked)"),
            mode: Optional[str] = typer.Option(None, "--mode", metavar="MODE", help="code, tools or hybrid (not asked)"),
            channel: Optional[str] = typer.Option(None, "--channel", metavar="NAME", help="none, telegram, discord, slack, matrix, signal, email or whatsapp (not asked)"),
            page: Optional[bool] = typer.Option(None, "--page/--no-page", help="the web page and the API, with an owner key to sign in (not asked)"),
            ) -> None:
    """Create the config file (if missing) and the workspace from the template. In a terminal it
    asks for the model server, model, mode and one chat channel first; with a config already
    there, --channel NAME sets up that one channel in it, and --page turns the page on."""
    from nanobot.cli.onboarding import Answers, amend, ask, back_up, check_flags, page_key

    path, _ = config_path(ctx.obj.get("config"))
    interactive, page_on = not non_interactive and sys.stdin.isatty(), False
    given = Answers(api_base, api_key, model, mode, channel, page)
    check_flags(given, interactive=interactive)  # before anything is backed up, asked or written
    if path.exists() and not force:
        if amend(path, get_config(ctx), given):
            page_on = page is True  # an owner key to sign in with, unless there is one
        else:
            typer.echo(f"Config exists: {path} (use --force to overwrite, or --channel NAME or --page to set "
                       "up a chat channel or the page in it)")
        config = get_config(ctx)
    else:
        try:
            config = defaults_and_environment(path)
        except ConfigError as exc:  # a variable of the environment: one line naming it, as every command says it
            fail(str(exc))
        private_dir(path.parent)
        if path.exists():  # a config that cannot be read is what --force is reached for: kept aside whole
            kept = "API keys and tokens carried over"
            try:
                config = _keep_secrets(config, load_config(ctx.obj.get("config"))[0])
            except ConfigError as exc:
                kept = f"nothing carried over from it: {str(exc).removeprefix(str(path) + ': ')}"
            back_up(path, kept)
        if interactive or given != Answers():
            config = ask(config, given, interactive=interactive)
        write_private(path, config.to_json())
        typer.echo(f"Wrote {path}")
        page_on = config.gateway.api.enabled
    private_dir(config.home)
    if page_on:  # once the home is there: the key lives in its database
        page_key(config)
    copy_template(config.workspace_path)
    typer.echo(f"Workspace: {config.workspace_path}")
    if config.provider_config().api_key or config.provider_config().api_base:
        served = config.channels.enabled_names() + ([f"the page on http://{config.gateway.api.listen}/"]
                                                    if config.gateway.api.enabled else [])
        typer.echo(f"Next: nanobot agent (a chat here){'; nanobot gateway (' + ', '.join(served) + ')' if served else ''}")
    else:
        typer.echo("Next: set providers.openai.apiKey (and apiBase for other servers), then run: nanobot agent")


_CREDENTIAL = re.compile(r"(^|_)(token|key|secret|password)$")  # a field's name (not max_tokens)


def _keep_secrets(fresh: Config, old: Config) -> Config:
    """``onboard --force``: defaults everywhere, but the user's providers, database and every
    credential stay (a field naming a token, key, secret or password: Slack's, Matrix's, the
    mail servers' passwords, a webhook's secret). A part the defaults leave out (a webhook) comes
    whole when it holds one; a third-party channel's section, which has no defaults, whole."""
    fresh.providers, fresh.database = old.providers, old.database
    _carry_credentials(fresh, old)
    for name, section in (old.channels.model_extra or {}).items():
        setattr(fresh.channels, name, section)
    return fresh


def _carry_credentials(fresh: BaseModel, old: BaseModel) -> None:
    for name in type(old).model_fields:
        value, into = getattr(old, name), getattr(fresh, name)
        if isinstance(value, BaseModel):
            if into is not None:
                _carry_credentials(into, value)
            elif _holds_credentials(value):
                setattr(fresh, name, value)
        elif _CREDENTIAL.search(name) and value:
            setattr(fresh, name, value)


def _holds_credentials(section: BaseModel) -> bool:
    return any(_holds_credentials(value) if isinstance(value, BaseModel) else bool(value and _CREDENTIAL.search(name))
               for name, value in ((name, getattr(section, name)) for name in type(section).model_fields))


def gateway(ctx: typer.Context) -> None:
    """Run the daemon: the enabled channels, cron and heartbeat, until SIGTERM or Ctrl-C."""
    from nanobot import eventloop
    from nanobot.gateway import run_gateway

    config = get_config(ctx)
    check_writable(config.home)
    logs.log_to_file(config.home)
    logs.use_format(config.gateway.log_format, worker_id(config.gateway))
    _open_files_up_to_the_hard_limit()
    try:
        code = eventloop.run(run_gateway(config))
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable
    sys.exit(code)


def _open_files_up_to_the_hard_limit() -> None:
    """Each open chat keeps its history file open (up to 1,000 chats), beside sockets and the
    sandbox's pipes: a busy bot would pass systemd's soft limit of 1,024 open files and fail to
    accept or write. The hard limit is the operator's; the soft one is raised to it, as Go
    does for every program. (The sandbox's children are held to 1,024 again: nanobot.confine.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536  # "unlimited" is refused; macOS's cap
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:  # a kernel cap below the hard limit (fs.nr_open)
            log.warning("could not raise the open files limit from %d: %s", soft, exc)


for command in (onboard, agent, status, gateway, backup, restore):  # in this order in --help
    app.command()(command)
app.add_typer(pairing_app, name="pairing")
app.add_typer(history_app, name="history")
app.add_typer(db_app, name="db")
app.add_typer(api_app, name="api")


def _mount_subcommands() -> None:
    from nanobot.cli.cron import cron_app
    from nanobot.mcp.cli import mcp_app

    app.add_typer(cron_app, name="cron")
    app.add_typer(mcp_app, name="mcp")


_mount_subcommands()


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"nanobot: {exc}", err=True)
        sys.exit(2)
    except HomeError as exc:
        typer.echo(f"nanobot: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:  # a file we could not write or read: one line, not a traceback
        typer.echo(f"nanobot: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
