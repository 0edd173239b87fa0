"""The cron service: runs stored jobs on time inside the gateway.

The table is the schedule: each enabled job's row holds its ``next_run_at``, and one clock
loop claims the rows that came due (a conditional update moves ``next_run_at`` on to the
trigger's next fire time; a row another clock already moved is not claimed again), then runs
them. Between looks it sleeps until the earliest ``next_run_at``, at most ``poll_interval``,
which is how jobs added, removed or asked to run elsewhere (the CLI, another worker) are
seen; a run asked for now is a marked row too (nanobot.cron.run_requests).
APScheduler's triggers compute the next times (nanobot.cron.schedule); nothing keeps a
second copy of the schedule. What a job *does* is not decided here: an injected ``runner``
executes it (the gateway runs code jobs in the sandbox and prompt jobs as agent turns).

Each run is a task this service owns, so ``stop()`` cancels and awaits every run, and
overlapping runs of one job are skipped.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Awaitable, Callable, Literal

from nanobot import metrics
from nanobot.cron import schedule
from nanobot.cron.run_requests import RunRequests
from nanobot.cron.store import CronJob, CronStore, utcnow
from nanobot.eventloop import Background

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
PAYLOAD_KINDS = ("code", "prompt")


@dataclass
class RunOutcome:
    """What a runner reports about one run."""

    status: Literal["ok", "error"]
    output: str = ""
    function_calls: int = 0
    told: bool = False  # the job's chat was already told why (a prompt job's failed turn said so)


Runner = Callable[[CronJob], Awaitable[RunOutcome]]
NoticeHook = Callable[[CronJob, str], Awaitable[None] | None]
CodeValidator = Callable[[str], Awaitable[str | None]]


def check_target(target: str) -> str:
    channel, _, chat_id = target.partition(":")
    if not channel or not chat_id:
        raise ValueError(f"delivery target {target!r} must look like 'channel:chat_id', e.g. telegram:123456")
    return target


MAX_NAME, MAX_PAYLOAD = 100, 100_000  # characters


async def create_job(store: CronStore, *, owner_session: str, schedule_kind: str, expression: str, timezone: str,
                     payload_kind: str, payload: str, name: str | None = None, deliver_to: str | None = None,
                     validate_code: CodeValidator | None = None) -> CronJob:
    """Validate a new job and store it; ValueError says what is wrong.

    Shared by the cron tools and the CLI, which writes while a gateway may run.
    """
    expression = schedule.validate(schedule_kind, expression, timezone)
    if payload_kind not in PAYLOAD_KINDS:
        raise ValueError(f"unknown payload kind {payload_kind!r}: use 'code' or 'prompt'")
    if not payload.strip():
        raise ValueError(f"the job's {payload_kind} is empty")
    # A member's job is listed to the owner (cron list, the page, a notice): its name is short.
    if len(payload) > MAX_PAYLOAD or name is not None and len(name) > MAX_NAME:
        raise ValueError(f"a job's name is at most {MAX_NAME} characters, and its {payload_kind} at most "
                         f"{MAX_PAYLOAD:,}")
    check_target(owner_session)
    if deliver_to is not None:
        check_target(deliver_to)
    if payload_kind == "code" and validate_code is not None:
        error = await validate_code(payload)
        if error:
            raise ValueError(f"the job's code was rejected: {error}")
    next_run = schedule.next_fire(schedule_kind, expression, timezone, utcnow())
    return await store.add(name=name or default_name(payload), owner_session=owner_session,
                           schedule_kind=schedule_kind, expression=expression, timezone=timezone,
                           payload_kind=payload_kind, payload=payload, deliver_to=deliver_to, next_run_at=next_run)


def default_name(payload: str) -> str:
    first_line = payload.strip().splitlines()[0]
    return first_line if len(first_line) <= 40 else first_line[:39] + "…"


def _excerpt(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class CronService:
    def __init__(self, requests: RunRequests, runner: Runner, *, timezone: str = "UTC",
                 grace_seconds: float = 3600, poll_interval: float = 1.0, on_notice: NoticeHook | None = None):
        self.timezone = schedule.zone(timezone).key  # fail fast on a bad configured zone
        self.requests = requests  # runs asked for now; its ``asked`` wakes the clock
        self.store = requests.store
        self._runner = runner
        self._grace = grace_seconds
        self._poll_interval = poll_interval
        self._on_notice = on_notice
        self._running: set[str] = set()
        self._background = Background()  # the clock, and each run
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Schedule what has no next time, run or record what came due while down, then keep time."""
        self._stopping = False
        await self._tick()
        self._background.run(self._keep_time(), name="cron clock")

    async def stop(self) -> None:
        """Cancel and await the clock and any running jobs."""
        self._stopping = True
        await self._background.stop()

    # ---- the clock --------------------------------------------------------------------
    async def _keep_time(self) -> None:
        while True:
            wait = await self._until_next_look()
            with suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for could swallow the stop's cancel
                async with asyncio.timeout(wait):
                    await self.requests.asked.wait()
            self.requests.asked.clear()
            try:
                await self._tick()
            except Exception:  # a locked or briefly unavailable database: look again after a poll
                log.exception("cron: reading the schedule failed")
                await asyncio.sleep(self._poll_interval)

    async def _until_next_look(self) -> float:
        """Seconds until the earliest next run, at most ``poll_interval`` (what the CLI changes)."""
        try:
            earliest = await self.store.earliest_run()
        except Exception:
            log.exception("cron: reading the schedule failed")
            earliest = None
        if earliest is None:
            return self._poll_interval
        return min(self._poll_interval, max(0.0, (earliest - utcnow()).total_seconds()))

    async def _tick(self) -> None:
        """Claim and start what is due now: jobs without a next time get one, due jobs run (or are
        recorded as missed past the grace), and runs asked for from outside start."""
        now = utcnow()
        jobs = await self.store.due(now)
        firsts = [(job, self._next_time(job, now)) for job in jobs
                  if job.enabled and job.next_run_at is None and job.id not in self._running]
        await self.store.set_first_runs([(job.id, when) for job, when in firsts if when is not None])
        for job, when in firsts:
            if when is None:  # a bad schedule, or a one-shot whose time passed while it was paused
                await self.store.set_enabled(job.id, False)
        for job in jobs:
            if job.run_requested and await self.store.claim_request(job.id):
                self._start_run(job.id, scheduled=False)
            if job.enabled and job.next_run_at is not None and job.next_run_at <= now:
                await self._came_due(job, now)

    @staticmethod
    def _next_time(job: CronJob, now: datetime) -> datetime | None:
        """The schedule's first time after ``now`` (runs missed meanwhile are one run). An
        ``every`` job keeps its phase: from its due time, or from its last run (or creation)."""
        try:
            if job.schedule_kind != "every":
                return schedule.next_fire(job.schedule_kind, job.expression, job.timezone,
                                          now + timedelta(microseconds=1))
            interval = timedelta(seconds=schedule.every_seconds(job.expression))
        except ValueError as exc:  # only a hand-edited row gets here; create_job validates
            log.warning("cron: job %s has a bad schedule: %s", job.id, exc)
            return None
        anchor = job.next_run_at or (job.last_run_at or job.created_at) + interval
        return anchor + interval * max(0, (now - anchor) // interval + 1)

    async def _came_due(self, job: CronJob, now: datetime) -> None:
        assert job.next_run_at is not None
        due = job.next_run_at
        if not await self.store.claim(job.id, due, self._next_time(job, now)):
            return  # another clock (or a change from the CLI) moved it meanwhile
        late = (now - due).total_seconds()
        if late <= self._grace:
            self._start_run(job.id, scheduled=True)
            return
        await self.store.record_run(job.id, due, 0, "missed", f"nanobot was not running ({late:.0f} s ago)")
        if job.schedule_kind == "at":
            await self.store.remove(job.id)
        await self._notify(job, f"Cron job '{job.name}' ({job.id}) missed its run at "
                                f"{due.isoformat(timespec='minutes')}: nanobot was not running.")

    # ---- running a job --------------------------------------------------------------
    def _start_run(self, job_id: str, *, scheduled: bool) -> None:
        """A task of ours runs the job, unless it is running already (this run is skipped). It
        counts as running from here: the clock must not take its cleared next time for a new job."""
        if self._stopping:
            raise RuntimeError("the cron service is stopping")
        if job_id in self._running:
            log.info("cron: job %s is still running; skipping this run", job_id)
            return
        self._running.add(job_id)
        # A run has no awaiting caller: a failure outside its runner (a locked database) is logged as it ends.
        self._background.run(self._execute(job_id, scheduled=scheduled), name=f"cron job {job_id}")

    async def _execute(self, job_id: str, *, scheduled: bool) -> None:
        try:
            job = await self.store.get(job_id)  # afresh: a payload edited since the claim is run as edited
            if job is None or (scheduled and not job.enabled):
                return  # removed or paused by another process since the claim
            started, t0 = utcnow(), time.perf_counter()
            try:
                outcome = await self._runner(job)
            except Exception as exc:  # a runner bug must not kill the scheduler; count it as a failure
                log.exception("cron: runner failed on job %s", job_id)
                outcome = RunOutcome("error", f"{type(exc).__name__}: {exc}")
            if outcome.status != "ok":  # anything but 'ok' counts as a failure
                outcome.status = "error"
            duration_ms = int((time.perf_counter() - t0) * 1000)
            updated = await self.store.record_run(job_id, started, duration_ms, outcome.status, outcome.output,
                                                  outcome.function_calls)
            metrics.current.cron_run(outcome.status)
            log.info("cron run %s (%s) kind=%s ms=%d status=%s%s", job_id, job.name, job.payload_kind, duration_ms,
                     outcome.status, "" if outcome.status == "ok" else f" error={_excerpt(outcome.output)!r}")
            await self._after_run(updated or job, outcome, one_shot_done=scheduled and job.schedule_kind == "at")
            self.requests.ran()  # after its notices: whoever asked for it sees the run whole
        finally:
            self._running.discard(job_id)

    async def _after_run(self, job: CronJob, outcome: RunOutcome, *, one_shot_done: bool) -> None:
        if one_shot_done:  # an 'at' job has nothing left to do; its runs stay in cron_runs
            await self.store.remove(job.id)
        if outcome.status != "error":
            return
        error = "see its reply above" if outcome.told else _excerpt(outcome.output) or "no output"
        if one_shot_done or not job.enabled:  # no streak to report: nothing more is scheduled
            await self._notify(job, f"Cron job '{job.name}' ({job.id}) failed: {error}")
        elif job.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            await self.store.set_enabled(job.id, False)
            await self._notify(job, f"Cron job '{job.name}' ({job.id}) failed {job.consecutive_failures} times in a "
                                    f"row and is paused. Last error: {error}. "
                                    f"Ask me here to resume it, or run `nanobot cron enable {job.id}`.")
        else:
            await self._notify(job, f"Cron job '{job.name}' ({job.id}) failed "
                                    f"({job.consecutive_failures}/{MAX_CONSECUTIVE_FAILURES}): {error}")

    async def _notify(self, job: CronJob, text: str) -> None:
        if self._on_notice is None:
            log.warning("cron: %s", text)
            return
        try:
            result = self._on_notice(job, text)
            if inspect.isawaitable(result):
                await result
        except Exception:  # telling the owner is best effort; the run is already recorded
            log.exception("cron: on_notice failed for job %s", job.id)
