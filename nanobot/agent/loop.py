"""The agent loop: a user message in, model calls and tool runs, a reply out.

The loop itself knows nothing about how the model acts; an execution mode (``modes.py``)
decides what tools the model is offered and what to do with each response. A step returns
the reply when the turn is over, or None to ask the model again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nanobot import beneath, logs, metrics, tracing
from nanobot.agent.prompt_size import (KEPT_RESULTS, RESULTS_DIR, cut_when_shown, drop_oldest_history, estimate_tokens,
                                       is_long_result, prompt_budget)
from nanobot.agent.commands import handle_command
from nanobot.agent import context
from nanobot.agent.context import build_system_prompt
from nanobot.agent.deps import AgentDeps
from nanobot.agent.markup import FailedReply, strip_think
from nanobot.agent.spend import BudgetSpent, metered_chat
from nanobot.agent.streaming import ReplyStream
from nanobot.agent.memory import Consolidator, prompt_history
from nanobot.agent.all_modes import get_mode
from nanobot.bus import Identity, Source
from nanobot.config import AgentSettings
from nanobot.delivery.intake import RESUMED_NOTE
from nanobot.media.images import RECENT_IMAGES, image_count, sent_images, with_images
from nanobot.media.attachments import Attachments, read_attachments
from nanobot.media.vision import is_blind, rejects_images, remember_blind
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError
from nanobot.session import Session, as_sent
from nanobot.utf8 import clean_text
from nanobot.trust import HISTORY_CHANNELS, MEMBER, OWNER

if TYPE_CHECKING:
    from nanobot.agent.modes import Mode

log = logging.getLogger(__name__)

Progress = Callable[[str], Awaitable[None]]

REPEAT_LIMIT = 3  # the same call with the same arguments this often in one turn: the model is stuck
TASK_SENDER = "task:"  # a background task's own turn (sender "task:ID")
TASK_RESULT = "task-result:"  # a background task's result, delivered to its chat


class TurnEnded(Exception):
    """Ends a turn early with ``reply`` (a loop, an outgrown context); the user is told why."""

    def __init__(self, reply: str, outcome: str) -> None:
        super().__init__(reply)
        self.reply, self.outcome = reply, outcome


@dataclass(frozen=True)
class Origin:
    """Who sent a message, as the channel saw it (None for cron jobs and the heartbeat)."""

    sender: Identity
    private: bool = False
    untrusted: str | None = None  # set when the message carries outside content (a document, a forward)
    source: Source = "user"  # a person's message, a cron prompt job's, a background task's result


@dataclass(frozen=True)
class TurnRequest:
    """What a turn is asked: the chat, the message, and what came with it."""

    session_key: str
    content: str
    media: list[str] = field(default_factory=list)  # workspace-relative paths of the message's files
    mode: str | None = None  # the chat's mode unless given
    origin: Origin | None = None  # None: the heartbeat's, or the terminal's own
    durations: dict[str, float] | None = None  # seconds of recordings among ``media``, as the platform said
    resumed: bool = False  # a turn cut by a restart, whose message is in the history already


@dataclass(frozen=True)
class TurnIO:
    """Where a turn's output goes besides its reply: progress notes, and the reply as written."""

    progress: Progress | None = None
    stream: ReplyStream | None = None


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
                              provider=provider, fallbacks=[(f.provider, f.model) for f in self.settings.fallbacks],
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
                                     chat=self.session.key, gateway=self.deps.bus is not None)
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
        return session.meta.mode or self.deps.config.agent_for(session.key).execution_mode

    def task_result(self, session_key: str, text: str) -> str:
        """A background task's result, queued in its chat like a message: into the history (for
        the model, and the reader who is away), and back as the reply, with no model call."""
        session = self.session(session_key)
        if session_key.partition(":")[0] in HISTORY_CHANNELS:
            session.keep_for_reader(text)
        else:
            session.append({"role": "assistant", "content": text})
        session.sync()
        return text

    async def reset_state(self, session_key: str) -> None:
        """Forget the session's Python state too (``/new``)."""
        await self.deps.code.reset(session_key)

    async def handle(self, session_key: str, content: str, *, mode: str | None = None,
                     progress: Progress | None = None, stream: ReplyStream | None = None) -> str:
        """``answer`` for the simple case: a message typed in a chat (the terminal, the heartbeat)."""
        return await self.answer(TurnRequest(session_key, content, mode=mode), TurnIO(progress, stream))

    async def answer(self, request: TurnRequest, io: TurnIO = TurnIO()) -> str:
        """A chat message: a command's answer, or a full agent turn."""
        request = replace(request, content=clean_text(request.content))  # one bad character must not poison
        session_key, origin = request.session_key, request.origin
        logs.current_chat.set(session_key)  # log lines of this task name the chat (json logs)
        await self.deps.sessions.open(session_key)  # loaded before anything reads it
        if origin is not None and origin.source == "task":
            return self.task_result(session_key, request.content)
        if origin is not None and origin.private:
            remember_peer(self.session(session_key), origin)
        answer = await handle_command(self, session_key, request.content)
        if answer is not None:
            return answer
        with tracing.span("nanobot.turn", channel=session_key.partition(":")[0], mode=request.mode):
            return await self.run_turn(request, io)

    async def run_turn(self, request: TurnRequest, io: TurnIO) -> str:
        session_key, origin = request.session_key, request.origin
        session = await self.deps.sessions.open(session_key)
        if self.deps.mcp is not None:  # `nanobot agent`: the first turn starts them
            await self.deps.mcp.ensure_started()
        turn = Turn(self.deps, session, get_mode(request.mode or self.mode_name(session)), io.progress, io.stream)
        if origin is not None and origin.source == "cron":
            turn.ctx.origin = "cron"
        if request.media:  # documents, photos, voice: someone else's content
            turn.ctx.guard.taint("an attached file")
        if origin is not None and origin.untrusted:
            turn.ctx.guard.taint(origin.untrusted)
        started, outcome = time.monotonic(), "ok"
        recorded = session.count
        try:
            attachments = await read_attachments(self.deps.config, self.deps.provider, turn.ctx.workspace,
                                                 request.media, request.content, request.durations or {}, session)
            if attachments.reply is not None:  # a voice note nobody could hear: no model call
                return attachments.reply
            reply = await turn.run(attachments.text(request.content), attachments, resumed=request.resumed)
            outcome = turn.state.outcome
        except TurnEnded as ended:
            reply, outcome = ended.reply, ended.outcome
            session.append({"role": "assistant", "content": reply})
        except Exception as exc:  # the model failed, the budget is spent, or a bug: never a traceback
            reply, outcome = failure_reply(session_key, exc)
            settle_failed_turn(session, session.count - recorded, reply)
        except BaseException:  # /stop or shutdown: the dispatcher records and reports it
            outcome = "cancelled"
            raise
        finally:
            if outcome == "cancelled":  # no awaiting while being cancelled
                session.sync()
            else:
                await session.sync_soon()
            took = time.monotonic() - started
            log.info("turn %s mode=%s model_calls=%d ms=%d outcome=%s", session_key, turn.mode.name,
                     turn.state.model_calls, took * 1000, outcome)
            metrics.current.turn(turn.mode.name, took, outcome)
        self.memory.schedule(session, turn.mode.name)  # a background task: the reply does not wait for it
        return "\n\n".join([reply, *turn.state.notices]) if turn.state.notices else reply


TURN_CRASHED = ("Sorry, something went wrong while I was working on that (the details are in the log). "
                "Please try again.")


def failure_reply(session_key: str, exc: Exception) -> tuple[FailedReply, str]:
    """What the user is told when a turn fails, and the outcome for the turn's log line."""
    if isinstance(exc, BudgetSpent):
        return FailedReply(str(exc)), "budget"
    if isinstance(exc, ProviderError):
        return FailedReply(f"Sorry, I could not get an answer from the model: {exc}"), "model-error"
    log.error("%s: the turn failed", session_key, exc_info=exc)  # a bug: the traceback is for the log
    return FailedReply(TURN_CRASHED), "error"


def cache_key(session_key: str) -> str:
    """A chat's ``prompt_cache_key``: the same for all its requests, and no chat id in it."""
    return "nanobot-" + hashlib.sha256(session_key.encode()).hexdigest()[:24]


def settle_failed_turn(session: Session, added: int, reply: str) -> None:
    """A turn that failed before anything happened takes its message back, so the next turn
    does not answer it again; one that did some work keeps it, followed by what went wrong."""
    if added <= 1:
        session.drop_last(added)
    else:
        session.append({"role": "assistant", "content": f"({reply})"})


def remember_peer(session: Session, origin: Origin) -> None:
    """Record who a private chat is with (trust is decided from it); only when it changes."""
    if (session.meta.peer_id, session.meta.peer_handle) != (origin.sender.id, origin.sender.handle):
        session.set_meta(peer_id=origin.sender.id, peer_handle=origin.sender.handle)
