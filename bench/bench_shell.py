"""What confinement costs per shell command: exec_command through the real registry, confined
(Landlock + seccomp + capability drop + rlimits, the default) and unconfined (sandbox "off").

    python bench/bench_shell.py

Both run ``true``, the cheapest command, so the figure is the launcher's own cost; each is the
median of RUNS commands after a warm-up, with the steering-file snapshot and the group kill
included (they run in both modes).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from nanobot.config import Config
from nanobot.tools.builtin import default_registry
from nanobot.tools.registry import ToolContext
from nanobot.tools.shell import confinement
from nanobot.trust import OWNER

RUNS = 100


async def measure(sandbox: str, workspace: Path) -> list[float]:
    config = Config()
    config.agents.defaults.workspace = str(workspace)
    config.tools.exec.sandbox = sandbox
    registry = default_registry(config)
    ctx = ToolContext(config=config, workspace=workspace, session_key="cli:bench", trust=OWNER)
    for _ in range(5):
        await registry.call("exec_command", {"command": "true"}, ctx)
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        await registry.call("exec_command", {"command": "true"}, ctx)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def main() -> None:
    print(f"confinement here: {confinement().detail}")
    with tempfile.TemporaryDirectory() as tmp:
        for sandbox in ("auto", "off"):
            samples = await measure(sandbox, Path(tmp))
            q = statistics.quantiles(samples, n=10)
            print(f"sandbox={sandbox:4}  p50 {statistics.median(samples):6.1f} ms  p90 {q[8]:6.1f} ms  "
                  f"({RUNS} runs of exec_command('true'))")


if __name__ == "__main__":
    asyncio.run(main())
