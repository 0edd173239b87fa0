"""Start-up cost of the cron service: 1,000 stored jobs loaded and registered (target < 1 s).

Run: python bench/bench_cron.py [JOBS]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from nanobot.cron.run_requests import RunRequests
from nanobot.cron.service import CronService, RunOutcome
from nanobot.cron.store import CronStore

TARGET_SECONDS = 1.0


async def never_called(job) -> RunOutcome:  # every job is scheduled far enough ahead
    return RunOutcome("ok")


def schedule_for(i: int) -> tuple[str, str]:
    """A realistic mix: crontab expressions (some with weekday ranges) and intervals."""
    if i % 3 == 0:
        return "every", str(3600 + i)
    return "cron", f"{i % 60} {i % 24} * * {'1-5' if i % 2 else '0'}"


async def main(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "nanobot.db"
        store = await CronStore.open(db)
        for i in range(count):
            kind, expression = schedule_for(i)
            # Inserted directly: the bench measures start-up, not validation on add.
            await store.add(name=f"job {i}", owner_session="telegram:1", schedule_kind=kind,
                            expression=expression, timezone="Europe/Berlin", payload_kind="code",
                            payload="print('hi')")
        service = CronService(RunRequests(store), never_called, timezone="Europe/Berlin", poll_interval=1.0)
        started = time.perf_counter()
        await service.start()
        elapsed = time.perf_counter() - started
        registered = sum(job.next_run_at is not None for job in await store.list())
        await service.stop()
        await store.close()
    assert registered == count, f"only {registered} of {count} jobs got a next run time"
    return elapsed


if __name__ == "__main__":
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seconds = asyncio.run(main(jobs))
    verdict = "ok" if seconds < TARGET_SECONDS else "SLOWER THAN TARGET"
    print(f"cron start with {jobs} jobs: {seconds * 1000:.0f} ms (target < {TARGET_SECONDS * 1000:.0f} ms) {verdict}")
