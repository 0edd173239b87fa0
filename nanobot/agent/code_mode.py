"""Code mode: the model answers with a Python program, run in Monty with the tools as functions.

One program can list, read, filter and write many things in one model round trip; only what
it prints (or its last value, or its error) goes back to the model, and ``final_answer``
ends the turn with no further model call. Hybrid mode offers the same runner as a native
``exec_python`` tool beside the other tools, sharing the chat's Python state.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot.agent.context import render_prompt
from nanobot.agent.tool_offer import native_schemas
from nanobot.agent.markup import answer_or_failure, extract_code, for_the_user, say_notes, strip_think, without_say
from nanobot.agent.modes import (ToolsMode, attachments_note, keep_long_message,
                                 long_message_preview, run_tool_call)
from nanobot.config import CodeRuntime, Config
from nanobot.db import migrate
from nanobot.providers.base import LLMResponse, parse_arguments

if TYPE_CHECKING:
    from nanobot.media.intake import Attachments
    from nanobot.agent.deps import AgentDeps
    from nanobot.agent.loop import Turn
    from nanobot.sandbox import ExecutionResult, Sandbox
    from nanobot.tools.registry import ToolContext, ToolRegistry

log = logging.getLogger(__name__)

# Functions that exist only inside programs; the host implements them per run.
CODE_ONLY_STUBS = '''def final_answer(value: Any) -> None: ...  # End the turn now; str(value) is the reply to the user.
def llm_query(prompt: str) -> str: ...  # Ask the model a self-contained question (e.g. about a chunk of text).
def use_skill(name: str) -> str: ...  # Define a skill's helper functions in this session.
def tool_help(name: str) -> str: ...  # A function's full stub: its parameters and its result.
'''

# use_skill("name") with a literal name: its helpers are loaded before the program runs, so
# they exist by the time the call is reached (a running program cannot define more code).
_USE_SKILL = re.compile(r"""\buse_skill\(\s*["']([\w.-]+)["']\s*\)""")

STATE_MIGRATIONS = ["CREATE TABLE code_state (session_key TEXT PRIMARY KEY, state BLOB NOT NULL, updated REAL NOT NULL);"]

Extra = Callable[..., Awaitable[Any]]


def code_stubs(tools: ToolRegistry, *, header: bool = True, ctx: ToolContext | None = None,
               budgeted: bool = False) -> str:
    """The functions' stubs (for the type checker: all; for a chat's prompt: ``ctx``, ``budgeted``)."""
    from nanobot.sandbox import render_stubs

    return render_stubs(tools.tools(ctx=ctx), header=header, budgeted=budgeted) + CODE_ONLY_STUBS


class CodeExecutor:
    """Runs programs for chats: the sandbox, host functions, saved Python state, telemetry."""

    def __init__(self, deps: AgentDeps) -> None:
        self.deps = deps
        self._sandbox: Sandbox | None = None
        self._restored: set[str] = set()
        self._migrated = False

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:  # started on first use: a tools-mode process never pays for it
            from nanobot.sandbox import Sandbox

            self._sandbox = Sandbox()
        return self._sandbox

    async def run(self, code: str, ctx: ToolContext, *, limits: CodeRuntime, timezone: str, mode: str,
                  extras: dict[str, Extra] | None = None, inputs: dict[str, Any] | None = None) -> ExecutionResult:
        """Run ``code`` in the chat's Python state with every tool (and ``extras``) as functions."""
        if len(code) > limits.max_program_chars:
            return _too_long(code, limits)
        tools = self.deps.tools
        extras = {**(extras or {}), "use_skill": _use_skill(set(_USE_SKILL.findall(code)))}

        async def call(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
            if name in extras:
                return await extras[name](*args, **kwargs)
            tool = tools.get(name)
            log.info("[%s] %s(%s)", ctx.session_key, name, _short_args(args, kwargs))
            return await tools.call(name, tool.bind(args, kwargs), ctx)

        async def feed(program: str) -> ExecutionResult:
            return await self.sandbox.run(
                program, session_key=ctx.session_key, call=call, function_names=[*tools.names(), *extras],
                limits=limits, stubs=code_stubs(tools) if limits.type_check else None, inputs=inputs,
                save_state=limits.persist_state, timezone=timezone)

        if limits.persist_state:
            await self._restore(ctx.session_key)
        result = await self._run_with_skills(code, ctx, limits.persist_state, feed)
        if limits.persist_state:
            await self._save(ctx.session_key, result.state)
        if self.deps.usage:
            await self.deps.usage.record_execution(ctx.session_key, mode, result.duration_ms, result.function_calls,
                                                   "ok" if result.ok else (result.error_type or "error"))
        return result

    @staticmethod
    async def _run_with_skills(code: str, ctx: ToolContext, stateful: bool,
                               feed: Callable[[str], Awaitable[ExecutionResult]]) -> ExecutionResult:
        """Define the helpers of the skills the program names, then run it.

        In a chat's lasting state the helpers are fed first, on their own, so the program's
        traceback line numbers stay its own; a stateless run (a cron job) gets them prepended.
        """
        from nanobot.sandbox import ExecutionResult

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
        return await self.sandbox.check_code(code, stubs=code_stubs(self.deps.tools), type_check=limits.type_check)

    async def reset(self, session_key: str) -> None:
        if self._sandbox is not None:
            await self._sandbox.reset(session_key)
        self._restored.discard(session_key)
        db = await self._db()
        if db is not None:
            await db.execute("DELETE FROM code_state WHERE session_key = ?", (session_key,))
            await db.commit()

    async def close(self) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()
            self._sandbox = None

    async def _db(self):
        db = self.deps.services.db
        if db is not None and not self._migrated:
            await migrate(db, "code_state", STATE_MIGRATIONS)
            self._migrated = True
        return db

    async def _restore(self, key: str) -> None:
        """Seed the chat's state from the last process's dump, once per process."""
        if key in self._restored:
            return
        self._restored.add(key)
        db = await self._db()
        if db is None or self.sandbox.has_state(key):
            return
        async with db.execute("SELECT state FROM code_state WHERE session_key = ?", (key,)) as cur:
            row = await cur.fetchone()
        if row:
            self.sandbox.restore(key, bytes(row[0]))

    async def _save(self, key: str, state: bytes | None) -> None:
        db = await self._db()
        if db is None:
            return
        if state is None:  # too large to keep (the result carries the notice) or lost
            await db.execute("DELETE FROM code_state WHERE session_key = ?", (key,))
        else:
            await db.execute("INSERT INTO code_state (session_key, state, updated) VALUES (?, ?, ?) "
                             "ON CONFLICT(session_key) DO UPDATE SET state = excluded.state, updated = excluded.updated",
                             (key, state, time.time()))
        await db.commit()


def _too_long(code: str, limits: CodeRuntime) -> ExecutionResult:
    from nanobot.sandbox import ExecutionResult

    return ExecutionResult(
        error=(f"ValueError: this program is {len(code):,} characters long; programs may have up to "
               f"{limits.max_program_chars:,} (codeRuntime.maxProgramChars). It was not run. Put data in a file "
               "with write_file, or work in smaller steps, and keep the program short."),
        error_type="ValueError")


def _helpers(name: str, ctx: ToolContext) -> str:
    from nanobot.skills import skill_helpers_code
    from nanobot.tools.paths import file_scope

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


def executor(turn: Turn) -> CodeExecutor:
    """The process's one executor (made by the Runtime, which also closes its sandbox)."""
    assert turn.deps.services.code is not None, "the Runtime makes the code executor"
    return turn.deps.services.code


def turn_functions(turn: Turn) -> dict[str, Extra]:
    """``final_answer``, ``llm_query`` and ``tool_help``, bound to this turn."""
    from nanobot.sandbox import StopProgram

    async def final_answer(value: Any = "") -> None:
        turn.final = value if isinstance(value, str) else repr(value)
        raise StopProgram()

    async def llm_query(prompt: str) -> str:
        limit = turn.settings.code_runtime.max_llm_queries
        if turn.llm_queries >= limit:
            raise RuntimeError(f"llm_query budget used up ({limit} per turn, codeRuntime.maxLlmQueries)")
        turn.llm_queries += 1
        response = await turn.ask_model(messages=[{"role": "user", "content": str(prompt)}], purpose="llm_query")
        return strip_think(response.content)

    async def tool_help(name: str) -> str:
        found = turn.deps.tools.get(name)
        if found is None or found.code_only or not found.available(turn.ctx):
            raise ValueError(f"no function {name!r}")
        return found.stub()

    return {"final_answer": final_answer, "llm_query": llm_query, "tool_help": tool_help}


async def run_program(turn: Turn, code: str) -> str:
    """Run one program for the turn; the text of its ``<python_result>`` message."""
    settings = turn.settings
    result = await executor(turn).run(code, turn.ctx, limits=settings.code_runtime, timezone=settings.timezone,
                                      mode=turn.mode.name, extras=turn_functions(turn), inputs=turn.inputs or None)
    return result.to_model_text()


NO_OUTPUT = "(no output)"  # ExecutionResult.to_model_text of a quiet program


def _imports_line() -> str:
    from nanobot.sandbox.offers import prompt_line  # the sandbox package loads Monty: only when code runs

    return prompt_line()


def prompt_stubs(turn: Turn) -> str:
    return code_stubs(turn.deps.tools, header=False, ctx=turn.ctx, budgeted=True).strip()


class CodeMode:
    name = "code"

    def prompt_section(self, turn: Turn) -> str:
        rt = turn.settings.code_runtime
        return render_prompt("code_mode.md", stubs=prompt_stubs(turn), imports=_imports_line(),
                             max_seconds=f"{rt.max_execution_ms / 1000:g}", max_calls=rt.max_tool_calls)

    def native_tools(self, turn: Turn) -> list[dict[str, Any]] | None:
        return None  # the functions are described as Python stubs in the prompt instead

    def user_content(self, turn: Turn, content: str, attachments: Attachments) -> str:
        return large_inputs(turn, content, attachments)

    async def step(self, turn: Turn, response: LLMResponse) -> str | None:
        text = strip_think(response.content)
        for note in say_notes(text):
            await turn.say(note)
        block = extract_code(text)
        if block is None:
            reply = for_the_user(without_say(text))
            turn.add({"role": "assistant", "content": reply})
            return answer_or_failure(reply)
        if len(block.code) > turn.settings.code_runtime.max_program_chars:  # refused: keep the prompt small
            text = f"{block.before}\n[a program of {len(block.code):,} characters, not run]".strip()
        turn.add({"role": "assistant", "content": text})
        turn.check_repeat("python", block.code)
        log.debug("[%s] running the model's program:\n%s", turn.session.key, block.code)
        output = await run_program(turn, block.code)
        if turn.final is None or output != NO_OUTPUT:  # an empty result before the answer says nothing
            turn.add({"role": "user", "content": f"<python_result>\n{output}\n</python_result>"})
        if turn.final is not None:
            turn.session.append({"role": "assistant", "content": turn.final})
        return turn.final


def large_inputs(turn: Turn, content: str, attachments: Attachments) -> str:
    """Hand big messages and sent documents to programs as variables instead of the prompt.

    ``context`` is the latest long message of the chat, in this turn and in later ones (it is
    kept as a file in the chat's folder), so a program written a few turns on still finds it.
    A sent document's text is in ``files`` (name -> text), and is ``context`` too when the
    message itself is short.
    """
    parts = []
    saved = keep_long_message(turn, content)
    if saved is not None:
        turn.inputs["context"] = content
        parts.append(f"[The user's message is {len(content):,} characters long; it is in the variable `context` "
                     f"(and the file {saved}). Its beginning and end:]\n{long_message_preview(content)}")
    else:
        earlier = _earlier_long_message(turn)
        if earlier is not None:
            turn.inputs["context"] = earlier
        parts.append(content)
    files = {doc.name: doc.text for doc in attachments.documents}
    if files:
        turn.inputs["files"] = files
        if "context" not in turn.inputs:
            turn.inputs["context"] = attachments.documents[0].text
        for doc in attachments.documents:
            cut = ", cut at the size limit" if doc.truncated else ""
            parts.append(f"[document {doc.path}: its text is files[{doc.name!r}] ({len(doc.text):,} chars{cut}). "
                         f"It begins:]\n{doc.preview()}")
    parts.append(attachments_note(attachments))
    return "\n".join(p for p in parts if p)


def _earlier_long_message(turn: Turn) -> str | None:
    name = turn.session.meta.long_message
    if name is None:
        return None
    try:
        return (turn.ctx.workspace / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


class HybridMode(ToolsMode):
    """Native tools plus ``exec_python(code)``, which runs code like code mode does."""

    name = "hybrid"

    def prompt_section(self, turn: Turn) -> str:
        return render_prompt("hybrid_mode.md", stubs=prompt_stubs(turn), imports=_imports_line())

    def native_tools(self, turn: Turn) -> list[dict[str, Any]] | None:
        return [*native_schemas(turn), EXEC_PYTHON_SCHEMA]

    def user_content(self, turn: Turn, content: str, attachments: Attachments) -> str:
        return large_inputs(turn, content, attachments)

    async def run_call(self, turn: Turn, name: str, raw_arguments: str) -> str:
        if name != "exec_python":
            return await run_tool_call(turn, name, raw_arguments)
        try:
            code = parse_arguments(raw_arguments).get("code")
        except ValueError as exc:
            return f"Error: exec_python was not run: {exc}"
        if not isinstance(code, str) or not code.strip():
            return "Error: exec_python needs a non-empty 'code' string"
        return await run_program(turn, code)


EXEC_PYTHON_SCHEMA = {"type": "function", "function": {
    "name": "exec_python",
    "description": ("Run a Python program in this chat's persistent sandbox. Every other tool is a plain function "
                    "there (no await). Returns printed output, the last expression's value, or the error."),
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


async def validate_code(code: str, config: Config) -> str | None:
    """Check a program without running it, in a throwaway sandbox (for the CLI's ``cron add``)."""
    from nanobot.sandbox import Sandbox
    from nanobot.tools.builtin import default_registry

    sandbox = Sandbox(max_live_sessions=1, spare_workers=1)
    try:
        return await sandbox.check_code(code, stubs=code_stubs(default_registry(config)),
                                        type_check=config.agents.defaults.code_runtime.type_check)
    finally:
        await sandbox.close()
