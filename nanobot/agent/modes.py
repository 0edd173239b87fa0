"""Execution modes: how the model acts on the world within a turn.

- tools:  native function calling (or ``<tool_call>`` blocks in text for models without it);
- code:   the model writes Python, run in the Monty sandbox with the tools as functions;
- hybrid: native tools plus ``exec_python(code)``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from nanobot import beneath
from nanobot.prompts import render_prompt
from nanobot.agent.markup import answer_or_failure, for_the_user, strip_think, text_tool_calls as text_calls_in
from nanobot.agent.tool_offer import FIND_TOOLS, USE_TOOL, find_tools, native_schemas, use_tool_call
from nanobot.providers.base import LLMResponse, parse_arguments
from nanobot.workspace_quota import check_room

if TYPE_CHECKING:
    from nanobot.agent.turn import Turn
    from nanobot.media.attachments import Attachments

log = logging.getLogger(__name__)


def attachments_note(attachments: Attachments) -> str:
    """Photos and files by path, and why a file was not handed over (a scan, a failed transcription)."""
    return "\n".join([*attachments.image_notes(), *attachments.notes])


def documents_note(attachments: Attachments) -> str:
    """Tools mode: each document's text is in a file the tools can read, plus a preview."""
    parts = []
    for doc in attachments.documents:
        where = doc.text_path or doc.path
        cut = " (cut at the size limit)" if doc.truncated else ""
        parts.append(f"[document {doc.path}: {len(doc.text):,} characters of text{cut}; read it with "
                     f"read_file({where!r}). It begins:]\n{doc.preview()}")
    return "\n".join(parts)


PREVIEW_CHARS = 500


def keep_long_message(turn: Turn, content: str) -> str | None:
    """A message over ``largeInputChars`` is saved whole as a file in the chat's folder (the
    history then carries a preview), and the session remembers it for later turns: its path; ""
    when it could not be (the workspace is full: a member's pastes count, as their files do);
    None for a message of ordinary length."""
    if len(content) <= turn.settings.code_runtime.large_input_chars:
        return None
    name, data = f"messages/{time.strftime('%Y%m%d-%H%M%S')}-{len(content)}.txt", content.encode("utf-8", "replace")
    try:
        check_room(turn.deps.config.workspace_path, turn.deps.config.tools.max_workspace_mb, len(data))
        beneath.write_bytes(turn.ctx.workspace, name, data)
    except OSError as exc:
        log.warning("%s: a long message was not kept (%s); the model sees its beginning and end", turn.session.key, exc)
        return ""
    turn.session.set_meta(long_message=name)
    return name


def long_message_preview(content: str) -> str:
    """The beginning and the end: the question is usually at the end of a paste."""
    if len(content) <= 2 * PREVIEW_CHARS:
        return content
    hidden = len(content) - 2 * PREVIEW_CHARS
    return f"{content[:PREVIEW_CHARS]}\n[… {hidden:,} characters not shown …]\n{content[-PREVIEW_CHARS:]}"


async def run_tool_call(turn: Turn, name: str, raw_arguments: str) -> str:
    """Run one tool call for the model; every failure becomes an error text it can act on."""
    if name == FIND_TOOLS:
        return find_tools(turn, raw_arguments)
    if name == USE_TOOL:
        call = use_tool_call(raw_arguments)
        if isinstance(call, str):
            return call
        name, raw_arguments = call
    try:
        arguments = parse_arguments(raw_arguments)
    except ValueError as exc:
        return f"Error: the call to {name} was not run: {exc}. Send the arguments as a JSON object."
    tool = turn.deps.tools.get(name)
    log.info("[%s] %s(%s)", turn.session.key, name, raw_arguments[:80])
    result = await turn.deps.tools.call_for_model(name, arguments, turn.ctx)
    if tool is not None and tool.untrusted and not result.startswith("Error:"):
        from nanobot.tools.web import wrap_untrusted

        result = wrap_untrusted(result, tool.origin(arguments))
    return result


TEXT_CALLS_NOTE = ('\nIf your model cannot call tools natively, write one call per block as:\n'
                   '<tool_call>{"name": "read_file", "arguments": {"path": "notes.txt"}}</tool_call>')


def text_tool_calls(turn: Turn) -> bool:
    """Whether the chat's model needs to be told the ``<tool_call>`` text form
    (``providers.<name>.textToolCalls``: models served without native tool calling)."""
    provider, _ = turn.chat_model()
    settings = turn.deps.config.providers.get(provider)
    return bool(settings and settings.text_tool_calls)


class ToolsMode:
    name = "tools"
    keeps_notes = True

    def prompt_section(self, turn: Turn) -> str:
        return render_prompt("tools_mode.md", text_calls=TEXT_CALLS_NOTE if text_tool_calls(turn) else "")

    def native_tools(self, turn: Turn) -> list[dict[str, Any]] | None:
        return native_schemas(turn)

    def user_content(self, turn: Turn, content: str, attachments: Attachments) -> str:
        saved = keep_long_message(turn, content)
        if saved is not None:  # tools can work on the file without the model copying it back out
            where = f"the whole text is in the file {saved}" if saved else "it could not be kept whole as a file"
            content = (f"[The user's message is {len(content):,} characters long; {where}. Its beginning and "
                       f"end:]\n{long_message_preview(content)}")
        return "\n".join(filter(None, [content, documents_note(attachments), attachments_note(attachments)]))

    async def step(self, turn: Turn, response: LLMResponse) -> str | None:
        content = response.content or ""
        if response.tool_calls:
            await self._native_calls(turn, content, response)
        elif payloads := text_calls_in(content):
            await self._text_calls(turn, content, payloads)
        else:
            reply = for_the_user(strip_think(content))  # a ```python show fence, as in code mode
            turn.add({"role": "assistant", "content": reply})
            return answer_or_failure(reply)
        return turn.state.final

    async def run_call(self, turn: Turn, name: str, raw_arguments: str) -> str:
        return await run_tool_call(turn, name, raw_arguments)

    async def _native_calls(self, turn: Turn, content: str, response: LLMResponse) -> None:
        turn.add({"role": "assistant", "content": strip_think(content) or None,
                  "tool_calls": [c.to_message() for c in response.tool_calls], **response.carried})
        for call in response.tool_calls:
            turn.check_repeat(call.name, call.raw_arguments)
            result = await self.run_call(turn, call.name, call.raw_arguments)
            turn.add({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result})

    async def _text_calls(self, turn: Turn, content: str, payloads: list[str]) -> None:
        """``<tool_call>`` blocks: results go back as a user message, as such models expect."""
        turn.add({"role": "assistant", "content": strip_think(content)})
        results = []
        for payload in payloads:
            name, raw = split_text_call(payload)
            turn.check_repeat(name, raw)
            result = await self.run_call(turn, name, raw) if name else f"Error: {raw}"
            results.append(f'<tool_result name="{name or "?"}">\n{result}\n</tool_result>')
        turn.add({"role": "user", "content": "\n".join(results)})


def split_text_call(payload: str) -> tuple[str, str]:
    """``{"name": .., "arguments": {..}}`` -> (name, raw arguments); ("", problem) if unreadable."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        return "", f"the <tool_call> block is not valid JSON ({exc.msg}); nothing was run."
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return "", 'a <tool_call> block must be {"name": ..., "arguments": {...}}; nothing was run.'
    arguments = data.get("arguments", {})
    return data["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)
