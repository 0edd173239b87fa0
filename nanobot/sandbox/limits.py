"""How our ``codeRuntime`` settings become Monty's resource limits.

Kept apart so the mapping is written once, exactly: Monty rejects unknown keys, and two of
its defaults would bite a long-lived REPL session (see ``MAX_SUSPENSIONS``).
"""

from __future__ import annotations

from pydantic_monty import ResourceLimits

from nanobot.config import CodeRuntime

# Monty counts host calls, name lookups and sleeps per *checkout* and cannot disable the
# count (default 1000: ten programs of 100 calls would kill a chat's session). We enforce
# our own per-program cap (``max_tool_calls``), so Monty's is set out of reach.
MAX_SUSPENSIONS = 2**62

# The pool's request_timeout is a parent-side backstop that kills a worker stuck in one
# request (time spent in host tools does not count). Monty already kills a worker one second
# after a feed overruns its limit; this margin only has to cover dumps, loads and slow hosts.
REQUEST_TIMEOUT_MARGIN_S = 60.0


def resource_limits(rt: CodeRuntime) -> ResourceLimits:
    """The ``limits=`` for ``pool.checkout``: memory in bytes, execution time in seconds."""
    return {
        "max_memory": rt.max_memory_mb * 1024 * 1024,
        "max_feed_duration_secs": rt.max_execution_ms / 1000,
        "max_suspensions": MAX_SUSPENSIONS,
    }


def request_timeout_for(*runtimes: CodeRuntime) -> float:
    """A pool ``request_timeout`` that never cuts a program short of its own time limit."""
    longest_ms = max((rt.max_execution_ms for rt in runtimes), default=CodeRuntime().max_execution_ms)
    return longest_ms / 1000 + REQUEST_TIMEOUT_MARGIN_S
