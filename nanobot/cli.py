"""The ``nanobot`` command. Heavy libraries (channels, scheduler, web) are imported inside the
commands that need them, so a one-shot ``nanobot agent -m`` starts fast."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Optional

import typer

from nanobot import logs
from nanobot.db import HomeError, check_writable
from nanobot.workspace_template import copy_template
from nanobot.config import Config, ConfigError, config_path, load_config, nanobot_home, private_dir, write_private

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="nanobot: a self-hosted AI assistant whose model can answer with code.")

DEMO_RECORDING = Path(__file__).resolve().parent / "demo" / "demo.jsonl"


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"nanobot: {message}", err=True)
    raise typer.Exit(code)


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


def get_config(ctx: typer.Context) -> Config:
    try:
        config = load_config(ctx.obj.get("config") if ctx.obj else None)[0]
        logs.remember_secrets(config)
        return config
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable


@app.command()
def onboard(ctx: typer.Context, force: bool = typer.Option(False, "--force", help="rewrite the config with defaults "
                                                           "(keys and tokens kept, the old file backed up)")) -> None:
    """Create the config file (if missing) and the workspace from the template."""
    path, _ = config_path(ctx.obj.get("config"))
    if path.exists() and not force:
        typer.echo(f"Config exists: {path} (use --force to overwrite)")
        config = get_config(ctx)
    else:
        config = Config()
        private_dir(path.parent)
        if path.exists():
            config = _keep_secrets(config, get_config(ctx))
            backup = path.with_name(path.name + ".bak")
            write_private(backup, path.read_text(encoding="utf-8"))
            typer.echo(f"Backed up the old config to {backup} (API keys and tokens carried over)")
        write_private(path, config.to_json())
        typer.echo(f"Wrote {path}")
    private_dir(config.home)
    copy_template(config.workspace_path)
    typer.echo(f"Workspace: {config.workspace_path}")
    if config.provider_config().api_key or config.provider_config().api_base:
        typer.echo("Next: nanobot agent")
    else:
        typer.echo("Next: set providers.openai.apiKey (and apiBase for other servers), then run: nanobot agent")


def _keep_secrets(fresh: Config, old: Config) -> Config:
    """``onboard --force``: defaults everywhere, but the user's providers and channel tokens stay."""
    fresh.providers = old.providers
    fresh.channels.telegram.token = old.channels.telegram.token
    fresh.channels.discord.token = old.channels.discord.token
    return fresh


@app.command()
def agent(ctx: typer.Context,
          message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="one message; omit for a chat"),
          session: str = typer.Option("cli:default", "--session", metavar="KEY", help="session key"),
          mode: Optional[str] = typer.Option(None, "--mode", metavar="MODE", help="tools, code or hybrid"),
          demo: bool = typer.Option(False, "--demo", help="offline, with a recorded model and a temporary workspace")) -> None:
    """Talk to the agent: one message with -m, or an interactive chat."""
    if mode is not None and mode not in ("tools", "code", "hybrid"):
        fail(f"--mode must be tools, code or hybrid, not {mode!r}")
    if demo:
        sys.exit(asyncio.run(_run_demo(message)))
    config = get_config(ctx)
    sys.exit(asyncio.run(_run_agent(config, message, session, mode)))


async def _print_progress(text: str) -> None:
    typer.echo(f"… {text}")


async def _run_agent(config: Config, message: str | None, session: str, mode: str | None,
                     provider=None) -> int:
    from nanobot.bus import MessageBus
    from nanobot.runtime import Runtime

    try:
        # One message needs no bus: send_message to this chat prints. A chat runs on the
        # gateway's machinery (a bus, a dispatcher, the terminal as a channel).
        async with Runtime(config, provider=provider, bus=None if message is not None else MessageBus()) as rt:
            if message is not None:
                from nanobot.agent.loop import FailedReply

                reply, printed = await _one_message(rt, session, message, mode)
                printed.finish(reply)
                return 1 if isinstance(reply, FailedReply) else 0
            await _chat(rt, session, mode)
            return 0
    except ConfigError as exc:
        fail(str(exc))
    return 1


TERMINAL_STREAM_INTERVAL = 0.05  # seconds between the terminal's looks at a reply being written


async def _one_message(rt, session: str, message: str, mode: str | None):
    """``agent -m``: the reply printed as it is written; the caller prints the rest of it."""
    from channels.cli import TerminalStream, write_stdout
    from nanobot.agent.streaming import ReplyStream

    printed = TerminalStream(write_stdout)

    async def show(text: str) -> None:
        printed.feed(text)

    stream = ReplyStream(show, TERMINAL_STREAM_INTERVAL)
    reply = await rt.agent.handle(session, message, mode=mode, progress=_print_progress, stream=stream)
    return reply, printed


async def _chat(rt, session: str, mode: str | None) -> None:
    """The terminal chat: lines go through the same dispatcher as the gateway's chats, so
    ``/stop`` typed during a turn cancels it. At end of input, what was asked is finished."""
    from channels.cli import CliChannel
    from nanobot.bus import InboundMessage
    from nanobot.gateway.dispatcher import Dispatcher, is_stop

    typer.echo(f"nanobot chat ({session}). /help for commands; Ctrl-C cancels a turn, Ctrl-C or Ctrl-D "
               "at the prompt leaves.")
    dispatcher = Dispatcher(rt.agent, rt.bus, rt.config.gateway, streams=rt.config.channels.streams,
                            stream_interval=TERMINAL_STREAM_INTERVAL)
    asked: list[asyncio.Task[str]] = []

    def interrupt() -> bool:
        """Ctrl-C: cancel the running turn (True), or leave when nothing runs (False)."""
        worker = dispatcher.workers.get(session)
        if worker is None or worker.turn is None or worker.turn.done():
            return False
        channel_name, _, chat_id = session.partition(":")
        dispatcher.submit(InboundMessage(channel_name, chat_id, "owner", "/stop"))
        return True

    channel = CliChannel(session, rt.bus, metadata={"mode": mode} if mode else {},
                         history_file=rt.home / "cli_history", on_interrupt=interrupt)

    async def intake() -> None:
        while True:
            msg = await rt.bus.inbound.get()
            if is_stop(msg.content):
                dispatcher.submit(msg)
            else:
                asked.append(asyncio.create_task(dispatcher.ask(msg)))

    async def route() -> None:
        while True:
            await channel.send(await rt.bus.outbound.get())

    tasks = [asyncio.create_task(intake()), asyncio.create_task(route())]
    await channel.start()
    try:
        await channel.closed.wait()
        while not rt.bus.inbound.empty():  # lines typed just before the end are still asked
            await asyncio.sleep(0)
        await asyncio.gather(*asked, return_exceptions=True)
        while not rt.bus.outbound.empty():
            await channel.send(rt.bus.outbound.get_nowait())
    finally:
        await channel.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await dispatcher.shutdown(0)


async def _run_demo(message: str | None) -> int:
    """Replays a bundled recording against a throwaway home and workspace, with the real tools."""
    from nanobot.providers.replay import ReplayProvider

    provider = ReplayProvider(DEMO_RECORDING)
    setup = provider.setup
    root = Path(tempfile.mkdtemp(prefix="nanobot-demo-"))
    config = Config()
    config.agents.defaults.workspace = str(root / "workspace")
    config.agents.defaults.execution_mode = setup.get("mode", "code")  # the mode it was recorded in
    copy_template(config.workspace_path)
    for name, text in setup.get("files", {}).items():
        (config.workspace_path / name).parent.mkdir(parents=True, exist_ok=True)
        (config.workspace_path / name).write_text(text, encoding="utf-8")
    message = message or setup.get("message", "hello")
    typer.echo("DEMO: the model is a recording replayed offline, not a live model; the tools are real.")
    typer.echo(f"Workspace: {config.workspace_path}")
    typer.echo(f"you> {message}")
    os.environ["NANOBOT_HOME"] = str(root / "home")
    show = logging.StreamHandler(sys.stdout)  # let the viewer watch the program and its calls
    show.setFormatter(logging.Formatter("  %(message)s"))
    agent_log = logging.getLogger("nanobot.agent")
    agent_log.setLevel(logging.DEBUG)  # the program itself is logged at DEBUG
    agent_log.addHandler(show)
    agent_log.propagate = False
    code = await _run_agent(config, message, "cli:demo", None, provider=provider)
    typer.echo(f"(model calls: {provider.calls}, replayed; the files are in {config.workspace_path})")
    return code


@app.command()
def status(ctx: typer.Context) -> None:
    """Config path, workspace, provider, channels, cron jobs and usage so far."""
    config = get_config(ctx)
    path, _ = config_path(ctx.obj.get("config"))
    asyncio.run(_status(config, path))


async def _status(config: Config, path: Path) -> None:
    from nanobot.db import open_db
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
    for line in gateway_lines(config):
        typer.echo(line)
    for line in trust_lines(config):
        typer.echo(line)
    db = await open_db(config.home / "nanobot.db")
    try:
        typer.echo(f"Cron jobs: {await _count_cron_jobs(db)}")
        typer.echo(f"Disk:      {_disk_line(config.home)}")
        typer.echo(f"Delivery:  {await _delivery_line(db)}")
        totals = await (await UsageStore.create(db)).totals()
        if not totals:
            typer.echo("Usage:     none yet")
        for mode, t in sorted(totals.items()):
            typer.echo(f"Usage [{mode}]: {t.summary()}")
        for line in await (await UsageStore.create(db)).cost_lines(settings.timezone):
            typer.echo(line)
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


async def _delivery_line(db: Any) -> str:
    """What the durable intake and the outbox hold: messages not yet answered, replies not yet
    taken by their platform, and replies refused in the last 3 days."""
    from nanobot.delivery.store import DeliveryStore

    store = await DeliveryStore.open(db)
    try:
        waiting, unsent, failed = await store.backlog()
    finally:
        await store.close()
    return f"{waiting} message(s) not yet answered, {unsent} repl(ies) not yet sent, {failed} refused"


def gateway_lines(config: Config) -> list[str]:
    """Whether a gateway runs on this home, and each enabled channel's state in it."""
    from nanobot.gateway.lock import gateway_states, running_gateway_pid

    pid = running_gateway_pid(config.home)
    states = gateway_states(config.home, pid, "channels") if pid else {}
    mcp = gateway_states(config.home, pid, "mcp") if pid else {}
    channels = [f"{name} ({states.get(name, 'not running' if pid else 'gateway not running')})"
                for name in config.channels.enabled_names()]
    servers = [f"{name} ({mcp.get(name, 'gateway not running' if not pid else 'not started')})"
               if s.enabled else f"{name} (disabled)" for name, s in config.tools.mcp_servers.items()]
    lines = [f"Gateway:   {f'running (PID {pid})' if pid else 'not running'}",
             f"Channels:  {', '.join(channels) or 'none enabled'}"]
    if servers:
        lines.append(f"MCP:       {'; '.join(servers)}")
    cooling = {name: until - time.time() for name, until in
               (gateway_states(config.home, pid, "cooling_until") if pid else {}).items() if until > time.time()}
    if cooling:
        lines.append("Cooldown:  " + ", ".join(f"{name} ({left:.0f} s left, fallbacks first)"
                                               for name, left in cooling.items()))
    return lines


def trust_lines(config: Config) -> list[str]:
    """Who the owner is, where the shell stands, and what steers the assistant unexpectedly."""
    from nanobot.skills import shadowing_skills
    from nanobot.tools.shell import shell_status
    from nanobot.trust import owner_chat, owner_ids

    owners = [f"{name} {', '.join(owner_ids(config.channels.section(name))) or '(none)'}"
              for name in config.channels.enabled_names()]
    who = f"{'; '.join(owners)} in private chats, and the terminal" if owners else "the terminal only"
    lines = [f"Owners:    {who}",
             f"Notices:   {owner_chat(config) or 'no owner chat yet: logged only'}",
             f"Shell:     {shell_status(config)}"]
    shadowing = shadowing_skills(config.workspace_path)
    if shadowing:
        lines.append(f"Skills:    workspace skills REPLACE built-ins: {', '.join(shadowing)}")
    return lines


async def _count_cron_jobs(db) -> int:
    try:
        async with db.execute("SELECT count(*) FROM cron_jobs") as cur:
            return (await cur.fetchone())[0]
    except Exception:  # no cron table yet: nothing was ever scheduled
        return 0


@app.command()
def gateway(ctx: typer.Context) -> None:
    """Run the daemon: the enabled channels, cron and heartbeat, until SIGTERM or Ctrl-C."""
    from nanobot import eventloop
    from nanobot.gateway import run_gateway

    config = get_config(ctx)
    check_writable(config.home)
    logs.log_to_file(config.home)
    try:
        code = eventloop.run(run_gateway(config))
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable
    sys.exit(code)


pairing_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Admit people who wrote to the bot: list codes, approve or deny one, revoke an approval.")
app.add_typer(pairing_app, name="pairing")


@pairing_app.command("list")
def pairing_list() -> None:
    """Pending pairing codes and approved users."""
    asyncio.run(_pairing_list())


@pairing_app.command("approve")
def pairing_approve(code: str = typer.Argument(..., help="the code the user was sent")) -> None:
    """Let the user behind CODE talk to the bot; a running gateway admits them at once."""
    sys.exit(asyncio.run(_pairing_approve(code)))


@pairing_app.command("deny")
def pairing_deny(code: str = typer.Argument(..., help="the code the user was sent")) -> None:
    """Refuse the user behind CODE: the code is dropped and they get no new one."""
    sys.exit(asyncio.run(_with_pairing(lambda store: store.deny(code), "Denied {channel} user {sender_id}.")))


@pairing_app.command("revoke")
def pairing_revoke(channel: str = typer.Argument(..., help="telegram, discord, ..."),
                   user_id: str = typer.Argument(..., help="the user's id, as `pairing list` shows it")) -> None:
    """Take back an approval; the user no longer reaches the bot (they may ask again)."""

    async def revoke(store):
        if not await store.revoke(channel, user_id):
            raise ValueError(f"{channel} user {user_id} is not an approved user (see: nanobot pairing list)")
        return {"channel": channel, "sender_id": user_id}

    sys.exit(asyncio.run(_with_pairing(revoke, "Revoked {channel} user {sender_id}.")))


async def _with_pairing(action, done: str) -> int:
    from nanobot.access import PairingStore
    from nanobot.db import open_db

    db = await open_db(nanobot_home() / "nanobot.db")
    try:
        result = await action(await PairingStore.open(db))
    except ValueError as exc:
        typer.echo(f"nanobot: {exc}", err=True)
        return 1
    finally:
        await db.close()
    fields = result if isinstance(result, dict) else vars(result)
    typer.echo(done.format(**{k: "?" if v is None else v for k, v in fields.items()}))
    return 0


async def _pairing_list() -> None:
    import time

    from nanobot.access import PairingStore
    from nanobot.db import open_db

    db = await open_db(nanobot_home() / "nanobot.db")
    try:
        store = await PairingStore.open(db)
        pending, paired = await store.pending(), await store.paired()
    finally:
        await db.close()
    typer.echo("Pending codes:" if pending else "Pending codes: none")
    for r in pending:
        minutes = max(0, int((r.expires_at - time.time()) // 60))
        typer.echo(f"  {r.code}  {r.channel} {r.sender_id} ({r.sender_name or '?'}), expires in {minutes} min")
    typer.echo("Approved users:" if paired else "Approved users: none")
    for u in paired:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(u.approved_at))
        typer.echo(f"  {u.channel} {u.sender_id} ({u.sender_name or '?'}), since {since}")


async def _pairing_approve(code: str) -> int:
    return await _with_pairing(lambda store: store.approve(code),
                               "Approved {channel} user {sender_id} ({sender_name}); a running gateway tells them.")


def _mount_subcommands() -> None:
    from nanobot.cron.cli import cron_app
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
