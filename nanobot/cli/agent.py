"""``nanobot agent``: one message, an interactive terminal chat, or the offline demo."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from nanobot import logs
from nanobot.cli.common import fail, get_config, show_waiting
from nanobot.config import Config, ConfigError
from nanobot.terminal_client import NO_GATEWAY, SOCKET, gateway_config, same_config, send, with_piped
from nanobot.workspace_template import copy_template

DEMO_RECORDING = Path(__file__).resolve().parent.parent / "demo" / "demo.jsonl"


def agent(ctx: typer.Context,
          message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT",
                                                 help="one message (what is piped in follows it); omit for a chat"),
          session: str = typer.Option("cli:default", "--session", metavar="KEY",
                                      help="the chat: cli:NAME (or NAME) a terminal chat, CHANNEL:ID another's"),
          mode: Optional[str] = typer.Option(None, "--mode", metavar="MODE", help="tools, code or hybrid"),
          demo: bool = typer.Option(False, "--demo", help="offline, with a recorded model and a temporary workspace"),
          local: bool = typer.Option(False, "--local", help="run in this process even when a gateway runs"),
          verbose: bool = typer.Option(False, "--verbose", "-v", help="log what the agent does (as nanobot -v)")) -> None:
    """Talk to the agent: one message with -m, or an interactive chat."""
    if verbose:  # after the command too, where docs/cli.md lists it and people type it
        logs.setup(True)
    if mode is not None and mode not in ("tools", "code", "hybrid"):
        fail(f"--mode must be tools, code or hybrid, not {mode!r}")
    piped = False
    if message is not None:
        try:
            message, piped = with_piped(message)
        except ValueError as exc:
            fail(str(exc))
    if demo:
        sys.exit(asyncio.run(_run_demo(message)))
    config = get_config(ctx)
    session = session if ":" in session else f"cli:{session}"  # --session work: the terminal chat "work"
    sock = config.home / SOCKET
    why = _in_process_because(config, sock, session, local)
    if why is None and message is not None:
        code = send(sock, message, session, mode, piped=piped,
                    verbose=logging.getLogger().isEnabledFor(logging.INFO))
        if code is not None:
            sys.exit(code)
        why = "the gateway stopped answering"
    elif why is None:
        from nanobot.cli.remote_chat import chat_via_gateway

        typer.echo(f"nanobot chat ({session}) through the running gateway. /help for commands; Ctrl-C cancels a "
                   "turn, Ctrl-C or Ctrl-D at the prompt leaves.")
        sys.exit(asyncio.run(chat_via_gateway(sock, config.home, session, mode)))
    logging.getLogger(__name__).info("running in this process: %s", why)
    sys.exit(asyncio.run(_run_agent(config, message, session, mode, piped=piped)))


def _in_process_because(config: Config, sock: Path, session: str, local: bool) -> str | None:
    """Why this chat runs here rather than in the gateway of this home (None: it need not)."""
    if local:
        return "--local"
    if not session.startswith("cli:"):
        return f"--session {session} is not a terminal chat (only this process may act in it)"
    theirs = gateway_config(sock)
    if theirs == NO_GATEWAY:
        return f"no gateway runs on {config.home}"
    if not same_config(theirs, config.source):
        return f"the gateway on {config.home} runs with another config file ({theirs}, not {config.source})"
    return None


async def _run_agent(config: Config, message: str | None, session: str, mode: str | None,
                     provider=None, piped: bool = False) -> int:
    from nanobot.runtime import open_runtime

    try:
        async with open_runtime(config, provider=provider, terminal=True) as rt:
            return await _converse(rt, session, mode, message, piped)
    except ConfigError as exc:
        fail(str(exc))
    return 1


async def _converse(rt, session: str, mode: str | None, message: str | None, piped: bool) -> int:
    """The terminal chat: a gateway with one channel, the terminal, so lines go through the same
    dispatcher as the gateway's chats (``/stop`` typed during a turn cancels it). With
    ``message``, that one message; 1 when a reply is a failure."""
    from nanobot.agent.loop import FailedReply
    from nanobot.cli.terminal_channel import CliChannel
    from nanobot.database import SqliteDatabase
    from nanobot.gateway.app import Gateway

    if message is None:
        typer.echo(f"nanobot chat ({session}). /help for commands; Ctrl-C cancels a turn, Ctrl-C or Ctrl-D "
                   "at the prompt leaves.")
        chat = await rt.sessions.open(session)  # no gateway runs here: this process runs the chat
        shown, upto = chat.waiting_since("")
        show_waiting(shown)
        chat.mark_seen(upto)
    scratch = await SqliteDatabase.open(":memory:")
    gateway = Gateway(rt, scratch=scratch)
    channel = CliChannel(gateway.dispatcher, session, mode=mode, message=message, piped=piped,
                         history_file=rt.home / "cli_history", chat_folder=gateway.chat_folder)
    gateway.add_internal_channel(channel)
    try:
        await gateway.start()
        await channel.start()
        replies = await channel.finished()
    finally:
        await gateway.stop()
        await scratch.close()
    return 1 if any(isinstance(reply, FailedReply) for reply in replies) else 0


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
    config.use_home(root / "home")
    show = logging.StreamHandler(sys.stdout)  # let the viewer watch the program and its calls
    show.setFormatter(logging.Formatter("  %(message)s"))
    agent_log = logging.getLogger("nanobot.agent")
    agent_log.setLevel(logging.DEBUG)  # the program itself is logged at DEBUG
    agent_log.addHandler(show)
    agent_log.propagate = False
    code = await _run_agent(config, message, "cli:demo", None, provider=provider)
    typer.echo(f"(model calls: {provider.calls}, replayed; the files are in {config.workspace_path})")
    return code
