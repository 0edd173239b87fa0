"""The cron service: runs stored jobs on time inside the gateway.

The store is the source of truth and APScheduler's memory job store the live copy. At start
every enabled job is registered; afterwards a poll loop watches the store's change token and
re-syncs, which is how jobs added or removed by the CLI (another process) reach a running
gateway. What a job *does* is not decided here: an injected ``runner`` executes it (the
gateway runs code jobs in the sandbox and prompt jobs as agent turns).

APScheduler only tells us *when*; each fire spawns a task this service owns, so ``stop()``
can cancel and await every run, and overlapping runs of one job are skipped here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Awaitable, Callable, Literal

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from nanobot import metrics
from nanobot.cron import schedule
from nanobot.cron.store import CronJob, CronStore, utcnow
from nanobot.eventloop import cancel_and_wait

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
PAYLOAD_KINDS = ("code", "prompt")


@dataclass
class RunOutcome:
    """What a runner reports about one run."""

    status: Literal["ok", "error"]
    output: str = ""
    function_calls: int = 0


Runner = Callable[[CronJob], Awaitable[RunOutcome]]
NoticeHook = Callable[[CronJob, str], Awaitable[None] | None]
CodeValidator = Callable[[str], Awaitable[str | None]]


def check_target(target: str) -> str:
    channel, _, chat_id = target.partition(":")
    if not channel or not chat_id:
        raise ValueError(f"delivery target {target!r} must look like 'channel:chat_id', e.g. telegram:123456")
    return target


async def create_job(store: CronStore, *, owner_session: str, schedule_kind: str, expression: str, timezone: str,
                     payload_kind: str, payload: str, name: str | None = None, deliver_to: str | None = None,
                     validate_code: CodeValidator | None = None) -> CronJob:
    """Validate a new job and store it; ValueError says what is wrong.

    Shared by the service (tools, gateway) and the CLI, which writes while a gateway may run.
    """
    expression = schedule.validate(schedule_kind, expression, timezone)
    if payload_kind not in PAYLOAD_KINDS:
        raise ValueError(f"unknown payload kind {payload_kind!r}: use 'code' or 'prompt'")
    if not payload.strip():
        raise ValueError(f"the job's {payload_kind} is empty")
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


def _anchor(job: CronJob) -> datetime | None:
    """Where an ``every`` job's interval counts from: its last run (or its creation)."""
    if job.schedule_kind != "every":
        return None
    return (job.last_run_at or job.created_at) + timedelta(seconds=schedule.every_seconds(job.expression))


def _signature(job: CronJob) -> tuple[str, str, str]:
    """What the registered trigger depends on; payload edits need no re-registration
    because each run reads the job afresh from the store."""
    return job.schedule_kind, job.expression, job.timezone


def _excerpt(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class CronService:
    def __init__(self, store: CronStore, runner: Runner, *, timezone: str = "UTC", grace_seconds: float = 3600,
                 poll_interval: float = 1.0, on_notice: NoticeHook | None = None,
                 validate_code: CodeValidator | None = None):
        self.timezone = schedule.zone(timezone).key  # fail fast on a bad configured zone
        self.store = store
        self._runner = runner
        self._grace = grace_seconds
        self._poll_interval = poll_interval
        self._on_notice = on_notice
        self._validate_code = validate_code
        self._scheduler: AsyncIOScheduler | None = None
        self._registered: dict[str, tuple[str, str, str]] = {}
        self._running: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._poll_task: asyncio.Task | None = None
        self._sync_lock = asyncio.Lock()
        self._token = -1
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Register every enabled job, catch up on missed runs, then watch the store."""
        self._stopping = False
        self._scheduler = AsyncIOScheduler(timezone=self.timezone, job_defaults={
            "coalesce": True, "max_instances": 1,
            # Late fires (a blocked loop, a suspended laptop) still run within our grace.
            "misfire_grace_time": max(1, int(self._grace)),
        })
        # Paused while registering: otherwise each add_job queues its own scheduler wakeup.
        self._scheduler.start(paused=True)
        await self._sync()
        self._scheduler.resume()
        self._poll_task = asyncio.create_task(self._poll(), name="cron-poll")

    async def stop(self) -> None:
        """Cancel and await the poll loop and any running jobs; never waits on APScheduler."""
        self._stopping = True
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        tasks = [*self._tasks, *([self._poll_task] if self._poll_task else [])]
        await cancel_and_wait(*tasks)
        await asyncio.sleep(0)  # AsyncIOScheduler.shutdown takes effect in a loop callback
        self._poll_task, self._scheduler = None, None
        self._registered.clear()

    # ---- public operations ----------------------------------------------------------
    async def add_job(self, *, owner_session: str, schedule_kind: str, expression: str, payload_kind: str,
                      payload: str, name: str | None = None, timezone: str | None = None,
                      deliver_to: str | None = None) -> CronJob:
        job = await create_job(self.store, owner_session=owner_session, schedule_kind=schedule_kind,
                               expression=expression, timezone=timezone or self.timezone,
                               payload_kind=payload_kind, payload=payload, name=name, deliver_to=deliver_to,
                               validate_code=self._validate_code)
        if self._scheduler is not None:
            await self._sync()
        return job

    async def remove_job(self, job_id: str) -> None:
        if not await self.store.remove(job_id):
            raise ValueError(f"no cron job with id {job_id!r}")
        self._unregister(job_id)

    async def run_now(self, job_id: str) -> RunOutcome:
        """Run the job at once (enabled or not) and return how it went; its schedule is untouched."""
        if await self.store.get(job_id) is None:
            raise ValueError(f"no cron job with id {job_id!r}")
        if job_id in self._running:
            raise RuntimeError(f"cron job {job_id} is already running")
        outcome = await self._spawn(self._execute(job_id, scheduled=False))
        if outcome is None:
            raise RuntimeError(f"cron job {job_id} could not run")
        return outcome

    async def list_jobs(self, owner_session: str | None = None) -> list[CronJob]:
        return await self.store.list(owner_session)

    # ---- syncing the store into APScheduler -----------------------------------------
    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                if await self.store.change_token() != self._token:
                    await self._sync()
            except Exception:  # a locked or briefly unavailable database: try again next tick
                log.exception("cron: syncing jobs from the store failed")

    async def _sync(self) -> None:
        """Make the live scheduler match the store; run what is due or requested."""
        async with self._sync_lock:
            # Read the token first: a change landing during this sync bumps it past this value.
            self._token = await self.store.change_token()
            jobs = await self.store.list()
            now = utcnow()
            wanted = {job.id: job for job in jobs if job.enabled}
            for job_id in set(self._registered) - wanted.keys():
                self._unregister(job_id)
            next_runs, due = [], []
            for job in wanted.values():
                if self._registered.get(job.id) == _signature(job):
                    continue
                if job.next_run_at is not None and job.next_run_at <= now:
                    due.append(job)  # it should have run while no scheduler had it
                next_runs.append((job.id, self._register(job, now)))
            await self.store.update_next_runs(next_runs)
            for job in due:
                await self._catch_up(job, now)
            for job in jobs:
                if job.run_requested:
                    await self.store.request_run(job.id, False)
                    self._spawn(self._execute(job.id, scheduled=False))

    def _register(self, job: CronJob, now: datetime) -> datetime | None:
        """Put the job into APScheduler; returns its next fire time."""
        assert self._scheduler is not None
        self._registered[job.id] = _signature(job)
        try:
            trigger = schedule.build_trigger(job.schedule_kind, job.expression, job.timezone, _anchor(job))
        except ValueError as exc:  # only a hand-edited row gets here; create_job validates
            log.warning("cron: job %s has a bad schedule, not scheduling it: %s", job.id, exc)
            return None
        if job.schedule_kind == "at" and trigger.run_date <= now:
            return None  # past one-shot: _catch_up runs it or records it as missed
        aps_job = self._scheduler.add_job(self._on_fire, trigger, args=[job.id], id=job.id, name=job.name,
                                          replace_existing=True)
        return aps_job.next_run_time

    def _unregister(self, job_id: str) -> None:
        self._registered.pop(job_id, None)
        if self._scheduler is not None:
            try:
                self._scheduler.remove_job(job_id)
            except JobLookupError:
                pass

    async def _catch_up(self, job: CronJob, now: datetime) -> None:
        """A run came due while no scheduler had the job: run it once if recent, else log it missed."""
        assert job.next_run_at is not None
        late = (now - job.next_run_at).total_seconds()
        if late <= self._grace:
            self._spawn(self._execute(job.id, scheduled=True, catch_up=True))
            return
        await self.store.record_run(job.id, job.next_run_at, 0, "missed", f"nanobot was not running ({late:.0f} s ago)")
        if job.schedule_kind == "at":
            await self.remove_job(job.id)
        await self._notify(job, f"Cron job '{job.name}' ({job.id}) missed its run at "
                                f"{job.next_run_at.isoformat(timespec='minutes')}: nanobot was not running.")

    # ---- running a job --------------------------------------------------------------
    async def _on_fire(self, job_id: str) -> None:
        """APScheduler's callback: hand the run to a task we own and return at once."""
        if not self._stopping:
            self._spawn(self._execute(job_id, scheduled=True))

    def _spawn(self, coro) -> asyncio.Task:
        if self._stopping:
            coro.close()
            raise RuntimeError("the cron service is stopping")
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        # Scheduled runs have no awaiting caller: surface a failure (e.g. a locked database) here.
        if not task.cancelled() and task.exception() is not None:
            log.error("cron: a job run failed outside its runner", exc_info=task.exception())

    async def _execute(self, job_id: str, *, scheduled: bool, catch_up: bool = False) -> RunOutcome | None:
        if job_id in self._running:
            log.info("cron: job %s is still running; skipping this run", job_id)
            return None
        self._running.add(job_id)
        try:
            job = await self.store.get(job_id)
            if job is None or (scheduled and not job.enabled):
                self._unregister(job_id)  # removed or paused by another process since the last sync
                return None
            if scheduled and not catch_up:
                # Record the next time before running: a crash mid-run must not replay this one.
                aps_job = self._scheduler.get_job(job_id) if self._scheduler else None
                await self.store.update_next_run(job_id, aps_job.next_run_time if aps_job else None)
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
            return outcome
        finally:
            self._running.discard(job_id)

    async def _after_run(self, job: CronJob, outcome: RunOutcome, *, one_shot_done: bool) -> None:
        if one_shot_done:  # an 'at' job has nothing left to do; its runs stay in cron_runs
            await self.store.remove(job.id)
            self._unregister(job.id)
        if outcome.status != "error":
            return
        error = _excerpt(outcome.output) or "no output"
        if one_shot_done or not job.enabled:  # no streak to report: nothing more is scheduled
            await self._notify(job, f"Cron job '{job.name}' ({job.id}) failed: {error}")
        elif job.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            await self.store.set_enabled(job.id, False)
            self._unregister(job.id)
            await self._notify(job, f"Cron job '{job.name}' ({job.id}) failed {job.consecutive_failures} times in a "
                                    f"row and is paused. Last error: {error}. "
                                    f"Resume it with `nanobot cron enable {job.id}`.")
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
