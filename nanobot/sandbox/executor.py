"""Runs a chat's programs: the sandbox, the tools as host functions, skill helpers, the
chat's Python state kept in the database between processes, and telemetry.

Code mode and hybrid mode (agent/code_mode.py) hand it programs the model wrote; cron jobs hand
it stored code; ``validate_code`` checks a program without running it (``nanobot cron add``).
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot import metrics, tracing
from nanobot.config import CodeRuntime, Config
from nanobot.database import Database, Migrations, StoreUnavailable
from nanobot.sandbox.stubs import render_stubs
from nanobot.skills import skill_helpers_code
from nanobot.tools.paths import file_scope

if TYPE_CHECKING:  # sandbox.py and result.py load Monty: imported where a program runs
    from nanobot.sandbox.result import ExecutionResult
    from nanobot.sandbox.sandbox import Sandbox
    from nanobot.tools.registry import ToolContext, ToolRegistry
    from nanobot.usage import UsageStore

log = logging.getLogger(__name__)

# Functions that exist only inside programs; the host implements them per run.
CODE_ONLY_STUBS = '''def final_answer(value: Any) -> None: ...  # End the turn now; str(value) is the reply to the user.
def llm_query(prompt: str) -> str: ...  # Ask the model a self-contained question.
def use_skill(name: str) -> str: ...  # Define a skill's helper functions in this session.
def tool_help(name: str) -> str: ...  # A function's full stub.
'''

# use_skill("name") with a literal name: its helpers are loaded before the program runs, so
# they exist by the time the call is reached (a running program cannot define more code).
_USE_SKILL = re.compile(r"""\buse_skill\(\s*["']([\w.-]+)["']\s*\)""")

STATE_MIGRATIONS: Migrations = {
    "sqlite": ["CREATE TABLE code_state (session_key TEXT PRIMARY KEY, state BLOB NOT NULL, updated REAL NOT NULL);"],
    "postgresql": ["CREATE TABLE code_state (session_key TEXT PRIMARY KEY, state BYTEA NOT NULL, "
                   "updated DOUBLE PRECISION NOT NULL);"]}

Extra = Callable[..., Awaitable[Any]]


def code_stubs(tools: ToolRegistry, *, header: bool = True, ctx: ToolContext | None = None,
               listed: set[str] | None = None) -> str:
    """The functions' stubs (for the type checker: all; for a chat's prompt: ``ctx``, and
    ``listed``: the names shown by one line only)."""
    return render_stubs(tools.tools(ctx=ctx), header=header, listed=listed) + CODE_ONLY_STUBS


class CodeExecutor:
    """Runs programs for chats: the sandbox, host functions, saved Python state, telemetry."""

    def __init__(self, tools: ToolRegistry, db: Database, usage: UsageStore) -> None:
        self.tools = tools
        self.db = db  # where each chat's Python state is kept between processes
        self.usage = usage
        self._sandbox: Sandbox | None = None
        self._restored: set[str] = set()
        self._migrated = False

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:  # started on first use: a tools-mode process never pays for it
            from nanobot.sandbox.sandbox import Sandbox

            self._sandbox = Sandbox()
        return self._sandbox

    async def run(self, code: str, ctx: ToolContext, *, limits: CodeRuntime, timezone: str, mode: str,
                  extras: dict[str, Extra] | None = None, inputs: dict[str, Any] | None = None) -> ExecutionResult:
        """Run ``code`` in the chat's Python state with every tool (and ``extras``) as functions."""
        if len(code) > limits.max_program_chars:
            return _too_long(code, limits)
        tools = self.tools
        extras = {**(extras or {}), "use_skill": _use_skill(set(_USE_SKILL.findall(code)))}

        async def call(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
            if name in extras:
                return await extras[name](*args, **kwargs)
            tool = tools.get(name)
            log.info("[%s] %s(%s)", ctx.session_key, name, _short_args(args, kwargs))
            return await tools.call(name, tool.bind(args, kwargs), ctx)

        state_key = ctx.state_key or ctx.session_key  # a background task's programs have their own variables

        async def feed(program: str) -> ExecutionResult:
            return await self.sandbox.run(
                program, session_key=state_key, call=call, function_names=[*tools.names(), *extras],
                limits=limits, stubs=code_stubs(tools) if limits.type_check else None, inputs=inputs,
                save_state=limits.persist_state, timezone=timezone)

        # A state that could not be read (the database away) is not overwritten by this run's.
        seeded = limits.persist_state and await self._restore(state_key)
        with tracing.span("nanobot.sandbox", mode=mode):
            result = await self._run_with_skills(code, ctx, limits.persist_state, feed)
        if seeded:
            await self._save(state_key, result.state)
        outcome = "ok" if result.ok else (result.error_type or "error")
        metrics.current.sandbox_run(outcome)
        await self.usage.record_execution(ctx.session_key, mode, result.duration_ms, result.function_calls, outcome)
        return result

    @staticmethod
    async def _run_with_skills(code: str, ctx: ToolContext, stateful: bool,
                               feed: Callable[[str], Awaitable[ExecutionResult]]) -> ExecutionResult:
        """Define the helpers of the skills the program names, then run it.

        In a chat's lasting state the helpers are fed first, on their own, so the program's
        traceback line numbers stay its own; a stateless run (a cron job) gets them prepended.
        """
        from nanobot.sandbox.result import ExecutionResult

        try:
            prelude = "\n\n".join(_helpers(name, ctx) for name in dict.fromkeys(_USE_SKILL.findall(code)))
        except ValueError as exc:
            return ExecutionResult(error=f"ValueError: use_skill: {exc}", error_type="ValueError")
        if not prelude:
            return await feed(code)
        if not stateful:
            return await feed(prelude + "\n\n" + code)
        loaded = await feed(prelude)
        if not loaded.ok:
            loaded.error = f"while loading skill helpers:\n{loaded.error}"
            return loaded
        return await feed(code)

    async def check(self, code: str, limits: CodeRuntime) -> str | None:
        """Syntax (and, with typeCheck, types) of a program, without running it."""
        return await self.sandbox.check_code(code, stubs=code_stubs(self.tools), type_check=limits.type_check)

    async def reset(self, session_key: str) -> None:
        if self._sandbox is not None:
            await self._sandbox.reset(session_key)
        self._restored.discard(session_key)
        await (await self._db()).execute("DELETE FROM code_state WHERE session_key = $1", session_key)

    async def close(self) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()
            self._sandbox = None

    async def _db(self) -> Database:
        if not self._migrated:  # on first use: a start that runs no program need not wait for it
            await self.db.migrate("code_state", STATE_MIGRATIONS)
            self._migrated = True
        return self.db

    async def _restore(self, key: str) -> bool:
        """Seed the chat's state from the last process's dump, once per process; False while
        the database cannot be read (then it is tried again next run)."""
        if key in self._restored:
            return True
        try:
            db = await self._db()
            state = None if self.sandbox.has_state(key) else \
                await db.fetchval("SELECT state FROM code_state WHERE session_key = $1", key)
        except StoreUnavailable as exc:
            log.warning("[%s] Python state not restored: %s", key, exc)
            return False
        self._restored.add(key)
        if state is not None:
            self.sandbox.restore(key, bytes(state))
        return True

    async def _save(self, key: str, state: bytes | None) -> None:
        try:
            db = await self._db()
            if state is None:  # too large to keep (the result carries the notice) or lost
                await db.execute("DELETE FROM code_state WHERE session_key = $1", key)
            else:
                await db.execute("INSERT INTO code_state (session_key, state, updated) VALUES ($1, $2, $3) ON CONFLICT "
                                 "(session_key) DO UPDATE SET state = excluded.state, updated = excluded.updated",
                                 key, state, time.time())
        except StoreUnavailable as exc:  # kept in the sandbox; the next run saves it
            log.warning("[%s] Python state not saved: %s", key, exc)


def _too_long(code: str, limits: CodeRuntime) -> ExecutionResult:
    from nanobot.sandbox.result import ExecutionResult

    return ExecutionResult(
        error=(f"ValueError: this program is {len(code):,} characters long; programs may have up to "
               f"{limits.max_program_chars:,} (codeRuntime.maxProgramChars). It was not run. Put data in a file "
               "with write_file, or work in smaller steps, and keep the program short."),
        error_type="ValueError")


def _helpers(name: str, ctx: ToolContext) -> str:
    return skill_helpers_code(name, file_scope(ctx))


def _use_skill(loaded: set[str]) -> Extra:
    async def use_skill(name: str) -> str:
        """Reached after the named helpers were loaded (see _USE_SKILL); a computed name was not."""
        if name in loaded:
            return f"skill {name!r}: helpers defined"
        raise ValueError(f"use_skill needs the skill's name as a literal string, e.g. use_skill('weather'); "
                         f"got a computed name ({name!r})")

    return use_skill


def _short_args(args: tuple, kwargs: dict[str, Any]) -> str:
    text = ", ".join([*(repr(a) for a in args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return text if len(text) <= 80 else text[:77] + "..."


async def validate_code(code: str, config: Config) -> str | None:
    """Check a program without running it, in a throwaway sandbox (for the CLI's ``cron add``)."""
    from nanobot.sandbox.sandbox import Sandbox
    from nanobot.tools.builtin import default_registry

    sandbox = Sandbox(max_live_sessions=1, spare_workers=1)
    try:
        return await sandbox.check_code(code, stubs=code_stubs(default_registry(config)),
                                        type_check=config.agents.defaults.code_runtime.type_check)
    finally:
        await sandbox.close()
