"""What a cron job does when it fires: the CronService's runner inside the gateway.

- code jobs: the stored program runs in a fresh sandbox session with the same functions as
  in chat, and no model call. What it prints, or its last value, or its ``final_answer``, is
  delivered to the job's chat unless the program sent its own messages.
- prompt jobs: the message becomes a turn in the owning chat (queued behind whatever that
  chat is doing), and the reply is delivered there like any other.
Failures come back as an error outcome; the service records them, tells the owner through
``notice`` and pauses the job after three in a row.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Collection

from nanobot.agent.markup import FailedReply
from nanobot.bus import InboundMessage, split_target
from nanobot.coordination import Held, run_while_held
from nanobot.cron.service import CronService, RunOutcome, default_name
from nanobot.trust import HISTORY_CHANNELS
from nanobot.eventloop import Background
from nanobot.gateway.task_runner import OpenChat

if TYPE_CHECKING:
    from nanobot.cron.store import CronJob
    from nanobot.delivery.intake import Tell
    from nanobot.coordination import Singletons
    from nanobot.runtime import Runtime

log = logging.getLogger(__name__)

Ask = Callable[[InboundMessage], Awaitable[str]]


class Undeliverable(Exception):
    """The job's chat is on a channel that is not running: its output would be lost."""


class JobRunner:
    def __init__(self, runtime: Runtime, ask: Ask, tell: Tell, open_chat: OpenChat,
                 running_channels: Callable[[], Collection[str]]) -> None:
        self.runtime = runtime
        self.ask = ask  # a turn in the job's chat, its reply back (Gateway.ask)
        self.tell = tell  # output for a chat, kept in its history where nobody is messaged (the intake's)
        self.open_chat = open_chat  # the owning chat as it is now: its trust (Gateway.open_chat)
        self.running_channels = running_channels

    def check_delivery(self, target: str) -> None:
        channel, _ = split_target(target)
        if channel not in self.running_channels() and channel not in HISTORY_CHANNELS:
            raise Undeliverable(f"cannot deliver to {target}: channel {channel!r} is not running")

    async def __call__(self, job: CronJob) -> RunOutcome:
        try:
            if job.payload_kind == "code":
                return await self.run_code(job)
            self.check_delivery(job.target)  # before the turn: its reply would go nowhere
            return await self.run_prompt(job)
        except Undeliverable as exc:
            return RunOutcome("error", str(exc))

    async def notice(self, job: CronJob, text: str) -> None:
        await self.deliver(job, f"⏰ {text}")

    async def deliver(self, job: CronJob, text: str) -> None:
        # Not waited for, in a terminal's or API chat: the chat may be in the very turn that runs
        # this job (run_cron).
        await self.tell(job.target, f"cron:{job.id}", text)

    async def run_code(self, job: CronJob) -> RunOutcome:
        from nanobot.sandbox import StopProgram

        rt = self.runtime
        if rt.mcp is not None:  # their functions exist once the gateway's start of them is done
            await rt.mcp.ensure_started()
        # The job runs with the rights of the chat that owns it; its target is "this chat" for
        # its functions (send_message, list_cron...).
        await self.open_chat(job.owner_session)
        ctx = replace(rt.chat_context(job.owner_session), session_key=job.target, origin="cron")
        sent: list[str] = []
        final: list[str] = []

        async def send_message(content: str, to: str | None = None) -> str:
            sent.append(content)
            if to in (None, job.target) and split_target(job.target)[0] in HISTORY_CHANNELS and str(content).strip():
                await self.deliver(job, str(content))  # nobody to message there (no request waits): kept
                return f"Message kept in {job.target}."
            return await rt.tools.call("send_message", {"content": content, "to": to}, ctx)

        async def final_answer(value: Any = "") -> None:
            final.append(value if isinstance(value, str) else repr(value))
            raise StopProgram()

        settings = rt.config.agent_for(job.owner_session)
        # Stateless: a job must not see or change the chat's interactive Python variables.
        limits = settings.code_runtime.model_copy(update={"persist_state": False})
        result = await rt.code.run(job.payload, ctx, limits=limits, timezone=job.timezone, mode="cron",
                                   extras={"send_message": send_message, "final_answer": final_answer})
        if not result.ok:  # the exception line is what the owner needs; the traceback is for models
            last_line = (result.error or "failed").strip().splitlines()[-1]
            return RunOutcome("error", last_line, result.function_calls)
        text = final[0] if final else "\n".join(p for p in (result.output.rstrip(), result.value) if p)
        if text.strip() and not sent:
            self.check_delivery(job.target)
            await self.deliver(job, labelled(job, text))
        return RunOutcome("ok", text or "; ".join(sent), result.function_calls)

    async def run_prompt(self, job: CronJob) -> RunOutcome:
        channel, chat_id = split_target(job.target)
        reply = await self.ask(InboundMessage(channel, chat_id, sender_id=f"cron:{job.id}",
                                              content=job.payload, source="cron"))
        # A failed turn told the chat why as its reply; the run is a failure all the same (counted
        # towards the pause, and the owner told which job it was, without saying why again).
        failed = isinstance(reply, FailedReply)
        return RunOutcome("error" if failed else "ok", reply, told=failed)


class CronJobs:
    """The cron service as a gateway service: the store, the scheduler and the runner together.

    Jobs can be added, listed and run now on every worker; only the holder of the cron clock
    (one worker at a time, see nanobot.coordination) fires them on schedule. When the holder
    dies another takes the clock and catches up on what came due meanwhile, once.
    """

    CLOCK = "cron clock"

    def __init__(self, runner: JobRunner, singletons: Singletons, *, poll_interval: float = 1.0) -> None:
        runtime, self.runner = runner.runtime, runner
        self.singletons = singletons  # the gateway's: among workers, one holds the clock
        self.service = CronService(runtime.cron_runs, self.runner, timezone=runtime.config.agents.defaults.timezone,
                                   grace_seconds=runtime.config.gateway.cron_grace_seconds,
                                   poll_interval=poll_interval, on_notice=self.runner.notice)
        self._clock = Background()

    async def start(self) -> None:
        held = await self.singletons.try_hold(self.CLOCK)
        if held is not None:  # alone, or the first worker: fire from the start
            await self.service.start()
        self._clock.run(self._keep_clock(held), name="cron clock")

    async def _keep_clock(self, held: Held | None) -> None:
        """Fire jobs while we hold the clock; wait for it while another worker does."""
        while True:
            if held is None:
                held = await self.singletons.hold(self.CLOCK)
                await self.service.start()
            await run_while_held(self.singletons, held, asyncio.Event().wait(), after=self.service.stop)
            held = None

    async def stop(self) -> None:
        await self._clock.stop()
        await self.service.stop()


def labelled(job: CronJob, text: str) -> str:
    """A code job's output, under its name when it was given one ("⏰ tea timer"): a chat with
    several jobs can tell which spoke. A job named after its code's first line goes bare."""
    return text if job.name == default_name(job.payload) else f"⏰ {job.name}\n{text}"
