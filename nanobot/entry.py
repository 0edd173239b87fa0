"""The ``nanobot`` command's entry: a one-shot message goes to a running gateway over its
socket when there is one (terminal_client.py, standard library only); everything else is the
full CLI (nanobot/cli/)."""

from __future__ import annotations

import sys

from nanobot import collector


def main() -> None:
    from nanobot.terminal_client import try_gateway

    code = try_gateway(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    # httpx (python-telegram-bot's client) imports its own command-line tool, and with it rich
    # and pygments, whenever those are installed (typer brings them): 5 MB of RSS for nothing.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]  (httpx then skips it)
    collector.for_the_start()  # no garbage scans over the program while it is being built
    from nanobot.cli import main as full_cli

    try:
        full_cli()
    finally:
        collector.at_exit()  # the interpreter's last garbage scans skip the loaded program
