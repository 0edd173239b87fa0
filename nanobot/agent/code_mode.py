"""Code mode: the model answers with a Python program, run in Monty with the tools as functions.

One program can list, read, filter and write many things in one model round trip; only what
it prints (or its last value, or its error) goes back to the model, and ``final_answer``
ends the turn with no further model call. Hybrid mode offers the same runner as a native
``exec_python`` tool beside the other tools, sharing the chat's Python state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nanobot import beneath
from nanobot.prompts import render_prompt
from nanobot.agent.prompt_size import estimate_tokens, prompt_budget
from nanobot.agent.tool_offer import native_schemas, on_demand
from nanobot.agent.markup import (answer_or_failure, extract_code, for_the_user, say_notes, strip_think,
                                  text_tool_calls, without_say)
from nanobot.agent.modes import (ToolsMode, attachments_note, keep_long_message,
                                 long_message_preview, run_tool_call, split_text_call)
from nanobot.providers.base import LLMResponse, parse_arguments
from nanobot.tools.messaging import fit_message
from nanobot.sandbox.executor import CodeExecutor, Extra, code_stubs

if TYPE_CHECKING:
    from nanobot.media.attachments import Attachments
    from nanobot.agent.turn import Turn

log = logging.getLogger(__name__)


def executor(turn: Turn) -> CodeExecutor:
    """The process's one executor (made by the Runtime, which also closes its sandbox)."""
    return turn.deps.code


def turn_functions(turn: Turn) -> dict[str, Extra]:
    """``final_answer``, ``llm_query`` and ``tool_help``, bound to this turn."""
    from nanobot.sandbox import StopProgram

    async def final_answer(value: Any = "") -> None:
        turn.state.final = fit_message(value if isinstance(value, str) else repr(value))
        raise StopProgram()

    async def llm_query(prompt: str) -> str:
        limit = turn.settings.code_runtime.max_llm_queries
        if turn.state.llm_queries >= limit:
            raise RuntimeError(f"llm_query budget used up ({limit} per turn, codeRuntime.maxLlmQueries)")
        # A program can make a prompt of any length; one past the model's context is refused (or,
        # on a server with a larger one, billed in full) and is refused here first, at no cost.
        message = [{"role": "user", "content": str(prompt)}]
        if (size := estimate_tokens(message)) > (room := prompt_budget(turn.settings.context_tokens,
                                                                       turn.settings.max_tokens)):
            raise ValueError(f"llm_query: the prompt is about {size:,} tokens; the model takes {room:,} "
                             "(agents.defaults.contextTokens): ask about a part at a time")
        turn.state.llm_queries += 1
        response = await turn.ask_model(messages=message, purpose="llm_query")
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
                                      mode=turn.mode.name, extras=turn_functions(turn), inputs=turn.state.inputs or None)
    return result.to_model_text()


NO_OUTPUT = "(no output)"  # ExecutionResult.to_model_text of a quiet program


def _imports_line() -> str:
    from nanobot.sandbox.offers import prompt_line  # the sandbox package loads Monty: only when code runs

    return prompt_line()


def prompt_stubs(turn: Turn) -> str:
    tools = turn.deps.tools.tools(ctx=turn.ctx)
    listed = on_demand(tools, turn.deps.config, turn.settings.context_tokens)
    return code_stubs(turn.deps.tools, header=False, ctx=turn.ctx, listed=listed).strip()


class CodeMode:
    name = "code"
    keeps_notes = False  # see Mode: text next to a program is a working note

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
        if block is None and (program := calls_as_program(text, response)):
            text = f"```python\n{program}\n```"  # what it meant; the history shows it so, as code mode writes
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
        if turn.state.final is None or output != NO_OUTPUT:  # an empty result before the answer says nothing
            turn.add({"role": "user", "content": f"<python_result>\n{output}\n</python_result>"})
        if turn.state.final is not None:
            turn.session.append({"role": "assistant", "content": turn.state.final})
        return turn.state.final


def calls_as_program(text: str, response: LLMResponse) -> str | None:
    """Functions a model called as tools in code mode (natively, or in ``<tool_call>`` blocks, as
    local models trained on tool use do), written as the program it meant: each result printed.
    A call that cannot be written so prints why. None if it called nothing."""
    calls = [(c.name, c.raw_arguments) for c in response.tool_calls] or \
        [split_text_call(payload) for payload in text_tool_calls(text)]
    lines = []
    for name, raw in calls:
        try:
            if not name:
                raise ValueError(raw)  # the block itself could not be read
            arguments = parse_arguments(raw)
            if not name.isidentifier() or not all(key.isidentifier() for key in arguments):
                raise ValueError(f"{name}({raw}) is not a Python call")
            lines.append(f"print({name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())}))")
        except ValueError as exc:
            why = str(exc).rstrip(".")
            lines.append(f"print({f'Not run: {why}. Write a Python program instead.'!r})")
    return "\n".join(lines) or None


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
        turn.state.inputs["context"] = content
        parts.append(f"[The user's message is {len(content):,} characters long; it is in the variable `context`"
                     f"{f' (and the file {saved})' if saved else ''}. Its beginning and end:]\n"
                     f"{long_message_preview(content)}")
    else:
        earlier = _earlier_long_message(turn)
        if earlier is not None:
            turn.state.inputs["context"] = earlier
        parts.append(content)
    files = {doc.name: doc.text for doc in attachments.documents}
    if files:
        turn.state.inputs["files"] = files
        if "context" not in turn.state.inputs:
            turn.state.inputs["context"] = attachments.documents[0].text
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
        return beneath.read_bytes(turn.ctx.workspace, name).decode("utf-8")
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
