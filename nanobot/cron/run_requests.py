"""Runs asked for now (``run_cron``, the API, ``nanobot cron run``) go through the table too.

The asker marks the job's row (``run_requested``); the clock that holds the schedule claims
it like a due run, runs it and records the run; the asker reads that record. So a run asked
for on any worker, or from another process, runs where the schedule runs, once, and nothing
needs a handle on the live scheduler. Within one process the two sides nudge each other
(``asked``, ``ran``) instead of waiting for the clock's next look.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import TYPE_CHECKING

from nanobot.cron.store import CronRun, CronStore

if TYPE_CHECKING:
    from nanobot.config import CodeRuntime


def run_wait_s(limits: CodeRuntime) -> float:
    """How long an asker waits for a code job's run: its time limit, and the clock's look at the
    table (which may be another worker's)."""
    return limits.max_execution_ms / 1000 + 10


class RunRequests:
    def __init__(self, store: CronStore, *, poll_interval: float = 1.0) -> None:
        self.store = store
        self.poll_interval = poll_interval  # how often a waiter looks when no clock of ours nudges it
        self.asked = asyncio.Event()  # the clock of this process: look at the table now
        self._ran = asyncio.Event()

    def ran(self) -> None:
        """The clock recorded a run: waiters look at the table now."""
        self._ran.set()
        self._ran = asyncio.Event()

    async def run(self, job_id: str, timeout: float) -> CronRun:
        """Ask for a run of the job and wait for its record; TimeoutError when none came."""
        previous = await self.store.runs(job_id, limit=1)
        if not await self.store.request_run(job_id):
            raise ValueError(f"no cron job with id {job_id!r}")
        self.asked.set()
        after = previous[0].id if previous else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ran = self._ran  # taken before the read: a run recorded meanwhile still wakes us
            latest = await self.store.runs(job_id, limit=1)
            if latest and latest[0].id != after:
                return latest[0]
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no run of cron job {job_id} within {timeout:g} s")
            with suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, self.poll_interval)):
                    await ran.wait()
