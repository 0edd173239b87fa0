"""Run one program on one Monty session, answering its function calls from the host.

The program calls tools like plain functions. Monty pauses it at each call (``feed_start``
returns a snapshot), we run the function here, and resume the program with the value, or
with the exception, as a built-in type the program can ``try/except``. The loop never hands
the program an awaitable, so there is nothing for it to forget to ``await``.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from typing import Any, Awaitable, Callable, Collection

from pydantic_monty import (
    AsyncFunctionSnapshot,
    AsyncFutureSnapshot,
    AsyncMontySession,
    AsyncNameLookupSnapshot,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
    MontyTypingError,
)

from nanobot.config import CodeRuntime
from nanobot.sandbox.offers import MISSING_BUILTINS, builtin_refusal, import_refusal
from nanobot.sandbox.result import (
    AWAIT_HINT,
    ExecutionResult,
    OutputBuffer,
    display_value,
    is_await_misuse,
    subset_hint,
    mentions_unawaited,
)

HostCall = Callable[[str, tuple, dict], Awaitable[Any]]
"""``call(name, args, kwargs)``: run the function the program called; raise to fail it."""

# Exceptions that reach the program as themselves (Monty maps subclasses to the nearest
# built-in it knows); anything else becomes a RuntimeError naming the original type.
_PASSTHROUGH = (OSError, ValueError, TypeError, LookupError, RuntimeError, ArithmeticError,
                AttributeError, NameError, AssertionError, NotImplementedError)
_LIMIT_MESSAGE = re.compile(r"(feed|turn) time limit exceeded|memory limit exceeded")


class StopProgram(Exception):
    """Raise from ``call`` to end the program at that call (e.g. ``final_answer``).

    The program gets a ``SystemExit``, which ``except Exception`` does not catch; the run
    then counts as a success with the output printed so far.
    """


class _Run:
    """The state of one program run: counters, output, and how to answer each pause."""

    def __init__(self, code: str, call: HostCall, function_names: Collection[str], limits: CodeRuntime) -> None:
        self.code = code
        self.call = call
        self.function_names = function_names
        self.limits = limits
        self.output = OutputBuffer(limits.max_output_chars)
        self.calls = 0
        self.stopped = False
        self.sleep_budget = limits.max_execution_ms / 1000

    async def drive(self, session: AsyncMontySession, inputs: dict[str, Any] | None, skip_type_check: bool) -> Any:
        snap = await session.feed_start(self.code, inputs=inputs, print_callback=self.output,
                                        skip_type_check=skip_type_check)
        while not isinstance(snap, MontyComplete):
            if isinstance(snap, AsyncNameLookupSnapshot):
                snap = await self._lookup(snap)
            elif isinstance(snap, AsyncFunctionSnapshot):
                snap = await _resume(snap, await self._answer(snap))
            elif isinstance(snap, AsyncFutureSnapshot):  # only if a future was handed out; we never do
                error = {"exception": RuntimeError("awaiting host futures is not supported")}
                snap = await snap.resume({call_id: error for call_id in snap.pending_call_ids})
            else:
                raise RuntimeError(f"unexpected Monty snapshot {snap!r}")
        return snap.output

    async def _lookup(self, snap: AsyncNameLookupSnapshot) -> Any:
        """A tool named without being called (``f = read_file``) becomes a callable; else NameError."""
        name = snap.variable_name
        if name in self.function_names or name in MISSING_BUILTINS:  # the latter answer with a hint
            return await snap.resume(value=_host_function(name))
        return await snap.resume()

    async def _answer(self, snap: AsyncFunctionSnapshot) -> dict[str, Any]:
        """The ``ExternalResult`` for one paused call."""
        name = snap.function_name
        if snap.is_os_function:
            return await self._os_call(name, snap.args)
        if name not in self.function_names:
            refusal = builtin_refusal(name) if name in MISSING_BUILTINS else NameError(f"name '{name}' is not defined")
            return {"exception": refusal}
        if self._is_awaited(snap):
            return {"exception": TypeError(
                f"{name}() is a plain function here, not a coroutine: call it without `await`, "
                f"e.g. `x = {name}(...)`; the host pauses the program while it runs")}
        if self.calls >= self.limits.max_tool_calls:
            return {"exception": RuntimeError(
                f"function call limit reached: a program may make at most {self.limits.max_tool_calls} "
                f"function calls; finish this in a later program, with fewer calls")}
        self.calls += 1
        try:
            value = await self.call(name, tuple(snap.args), dict(snap.kwargs))
            while inspect.isawaitable(value):  # a host closure that forgot an await
                value = await value
        except StopProgram:
            self.stopped = True
            return {"exception": SystemExit(0)}
        except Exception as exc:
            return {"exception": program_exception(exc)}
        return {"return_value": value}

    async def _os_call(self, name: str, args: tuple) -> dict[str, Any]:
        """``time.sleep`` is allowed within the run's time budget; other OS access is refused."""
        if name == "system.sleep":
            seconds = max(float(args[0]), 0.0) if args else 0.0
            if seconds > self.sleep_budget:
                return {"exception": TimeoutError("sleeping this long would exceed the program's time limit")}
            self.sleep_budget -= seconds
            await asyncio.sleep(seconds)
            return {"return_value": None}
        if name == "import" and args:
            return {"exception": import_refusal(str(args[0]))}
        return {"exception": PermissionError(
            f"{name}: the sandbox has no direct file, network or OS access; use the provided functions")}

    def _is_awaited(self, snap: AsyncFunctionSnapshot) -> bool:
        """Is this call written as ``await name(...)`` in the program being run?"""
        source = self.code.encode()
        pos = snap.position
        if not 0 <= pos.start < pos.end <= len(source):
            return False
        if not source[pos.start:pos.end].startswith(snap.function_name.encode()):
            return False  # the position points into an earlier program of the session
        before = source[:pos.start].rstrip(b" \t(")
        return before.endswith(b"await") and not before[-6:-5].isalnum() and before[-6:-5] != b"_"


def _host_function(name: str) -> Callable[..., Any]:
    """A stand-in whose name Monty reports when the program calls it; never run here."""

    def host_function(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is answered through the snapshot loop")

    host_function.__name__ = host_function.__qualname__ = name
    return host_function


async def _resume(snap: AsyncFunctionSnapshot, answer: dict[str, Any]) -> Any:
    """Resume; a value that cannot cross into the sandbox becomes a TypeError in the program."""
    try:
        return await snap.resume(answer)
    except MontyRuntimeError as exc:
        if "return_value" not in answer:
            raise
        problem = TypeError(f"{snap.function_name}() returned a value the sandbox cannot hold: {exc}")
        try:  # a failed conversion leaves the snapshot unanswered; a program error consumed it
            return await snap.resume({"exception": problem})
        except MontyError:
            raise
        except RuntimeError:
            raise exc from None


def program_exception(exc: Exception) -> Exception:
    """The exception the program sees for a failed host call: a built-in type it can catch."""
    if isinstance(exc, _PASSTHROUGH):
        return exc
    return RuntimeError(f"{type(exc).__name__}: {exc}")


async def execute(session: AsyncMontySession, code: str, *, call: HostCall, function_names: Collection[str],
                  limits: CodeRuntime, inputs: dict[str, Any] | None = None,
                  skip_type_check: bool = False) -> ExecutionResult:
    """Run ``code`` to the end on ``session``; every failure becomes an error result.

    ``result.state_reset`` says the session must not be fed again (crash, or a time or memory
    limit, after which Monty gives no guarantee about the heap). Cancellation propagates; the
    session is then unusable too (Monty discards a worker whose request was cancelled).
    """
    run = _Run(code, call, function_names, limits)
    result = ExecutionResult()
    started = time.perf_counter()
    try:
        result.value = display_value(await run.drive(session, inputs, skip_type_check), limits.max_output_chars)
    except MontySyntaxError as exc:
        result.error, result.error_type = exc.display(), "SyntaxError"
    except MontyTypingError as exc:
        result.error, result.error_type = f"Type check failed:\n{exc.display()}", "TypeCheckError"
    except MontyRuntimeError as exc:
        _runtime_error(result, exc, run, limits)
    except MontyCrashedError as exc:
        result.error, result.error_type = f"SandboxCrash: the Python worker died ({exc}).", "SandboxCrash"
        result.state_reset = True
    except MontyError as exc:  # e.g. MontyConversionError for an input value
        result.error, result.error_type = f"{type(exc.exception()).__name__}: {exc}", type(exc.exception()).__name__
    except RuntimeError as exc:  # the session is unusable (e.g. its worker was already lost)
        result.error, result.error_type = f"SandboxCrash: {exc}", "SandboxCrash"
        result.state_reset = True
    result.output = run.output.text()
    result.function_calls = run.calls
    result.duration_ms = (time.perf_counter() - started) * 1000
    if result.state_reset:
        result.notices.append("The Python state of this chat was reset: variables and functions "
                              "defined by earlier programs are gone.")
    if mentions_unawaited(result):
        result.notices.append(AWAIT_HINT)
    return result


def _runtime_error(result: ExecutionResult, exc: MontyRuntimeError, run: _Run, limits: CodeRuntime) -> None:
    inner = exc.exception()
    kind, message = type(inner).__name__, str(inner)
    if kind == "SystemExit" and run.stopped:
        return  # ended on purpose by a host function
    text = exc.display()
    if kind in ("TimeoutError", "MemoryError") and _LIMIT_MESSAGE.search(message):
        result.state_reset = True
        if kind == "TimeoutError":
            explained = (f"TimeoutError: the program ran longer than its {limits.max_execution_ms} ms limit "
                         f"and was stopped (time spent inside function calls does not count)")
        else:
            explained = (f"MemoryError: the program used more than its {limits.max_memory_mb} MB "
                         f"memory limit and was stopped")
        text = text[: text.rfind(f"{kind}:")] + explained if f"{kind}:" in text else explained
    elif is_await_misuse(kind, message):
        text += f"\nHint: {AWAIT_HINT}"
    elif hint := subset_hint(kind, message):
        text += f"\nHint: {hint}"
    result.error, result.error_type = text, kind
