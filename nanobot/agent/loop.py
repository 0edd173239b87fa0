"""The agent loop: a user message in, model calls and tool runs, a reply out.

The loop itself knows nothing about how the model acts; an execution mode (``modes.py``)
decides what tools the model is offered and what to do with each response. A step returns
the reply when the turn is over, or None to ask the model again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot.agent.context import build_system_prompt
from nanobot.agent.memory import Consolidator, prompt_history
from nanobot.config import AgentSettings, Config
from nanobot.providers.base import ChatRequest, LLMResponse, Provider, ProviderError
from nanobot.session import Session, SessionStore
from nanobot.tools.registry import ToolContext, ToolRegistry

if TYPE_CHECKING:
    from nanobot.agent.modes import Mode
    from nanobot.bus import MessageBus
    from nanobot.usage import UsageStore

log = logging.getLogger(__name__)

Progress = Callable[[str], Awaitable[None]]


@dataclass
class AgentDeps:
    """Everything an agent needs, built once by the CLI or the gateway."""

    config: Config
    provider: Provider
    tools: ToolRegistry
    sessions: SessionStore
    usage: UsageStore | None = None
    bus: MessageBus | None = None
    # Optional parts that later layers plug in by name: "code" (the code executor), "skills", ...
    services: dict[str, Any] = field(default_factory=dict)
    system_extras: list[Callable[[], str]] = field(default_factory=list)  # more prompt sections


class Turn:
    """One user message's trip through the model and tools."""

    def __init__(self, deps: AgentDeps, session: Session, mode: Mode, progress: Progress | None) -> None:
        self.deps = deps
        self.session = session
        self.mode = mode
        self.settings: AgentSettings = deps.config.agent_for(session.key)
        self.progress = progress
        self.ctx = ToolContext(config=deps.config, workspace=deps.config.workspace_path, session_key=session.key,
                               bus=deps.bus, services=deps.services)
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
        system = build_system_prompt(self.ctx.workspace, self.settings.timezone, self.mode.prompt_section(self),
                                     "\n\n".join(extra() for extra in self.deps.system_extras))
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
        code = self.deps.services.get("code")
        if code is not None:
            await code.reset(session_key)

    async def handle(self, session_key: str, content: str, *, media: list[str] | None = None,
                     progress: Progress | None = None, mode: str | None = None) -> str:
        """A chat message: a command's answer, or a full agent turn."""
        from nanobot.agent.commands import handle_command

        answer = await handle_command(self, session_key, content)
        if answer is not None:
            return answer
        return await self.run_turn(session_key, content, media=media, progress=progress, mode=mode)

    async def run_turn(self, session_key: str, content: str, *, media: list[str] | None = None,
                       progress: Progress | None = None, mode: str | None = None) -> str:
        from nanobot.agent.modes import get_mode

        session = self.session(session_key)
        turn = Turn(self.deps, session, get_mode(mode or self.mode_name(session)), progress)
        try:
            reply = await turn.run(content, media or [])
        except ProviderError as exc:
            log.warning("%s: %s", session_key, exc)
            return f"Sorry, I could not get an answer from the model: {exc}"
        finally:
            session.sync()
        self.memory.schedule(session, turn.mode.name)  # a background task: the reply does not wait for it
        return reply
