"""The process's shared parts that tools use, built once by the Runtime.

The tools layer owns these small interfaces, so it names nothing above it: the agent's parts
(``AgentDeps``) and the code executor (sandbox package) satisfy them without tools importing
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nanobot.access import PairingStore
    from nanobot.bus import MessageBus
    from nanobot.config import CodeRuntime
    from nanobot.cron.run_requests import RunRequests
    from nanobot.cron.store import CronStore
    from nanobot.database import Database
    from nanobot.session import Histories
    from nanobot.tasks import TaskStore


class ProgramChecker(Protocol):
    async def check(self, code: str, limits: CodeRuntime) -> str | None:
        """Why the program would not run (syntax, and types with typeCheck), or None."""


class Services(Protocol):
    """What the tools use of the process (``nanobot.agent.deps.AgentDeps`` is it)."""

    db: Database
    sessions: Histories
    pairing: PairingStore
    tasks: TaskStore  # background tasks
    cron: CronStore  # the cron jobs (their rows are the schedule)
    code: ProgramChecker  # checks a cron job's code when it is scheduled
    cron_runs: RunRequests  # run_cron's: the gateway's cron clock runs what is asked for
    bus: MessageBus  # messages out (send_message, send_file) go onto it
    terminal: bool  # this process is the terminal chat (nanobot agent): it reaches no other chat

    async def announce(self, text: str) -> None:
        """One short line to the owner chat(s), always logged."""
