"""Sandbox overhead on a warm pool: what code mode costs on top of the tools themselves.

    python bench/bench_sandbox.py

(a) a program with no function calls, p50 over 200 runs in one session (target < 2 ms);
(b) one program making 100 sequential calls to an instant tool, time on top of the tool
    (target < 60 ms).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from nanobot.config import CodeRuntime
from nanobot.sandbox import Sandbox

LIMITS = CodeRuntime()  # the defaults: 100 MB, 30 s, 200 calls
RUNS = 200


async def instant_tool(name: str, args: tuple, kwargs: dict) -> int:
    return args[0] + 1


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


async def main() -> None:
    box = Sandbox()
    try:
        started = time.perf_counter()
        first = await box.run("1 + 1", session_key="bench:a", call=instant_tool, function_names={"inc"}, limits=LIMITS)
        assert first.ok, first.error
        print(f"cold start (pool + checkout + first run): {(time.perf_counter() - started) * 1000:.1f} ms")

        code = "total = 0\nfor i in range(100):\n    total += i * i\nrecord = {'total': total}\nrecord"
        samples = []
        for _ in range(RUNS):
            t = time.perf_counter()
            result = await box.run(code, session_key="bench:a", call=instant_tool, function_names={"inc"},
                                   limits=LIMITS)
            samples.append((time.perf_counter() - t) * 1000)
            assert result.ok, result.error
        print(f"(a) no-call program, warm session, {RUNS} runs: p50 {statistics.median(samples):.3f} ms, "
              f"p90 {pct(samples, 0.9):.3f} ms, max {max(samples):.3f} ms  (target p50 < 2 ms)")

        stateless = LIMITS.model_copy(update={"persist_state": False})
        samples = []
        for _ in range(RUNS):
            t = time.perf_counter()
            await box.run(code, session_key="bench:s", call=instant_tool, function_names={"inc"}, limits=stateless)
            samples.append((time.perf_counter() - t) * 1000)
        print(f"    same, stateless (checkout per run): p50 {statistics.median(samples):.3f} ms")

        code = "n = 0\nfor i in range(100):\n    n = inc(n)\nn"
        samples, tool_ms = [], []
        for _ in range(30):
            tool_time = 0.0

            async def timed_tool(name: str, args: tuple, kwargs: dict) -> int:
                nonlocal tool_time
                t0 = time.perf_counter()
                value = await instant_tool(name, args, kwargs)
                tool_time += time.perf_counter() - t0
                return value

            t = time.perf_counter()
            result = await box.run(code, session_key="bench:b", call=timed_tool, function_names={"inc"}, limits=LIMITS)
            total = (time.perf_counter() - t) * 1000
            assert result.ok and result.value == "100" and result.function_calls == 100, result
            samples.append(total - tool_time * 1000)
            tool_ms.append(tool_time * 1000)
        print(f"(b) 100 sequential calls, instant tool, 30 runs: p50 {statistics.median(samples):.1f} ms "
              f"on top of the tools ({statistics.median(samples) / 100 * 1000:.0f} us/call; tools themselves "
              f"{statistics.median(tool_ms):.2f} ms), max {max(samples):.1f} ms  (target < 60 ms)")
    finally:
        await box.close()


if __name__ == "__main__":
    asyncio.run(main())
