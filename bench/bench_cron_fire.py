"""Issue 5 figures: a code job from its fire time to its message handed to the channel, and
model calls per run.

One-shot ``at`` jobs are set for known instants; each prints its number, and the moment its
output is handed on for delivery (the gateway's ``intake.tell``, which records it and gives it
to the channel's outbox) is compared with the instant it was due. Everything in between is real: the cron clock, the store, the Monty
sandbox running the stored code, and delivery.

    python bench_cron_fire.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from common import p50

from tests.fakes.openai_server import FakeOpenAI
from tests.helpers import add_cron_job, config_for

RUNS = 30


async def _no_turns(msg):  # code jobs only: no prompt job asks for a turn
    raise RuntimeError("no turns in this bench")


async def main() -> None:
    os.environ["NANOBOT_HOME"] = tempfile.mkdtemp(prefix="nanobot-bench-home-")
    from nanobot.coordination import Alone
    from nanobot.gateway.cron_jobs import CronJobs, JobRunner
    from nanobot.runtime import open_runtime

    due: dict[str, float] = {}
    latencies: list[float] = []
    all_handed = asyncio.Event()

    async def handed_on(target: str, sender: str, text: str) -> None:  # what the gateway's intake.tell gets
        latencies.append((time.time() - due[text.split("\n")[-1]]) * 1000)
        if len(latencies) == RUNS:
            all_handed.set()

    async with FakeOpenAI() as llm:
        config = config_for(llm.base_url, Path(tempfile.mkdtemp(prefix="nanobot-bench-ws-")), mode="code")
        async with open_runtime(config) as rt:
            runner = JobRunner(rt, _no_turns, handed_on, rt.sessions.open, lambda: ["telegram"])
            jobs = CronJobs(runner, Alone())
            await jobs.start()
            await rt.sessions.open("cron:warmup")
            await rt.code.run("1", _ctx(rt), limits=config.agents.defaults.code_runtime.model_copy(
                update={"persist_state": False}), timezone="UTC", mode="warmup")  # a warm worker, as in a daemon
            start = datetime.now(timezone.utc) + timedelta(seconds=1)
            for i in range(RUNS):
                when = start + timedelta(milliseconds=150 * i)
                due[str(i)] = when.timestamp()
                await add_cron_job(jobs.service, owner_session="telegram:1", schedule_kind="at",
                                   expression=when.isoformat(), payload_kind="code", payload=f"print('{i}')")
            await asyncio.wait_for(all_handed.wait(), 30)
            await jobs.stop()
        print(f"code job, fire time to its output handed on for delivery: p50 {p50(latencies):.1f} ms, "
              f"max {max(latencies):.1f} ms over {RUNS} runs (target p50 < 50 ms)")
        print(f"model calls during {RUNS} code-job runs: {len(llm.chat_requests)} (target 0)")


def _ctx(rt):
    return rt.chat_context("cron:warmup")


if __name__ == "__main__":
    asyncio.run(main())
