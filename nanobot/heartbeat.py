"""The heartbeat: every ``gateway.heartbeat.intervalMinutes``, look at HEARTBEAT.md's tasks.

When the file lists active tasks (``- [ ] ...`` lines), one agent turn checks them in its
own session, so the user's chat history is not filled with routine checks. A message goes
out only when the model has something to say: the answer ``HEARTBEAT_OK`` means nothing
needs the user, and is dropped. A check that fails (the model is down) is told once, not at
every beat until it answers again. The message goes to ``gateway.heartbeat.to``, by default the
first owner chat: never to a group, whoever spoke there last.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from nanobot.agent.markup import FailedReply
from nanobot.prompts import render_prompt
from nanobot.periodic import Periodic

if TYPE_CHECKING:
    from nanobot.coordination import Singletons
    from nanobot.delivery.intake import Tell
    from nanobot.runtime import Runtime

log = logging.getLogger(__name__)

SESSION_KEY = "heartbeat:main"
QUIET = "HEARTBEAT_OK"
_ACTIVE = re.compile(r"^\s*[-*]\s+\[ \]\s+(.+)$", re.M)


def active_tasks(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)  # the template's example is a comment
    return [t.strip() for t in _ACTIVE.findall(text)]


class Heartbeat(Periodic):
    name = "heartbeat"
    once_across_workers = True

    def __init__(self, runtime: Runtime, tell: Tell, interval_seconds: float, singletons: Singletons | None = None) -> None:
        super().__init__(interval_seconds, singletons)
        self.runtime = runtime
        self.tell = tell  # to the owner's chat (the terminal's or an API chat: kept in its history)
        self.failing = False  # the last check failed, and the owner was told: not again each beat of an outage

    async def tick(self) -> str | None:
        return await self.beat()

    async def beat(self) -> str | None:
        """One check; the message sent, or None when there was nothing to do or say."""
        rt = self.runtime
        tasks = active_tasks(rt.config.workspace_path / "HEARTBEAT.md")
        if not tasks:
            return None
        target = await rt.owner_chat()
        if target is None:
            log.info("heartbeat: %d task(s) but no owner chat to report to: write to me in private, or set "
                     "gateway.heartbeat.to (cli:default, the terminal's chat; api:NAME, an API key's)", len(tasks))
            return None
        prompt = render_prompt("heartbeat.md", tasks="\n".join(f"- {t}" for t in tasks), quiet=QUIET)
        rt.sessions.close(SESSION_KEY)  # read afresh: among workers, another may have run the last beat
        answer = await rt.agent.handle(SESSION_KEY, prompt)
        told, self.failing = self.failing, isinstance(answer, FailedReply)
        if self.failing and told:
            log.warning("heartbeat: the check failed again: %s", answer)
            return None
        # A failure's words answer no question the owner asked: say what failed.
        reply = f"The heartbeat's check of HEARTBEAT.md could not run. {answer}" if self.failing else answer.strip()
        if not reply or QUIET in reply:
            return None
        await self.tell(target, SESSION_KEY, reply)
        return reply
