"""What one program run produced, and how the model reads it.

The model learns from this text what its code did, so errors carry only what helps it fix
the code: the exception, the traceback lines in its own code (Monty's tracebacks never show
host frames), and a hint when a known mistake (``await`` on a plain function) caused it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_monty import MontyClassProxy, MontyStdTypeProxy

AWAIT_HINT = ("Functions in this sandbox are plain calls: call them without `await` or asyncio.gather, "
              "e.g. `x = f(...)`; the host pauses the program while each one runs.")
_UNAWAITED_MARK = "<coroutine external_future"
# Where the sandbox differs from Python, the error it gives and the way round (the prompt's
# subset line says the same in a few words).
SUBSET_HINTS = {
    ("TypeError", "object is not an iterator"):
        "a generator expression is a list in this sandbox: use next(iter(xs), default), or xs[0] after a check.",
}


def subset_hint(exc_type: str, message: str) -> str | None:
    return next((hint for (kind, text), hint in SUBSET_HINTS.items() if kind == exc_type and text in message), None)


@dataclass
class ExecutionResult:
    output: str = ""  # printed text, capped
    value: str | None = None  # repr of the last expression's value, unless None
    error: str | None = None  # exception, traceback into the model's code, hint
    error_type: str | None = None  # e.g. "FileNotFoundError", "SyntaxError", "TimeoutError"
    function_calls: int = 0
    duration_ms: float = 0.0
    state_reset: bool = False  # the session's Python variables are gone (crash, limit, cancel)
    notices: list[str] = field(default_factory=list)  # things the model should know besides
    state: bytes | None = field(default=None, repr=False)  # the session dump, if asked for

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_model_text(self) -> str:
        """The body of the ``<python_result>`` message: output, ``Out:`` value, error, notes."""
        parts = []
        if self.output:
            parts.append(self.output.rstrip("\n"))
        if self.value is not None:
            parts.append(f"Out: {self.value}")
        if self.error:
            parts.append(self.error.rstrip("\n"))
        parts.extend(f"Note: {n}" for n in self.notices)
        return "\n".join(parts) if parts else "(no output)"  # code_mode.NO_OUTPUT


class OutputBuffer:
    """A ``print_callback`` that keeps the first ``limit`` characters and counts the rest.

    Capping here (not with Monty's ``CollectString``, which fails the program when full)
    lets a chatty program finish; the model sees how much it missed.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._kept = 0
        self.dropped = 0

    def __call__(self, stream: str, text: str) -> None:
        room = self.limit - self._kept
        if room >= len(text):
            self._parts.append(text)
            self._kept += len(text)
        else:
            if room > 0:
                self._parts.append(text[:room])
                self._kept += room
            self.dropped += len(text) - max(room, 0)

    def text(self) -> str:
        out = "".join(self._parts)
        if self.dropped:
            out = out.rstrip("\n") + (f"\n[output truncated: {self.dropped:,} more characters not shown; print a "
                                      f"slice (text[{self.limit}:{2 * self.limit}]) or write the whole to a file with write_file]\n")
        return out


def display_value(value: Any, limit: int) -> str | None:
    """The REPL-style repr of a program's last value, capped; None stays None."""
    if value is None:
        return None
    if isinstance(value, MontyClassProxy):
        fields = ", ".join(f"{k}={v!r}" for k, v in value.attributes.items())
        text = f"{value.name}({fields})"
    elif isinstance(value, MontyStdTypeProxy):
        text = f"<built-in {value.kind} {value.name}>"
    else:
        text = repr(value)
    if len(text) > limit:
        text = text[:limit] + f"... [value truncated: {len(text) - limit} more characters]"
    return text


def mentions_unawaited(result: ExecutionResult) -> bool:
    """Did a coroutine leak into the output (a function handed out as an awaitable)?"""
    return _UNAWAITED_MARK in result.output or _UNAWAITED_MARK in (result.value or "")


def is_await_misuse(exc_type: str, message: str) -> bool:
    """Errors Monty gives when the program awaits or gathers a plain function's result."""
    return exc_type == "TypeError" and ("can't be awaited" in message or "awaitable is required" in message)
