"""A turn: one message's trip through the model and tools, and what its execution mode is
given (``Mode``). The loop (``loop.py``) makes turns; the modes (``modes.py``,
``code_mode.py``) act in them; both import this module, and it imports neither.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from nanobot import beneath
from nanobot.agent.prompt_size import (KEPT_RESULTS, RESULTS_DIR, cut_when_shown, drop_oldest_history, estimate_tokens,
                                       is_long_result, prompt_budget)
from nanobot.agent import context
from nanobot.agent.context import build_system_prompt
from nanobot.agent.deps import AgentDeps
from nanobot.agent.markup import strip_think
from nanobot.agent.spend import metered_chat
from nanobot.agent.streaming import ReplyStream
from nanobot.agent.memory import prompt_history
from nanobot.config import AgentSettings
from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.media.images import RECENT_IMAGES, image_count, sent_images, with_images
from nanobot.media.vision import is_blind, rejects_images, remember_blind
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError
from nanobot.session import Session, as_sent
from nanobot.trust import MEMBER, OWNER

if TYPE_CHECKING:
    from nanobot.media.attachments import Attachments

log = logging.getLogger("nanobot.agent.loop")  # the turn's log lines keep the logger they always had

Progress = Callable[[str], Awaitable[None]]

REPEAT_LIMIT = 3  # the same call with the same arguments this often in one turn: the model is stuck


class Mode(Protocol):
    name: str
    # Whether text written before a program or call is for the user. Code mode's is a working
    # note: only <say> notes and the final answer reach the user, so a stream takes such text
    # back or holds it (agent/streaming.py).
    keeps_notes: bool

    def prompt_section(self, turn: Turn) -> str: ...

    def native_tools(self, turn: Turn) -> list[dict[str, Any]] | None: ...

    def user_content(self, turn: Turn, content: str, attachments: Attachments) -> str: ...

    async def step(self, turn: Turn, response: LLMResponse) -> str | None: ...


class TurnEnded(Exception):
    """Ends a turn early with ``reply`` (a loop, an outgrown context); the user is told why."""

    def __init__(self, reply: str, outcome: str) -> None:
        super().__init__(reply)
        self.reply, self.outcome = reply, outcome



def cache_key(session_key: str) -> str:
    """A chat's ``prompt_cache_key``: the same for all its requests, and no chat id in it."""
    return "nanobot-" + hashlib.sha256(session_key.encode()).hexdigest()[:24]


@dataclass
class TurnState:
    """What changes as a turn runs (the modes write here); the rest of a Turn is its fixed setup."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # the prompt being built
    history_len: int = 0  # messages[1:1+history_len] are earlier turns, trimmed first when too long
    inputs: dict[str, Any] = field(default_factory=dict)  # variables handed to code-mode programs (large inputs)
    final: str | None = None  # set by final_answer() to end the turn without another model call
    llm_queries: int = 0  # llm_query() calls from programs in this turn, against their budget
    model_calls: int = 0
    outcome: str = "ok"  # for the turn's log line: "cut" when the reply hit maxTokens
    notices: list[str] = field(default_factory=list)  # said after the reply (e.g. that the model cannot see images)
    repeats: Counter[tuple[str, str]] = field(default_factory=Counter)


class Turn:
    """One user message's trip through the model and tools."""

    def __init__(self, deps: AgentDeps, session: Session, mode: Mode, progress: Progress | None,
                 stream: ReplyStream | None = None) -> None:
        self.deps = deps
        self.stream = stream  # the reply shown as it is written (channels that stream)
        self.session = session
        self.mode = mode
        self.settings: AgentSettings = deps.config.agent_for(session.key)
        self.progress = progress
        self.ctx = deps.chat_context(session.key)
        self.ctx.runs_code = mode.name != "tools"
        self.state = TurnState()

    def check_repeat(self, name: str, arguments: str) -> None:
        """Stop a model that keeps making the same call (a weak model can loop for many minutes)."""
        self.state.repeats[name, arguments] += 1
        if self.state.repeats[name, arguments] >= REPEAT_LIMIT:
            what = "the same program" if name == "python" else f"{name} with the same arguments"
            raise TurnEnded(f"I stopped: I was repeating {what} ({REPEAT_LIMIT} times) without getting anywhere. "
                            "Tell me more about what you need, or try another way.", "loop")

    def add(self, message: dict[str, Any]) -> None:
        """Append to both the prompt being built and the session's history (a long result cut
        once, here: ``prompt_size.cut_when_shown``)."""
        if is_long_result(message):
            message = cut_when_shown(message, self.keep_result(message["content"]))
        self.state.messages.append(as_sent(message))
        self.session.append(message)

    def keep_result(self, content: str) -> str | None:
        """A long result kept whole in the chat's folder; its path (None when it could not be)."""
        now = time.time_ns()  # names sort by when: the oldest are pruned first
        path = f"{RESULTS_DIR}/{time.strftime('%Y%m%d-%H%M%S', time.localtime(now // 10**9))}-{now % 10**9:09d}.txt"
        try:
            beneath.write_bytes(self.ctx.workspace, path, content.encode("utf-8", errors="replace"))
            with beneath.parent_of(self.ctx.workspace, path) as (folder, _):
                for old in sorted(n for n in os.listdir(folder) if n.endswith(".txt"))[:-KEPT_RESULTS]:
                    os.unlink(old, dir_fd=folder)  # the oldest go: a chat's folder must not fill the disk
        except (OSError, ValueError) as exc:
            log.warning("a long result was not kept (%s); the model sees its head and tail", exc)
            return None
        return path

    async def say(self, text: str) -> None:
        if self.progress and text:
            await self.progress(text)

    @property
    def member(self) -> bool:
        return self.ctx.trust == MEMBER

    def chat_model(self) -> tuple[str, str]:
        """(provider, model) of this chat: its /model choice where its trust allows it."""
        return self.deps.config.chat_model(self.session.key, self.session.meta.model, member=self.member)

    async def ask_model(self, *, tools: list[dict[str, Any]] | None = None,
                        messages: list[dict[str, Any]] | None = None, purpose: str = "turn") -> LLMResponse:
        # Side questions (llm_query) are not shown. Code mode's text may be a working note
        # (Mode.keeps_notes is False): the stream takes it back or holds it (agent/streaming.py).
        stream = self.stream if purpose == "turn" else None
        if stream is None:
            return await self._ask(tools, messages, purpose, None)
        stream.begin(notes=self.mode.keeps_notes)
        response = await self._ask(tools, messages, purpose, stream.feed)
        await stream.end()
        return response

    async def _ask(self, tools: list[dict[str, Any]] | None, messages: list[dict[str, Any]] | None, purpose: str,
                   on_text: Callable[[str], Awaitable[None]] | None) -> LLMResponse:
        provider, model = self.chat_model()
        prompt = messages or self.state.messages
        request = ChatRequest(messages=await with_images(prompt, self.ctx.workspace, self.images_shown(provider, model)),
                              model=model, tools=tools or None,
                              max_tokens=self.settings.max_tokens, temperature=self.settings.temperature,
                              provider=provider, fallbacks=self.settings.fallback_models(),
                              on_text=on_text, cache_key=cache_key(self.session.key))
        call = partial(metered_chat, self.deps, session_key=self.session.key, mode=self.mode.name, purpose=purpose,
                       member=self.member)
        self.state.model_calls += 1
        try:
            return await call(request)
        except ProviderError as exc:
            if not (self.settings.vision == "auto" and sent_images(request.messages) and rejects_images(exc)):
                raise
        # The server refused the pictures: this model is blind. Say so once, and carry on with paths.
        remember_blind(self.deps.config.home, provider, model)
        log.warning("%s/%s rejected image input; sending file paths instead from now on", provider, model)
        self.state.notices.append(f"(The model {model} does not accept images, so it saw only the photo's file name. "
                            "I will not send it pictures again; pick a vision model with /model, or set "
                            'agents.defaults.vision to "off".)')
        self.state.model_calls += 1
        return await call(replace(request, messages=await with_images(prompt, self.ctx.workspace, 0)))

    def images_shown(self, provider: str, model: str) -> int:
        """How many of the prompt's latest images go as pictures (``agents.defaults.vision``)."""
        vision = self.settings.vision
        if vision == "off" or (vision == "auto" and image_count(self.state.messages) and is_blind(self.deps.config.home, provider, model)):
            return 0
        return RECENT_IMAGES

    def fit_prompt(self) -> None:
        """Keep the prompt within the model's context: drop the oldest history, or end the turn."""
        budget = prompt_budget(self.settings.context_tokens, self.settings.max_tokens)
        self.state.history_len = drop_oldest_history(self.state.messages, self.state.history_len, budget)
        if estimate_tokens(self.state.messages) > budget:
            raise TurnEnded("I stopped: this task's messages and results outgrew the model's context "
                            f"(agents.defaults.contextTokens = {self.settings.context_tokens}). Ask for a smaller "
                            "step, or have me work on files in parts.", "context")

    def cut_reply(self, response: LLMResponse) -> str:
        """A reply the server cut at maxTokens: shown as what it is; nothing in it is run."""
        text = strip_think(response.content).strip()
        note = (f"(My reply was cut off at the output limit, agents.defaults.maxTokens = {self.settings.max_tokens}; "
                "nothing in it was run. Ask me to continue, or to be shorter.)")
        reply = f"{text}\n\n{note}" if text else note
        self.state.outcome = "cut"
        self.session.append({"role": "assistant", "content": reply})
        return reply

    async def run(self, content: str, attachments: Attachments, *, resumed: bool = False) -> str:
        system = build_system_prompt(self.deps.config.workspace_path, self.mode.prompt_section(self),
                                     "\n\n".join(extra(self.ctx) for extra in self.deps.system_extras),
                                     chat_root=self.ctx.workspace, owner=self.ctx.trust == OWNER,
                                     chat=self.session.key, gateway=not self.deps.terminal)
        history = prompt_history(self.session, self.settings.memory_window)  # the part not yet in memory/
        self.state.messages = [{"role": "system", "content": system}, *history]
        self.state.history_len = len(history)
        user: dict[str, Any] = {"role": "user", "content": self.mode.user_content(self, content, attachments),
                                "sent": context.sent_at(self.settings.timezone)}
        if attachments.images:  # the paths only: the pictures are read again for each request
            user["images"] = attachments.images
        if resumed:  # the message, and what the cut turn did, are in the history above: said once
            user = {"role": "user", "content": RESUMED_NOTE}
        self.add(user)
        for _ in range(self.settings.max_iterations):
            self.fit_prompt()
            response = await self.ask_model(tools=self.mode.native_tools(self))
            if response.finish_reason == "length":
                return self.cut_reply(response)
            reply = await self.mode.step(self, response)
            if reply is not None:
                return reply
        note = (f"I stopped after {self.settings.max_iterations} steps without finishing "
                "(agents.defaults.maxIterations). Tell me to continue if you want me to go on.")
        self.session.append({"role": "assistant", "content": note})
        return note


