"""The agent loop: a user message in, model calls and tool runs, a reply out.

The loop itself knows nothing about how the model acts; an execution mode (``modes.py``)
decides what tools the model is offered and what to do with each response. A step returns
the reply when the turn is over, or None to ask the model again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot.agent.commands import handle_command
from nanobot.agent.context import build_system_prompt
from nanobot.agent.deps import AgentDeps
from nanobot.agent.memory import Consolidator, prompt_history
from nanobot.agent.modes import get_mode
from nanobot.config import AgentSettings
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError
from nanobot.session import Session
from nanobot.trust import OWNER

if TYPE_CHECKING:
    from nanobot.agent.modes import Mode

log = logging.getLogger(__name__)

Progress = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Origin:
    """Who sent a message, as the channel saw it (None for cron jobs and the heartbeat)."""

    sender_id: str
    sender_name: str | None = None
    private: bool = False
    untrusted: str | None = None  # set when the message carries outside content (a document, a forward)


class Turn:
    """One user message's trip through the model and tools."""

    def __init__(self, deps: AgentDeps, session: Session, mode: Mode, progress: Progress | None) -> None:
        self.deps = deps
        self.session = session
        self.mode = mode
        self.settings: AgentSettings = deps.config.agent_for(session.key)
        self.progress = progress
        self.ctx = deps.chat_context(session.key)
        self.messages: list[dict[str, Any]] = []
        self.inputs: dict[str, Any] = {}  # variables handed to code-mode programs (large inputs)
        self.final: str | None = None  # set by final_answer() to end the turn without another model call
        self.llm_queries = 0  # llm_query() calls from programs in this turn, against their budget

    def add(self, message: dict[str, Any]) -> None:
        """Append to both the prompt being built and the session's history."""
        self.messages.append(message)
        self.session.append(message)

    async def say(self, text: str) -> None:
        if self.progress and text:
            await self.progress(text)

    async def ask_model(self, *, tools: list[dict[str, Any]] | None = None,
                        messages: list[dict[str, Any]] | None = None, purpose: str = "turn") -> LLMResponse:
        request = ChatRequest(messages=messages or self.messages, model=self.settings.model, tools=tools or None,
                              max_tokens=self.settings.max_tokens, temperature=self.settings.temperature)
        response = await self.deps.provider.chat(request)
        if self.deps.usage:
            await self.deps.usage.record_call(self.session.key, self.mode.name, response.model or self.settings.model,
                                              response.usage.prompt_tokens, response.usage.completion_tokens, purpose)
        return response

    async def run(self, content: str, media: list[str]) -> str:
        system = build_system_prompt(self.deps.config.workspace_path, self.settings.timezone,
                                     self.mode.prompt_section(self),
                                     "\n\n".join(extra(self.ctx) for extra in self.deps.system_extras),
                                     chat_root=self.ctx.workspace, owner=self.ctx.trust == OWNER)
        history = prompt_history(self.session, self.settings.memory_window)  # the part not yet in memory/
        self.messages = [{"role": "system", "content": system}, *history]
        self.add({"role": "user", "content": self.mode.user_content(self, content, media)})
        for _ in range(self.settings.max_iterations):
            reply = await self.mode.step(self, await self.ask_model(tools=self.mode.native_tools(self)))
            if reply is not None:
                return reply
        note = (f"I stopped after {self.settings.max_iterations} steps without finishing "
                "(agents.defaults.maxIterations). Tell me to continue if you want me to go on.")
        self.session.append({"role": "assistant", "content": note})
        return note


class Agent:
    def __init__(self, deps: AgentDeps) -> None:
        self.deps = deps
        self.memory = Consolidator(deps)  # folds old history into memory/, in the background

    async def close(self) -> None:
        """Let background memory consolidation finish (bounded)."""
        await self.memory.close()

    def session(self, key: str) -> Session:
        return self.deps.sessions.get(key)

    def mode_name(self, session: Session) -> str:
        """The chat's /mode setting beats agents.overrides[key], which beats agents.defaults."""
        return session.meta.get("mode") or self.deps.config.agent_for(session.key).execution_mode

    async def reset_state(self, session_key: str) -> None:
        """Forget the session's Python state too (``/new``)."""
        if self.deps.services.code is not None:
            await self.deps.services.code.reset(session_key)

    async def handle(self, session_key: str, content: str, *, media: list[str] | None = None,
                     progress: Progress | None = None, mode: str | None = None, origin: Origin | None = None) -> str:
        """A chat message: a command's answer, or a full agent turn."""
        if origin is not None and origin.private:
            remember_peer(self.session(session_key), origin)
        answer = await handle_command(self, session_key, content)
        if answer is not None:
            return answer
        return await self.run_turn(session_key, content, media=media, progress=progress, mode=mode, origin=origin)

    async def run_turn(self, session_key: str, content: str, *, media: list[str] | None = None,
                       progress: Progress | None = None, mode: str | None = None, origin: Origin | None = None) -> str:
        session = self.session(session_key)
        turn = Turn(self.deps, session, get_mode(mode or self.mode_name(session)), progress)
        if media:  # documents, photos, voice: someone else's content
            turn.ctx.turn.taint("an attached file")
        if origin is not None and origin.untrusted:
            turn.ctx.turn.taint(origin.untrusted)
        try:
            reply = await turn.run(content, media or [])
        except ProviderError as exc:
            log.warning("%s: %s", session_key, exc)
            return f"Sorry, I could not get an answer from the model: {exc}"
        finally:
            session.sync()
        self.memory.schedule(session, turn.mode.name)  # a background task: the reply does not wait for it
        return reply


def remember_peer(session: Session, origin: Origin) -> None:
    """Record who a private chat is with (trust is decided from it); only when it changes."""
    peer = [origin.sender_id, origin.sender_name]
    if session.meta.get("peer") != peer:
        session.set_meta(peer=peer)
