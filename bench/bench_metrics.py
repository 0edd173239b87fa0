"""What metrics cost a turn: the same tools-mode turn (one tool call, then the answer; the
scripted model answers at once) with ``gateway.metrics`` off and on, alternating in rounds so
that the machine's mood falls on both alike.

    python bench/bench_metrics.py [--turns 300] [--rounds 5]

Prints the median turn time of each and the difference (goal: under 0.2 ms with metrics on;
with them off the hot path only calls no-op methods).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot import metrics
from nanobot.runtime import Runtime, open_runtime
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for


async def turns(rt: Runtime, llm: FakeOpenAI, count: int, chats: str) -> float:
    """Median seconds of a turn that lists the workspace once, then answers (in fresh chats:
    a history that grew over the earlier rounds would make later turns slower)."""
    took = []
    for n in range(count):
        llm.script(tool_call("list_dir", {}), reply("done"))
        started = time.perf_counter()
        await rt.agent.handle(f"cli:{chats}{n % 10}", "list it")
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def calls_per_turn(repeat: int = 20000) -> float:
    """Microseconds of the metric calls such a turn makes (received, two model calls, a tool
    call, the turn, the reply sent), measured alone: the end-to-end difference is within noise."""
    m = metrics.enable("bench")
    started = time.perf_counter()
    for _ in range(repeat):
        m.received("telegram")
        m.model_call("openai", "m", "ok", 10, 5, 0.0)
        m.tool_call("list_dir", "ok")
        m.model_call("openai", "m", "ok", 10, 5, 0.0)
        m.turn("tools", 0.01, "ok")
        m.reply_sent("telegram")
    metrics.disable()
    return (time.perf_counter() - started) / repeat * 1e6


async def main(count: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NANOBOT_HOME"] = tmp
        async with FakeOpenAI() as llm:
            config = config_for(llm.base_url, Path(tmp) / "workspace", mode="tools", memory_window=100000)
            async with open_runtime(config) as rt:
                await turns(rt, llm, 20, "warm")
                off, on = [], []
                for r in range(rounds):  # each first in every other round
                    for enabled in ((False, True) if r % 2 else (True, False)):
                        metrics.enable("bench") if enabled else metrics.disable()
                        (on if enabled else off).append(await turns(rt, llm, count, f"r{r}{enabled}-"))
                metrics.disable()
    a, b = statistics.median(off), statistics.median(on)
    print(f"turn (one tool call, instant model), median of {rounds} rounds x {count} turns: "
          f"metrics off {a * 1000:.2f} ms, on {b * 1000:.2f} ms, difference {(b - a) * 1000:+.3f} ms "
          f"(goal < 0.2 ms); machine reference {common.reference_ms():.1f} ms")
    print(f"the metric calls of one such turn, alone: {calls_per_turn():.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds))
