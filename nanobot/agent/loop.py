"""The agent loop: a user message in, model calls and tool runs, a reply out.

The loop itself knows nothing about how the model acts; an execution mode (``modes.py``)
decides what tools the model is offered and what to do with each response. A step returns
the reply when the turn is over, or None to ask the model again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial

from nanobot import logs, metrics, tracing
from nanobot.agent.commands import handle_command, start_over
from nanobot.agent.deps import AgentDeps
from nanobot.agent.markup import FailedReply
from nanobot.agent.spend import BudgetSpent, metered_chat, metered_transcription
from nanobot.agent.streaming import ReplyStream
from nanobot.agent.memory import Consolidator
from nanobot.agent.all_modes import get_mode
from nanobot.agent.turn import Progress, Turn, TurnEnded
from nanobot.bus import Identity, Source, split_target
from nanobot.media.attachments import read_attachments
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError
from nanobot.session import Session
from nanobot.utf8 import clean_text
from nanobot.trust import HISTORY_CHANNELS, OWNER, is_owner

log = logging.getLogger(__name__)

TASK_SENDER = "task:"  # a background task's own turn (sender "task:ID")
TASK_RESULT = "task-result:"  # a background task's result, delivered to its chat


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

    async def task_result(self, session_key: str, text: str) -> str:
        """A background task's result (or a code job's output for a terminal or API chat), queued
        in its chat like a message: into the history (for the model, and the reader who is away),
        and back as the reply, with no model call; none for a chat nobody is messaged in (the
        terminal's, the API's: its reader finds it there, and its channel may not even run).
        The record is in before the reply settles the message, as a turn's are."""
        session = self.session(session_key)
        kept = session_key.partition(":")[0] in HISTORY_CHANNELS
        if kept:
            session.keep_for_reader(text)
        else:
            session.append({"role": "assistant", "content": text})
        await session.sync_soon()
        return "" if kept else text

    async def reader_saw(self, session_key: str, upto: str) -> str:
        """The terminal showed its reader what waited for them, up to position ``upto``: seen from
        now. Marked here, by the worker running the chat (among workers, a mark written by the
        terminal's own worker would go behind the holder's back, and the fence refuses it)."""
        session = self.session(session_key)
        session.mark_seen(int(upto) if upto.isdigit() else -1)
        await session.sync_soon()
        return ""

    async def meet(self, session_key: str, origin: Origin) -> None:
        """Record who a chat is with: a private peer, or a group (trust is decided from it). A
        chat that changes hands (a Matrix room of two grown into a group, or back, or another
        person in it) starts over: what the old party said, its Python state and its jobs are
        not the new party's to read or run (jobs are paused for the owner to resume, tasks stopped)."""
        session = self.session(session_key)
        meta, peer = session.meta, origin.sender if origin.private else None
        was = ("peer", meta.peer_id) if meta.peer_id is not None else ("group",) if meta.group else None
        now = ("peer", peer.id) if peer else ("group",)
        if was is not None and was != now:
            await self._change_hands(session_key, f"{' '.join(now)}, was {' '.join(was)}")
        party = {"peer_id": peer.id if peer else None, "peer_handle": peer.handle if peer else None, "group": not peer}
        if changed := {name: value for name, value in party.items() if getattr(meta, name) != value}:
            session.set_meta(**changed)
        channel, chat_id = split_target(session_key)
        if peer is not None and is_owner(self.deps.config, channel, peer):  # where notices reach an owner
            await self.deps.pairing.heard_owner(channel, chat_id, peer)

    async def _change_hands(self, session_key: str, how: str) -> None:
        """What the old party began does not go on for the new one: jobs paused, tasks stopped."""
        paused = [job.id for job in await self.deps.cron.list(session_key) if job.enabled]
        for job_id in paused:
            await self.deps.cron.set_enabled(job_id, False)
        stopped = await self.deps.tasks.request_stop_all(session_key)
        await self.deps.pairing.forget_owner_chat(*split_target(session_key))
        await start_over(self, session_key, "the chat changed hands")
        log.warning("%s changed hands (%s): a new conversation; jobs paused: %s; tasks stopped: %s", session_key,
                    how, ", ".join(paused) or "none", ", ".join(stopped) or "none")

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
            return await self.task_result(session_key, request.content)
        if origin is not None and origin.source == "seen":
            return await self.reader_saw(session_key, request.content)
        if origin is not None and origin.source == "user" and session_key.partition(":")[0] not in HISTORY_CHANNELS:
            await self.meet(session_key, origin)  # (a terminal or API chat's trust is not its party's)
        answer = await handle_command(self, session_key, request.content)
        if answer is not None:
            return answer
        with tracing.span("nanobot.turn", channel=session_key.partition(":")[0], mode=request.mode):
            reply = await self.run_turn(request, io)
        if origin is not None and origin.source == "cron" and session_key.partition(":")[0] in HISTORY_CHANNELS:
            await self.reply_waits(session_key, reply)
        return reply

    async def errand(self, session_key: str, messages: list[dict[str, str]], *, member: bool) -> LLMResponse:
        """A front end's own request in a chat's name (a title for its list of chats, tags): its
        ``messages`` alone to the chat's configured model (as a memory fold's: a /model choice is
        for its turns, and is in its history), with no prompt, tools or history of ours, within
        the budgets (a ``member``'s: its key says) and counted in the chat's usage; nothing is
        kept, nor the chat opened. ProviderError when it fails."""
        settings = self.deps.config.agent_for(session_key)
        sent = [{"role": m["role"], "content": clean_text(m["content"])} for m in messages]
        request = ChatRequest(messages=sent, model=settings.model,
                              max_tokens=settings.max_tokens, provider=settings.provider,
                              fallbacks=settings.fallback_models())
        return await metered_chat(self.deps, request, session_key=session_key, mode=settings.execution_mode,
                                  purpose="errand", member=member)

    async def reply_waits(self, session_key: str, reply: str) -> None:
        """A job's turn in a chat nobody is messaged in (the terminal's, the API's): its reply,
        the turn's last record, waits for the reader there, as a code job's output does; a
        failure that took the job's message back (nothing in the history says so) is kept."""
        if not reply.strip():
            return
        session = self.session(session_key)
        last = session.message(session.count - 1) or {}
        if last.get("content") in (reply, f"({reply})"):  # (a failure after some work: settle_failed_turn)
            session.wait_for_reader(session.count - 1)
        elif isinstance(reply, FailedReply):
            session.keep_for_reader(reply)
        await session.sync_soon()

    async def run_turn(self, request: TurnRequest, io: TurnIO) -> str:
        session_key, origin = request.session_key, request.origin
        session = await self.deps.sessions.open(session_key)
        if self.deps.mcp is not None:  # the first turn starts them (`nanobot agent`), or waits for that start
            await self.deps.mcp.ensure_started(io.progress)
        turn = Turn(self.deps, session, get_mode(request.mode or self.mode_name(session)), io.progress, io.stream)
        if origin is not None and origin.source == "cron":
            turn.ctx.origin = "cron"
        if request.media:  # documents, photos, voice: someone else's content
            turn.ctx.guard.taint("an attached file")
        if origin is not None and origin.untrusted:
            turn.ctx.guard.taint(origin.untrusted)
        started, outcome = time.monotonic(), "ok"
        recorded, owner = session.count, turn.ctx.trust == OWNER  # (why something failed is the owner's)
        try:
            hear = partial(metered_transcription, self.deps, session_key)
            attachments = await read_attachments(self.deps.config, hear, turn.ctx.workspace,
                                                 request.media, request.content, request.durations or {}, session,
                                                 owner=owner)
            if attachments.reply is not None:  # a voice note nobody could hear: no model call, and
                return FailedReply(attachments.reply)  # words to read (how to set it up), never spoken
            reply = await turn.run(attachments.text(request.content), attachments, resumed=request.resumed)
            outcome = turn.state.outcome
        except TurnEnded as ended:
            reply, outcome = ended.reply, ended.outcome
            session.append({"role": "assistant", "content": reply})
        except Exception as exc:  # the model failed, the budget is spent, or a bug: never a traceback
            reply, outcome = failure_reply(session_key, exc, owner=owner)
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
        if turn.state.notices:  # (a failure stays one: type(reply))
            return type(reply)("\n\n".join([reply, *turn.state.notices]))
        return reply


TURN_CRASHED = FailedReply("Sorry, something went wrong while I was working on that (the details are in the log). "
                           "Please try again.")


MODEL_DOWN_FOR_MEMBERS = FailedReply("Sorry, I could not get an answer from the model just now. Please try again "
                                     "in a while.")


def failure_reply(session_key: str, exc: Exception, *, owner: bool) -> tuple[FailedReply, str]:
    """What the user is told when a turn fails, and the outcome for the turn's log line. Why the
    model failed is the owner's: the server's words may hold an address of the owner's network
    or the ends of a key (the owner finds them in the log and ``status``)."""
    if isinstance(exc, BudgetSpent):
        return FailedReply(str(exc)), "budget"
    if isinstance(exc, ProviderError):
        log.info("%s: no answer from the model: %s", session_key, exc)  # (the daemon's log: INFO and up)
        return FailedReply(f"Sorry, I could not get an answer from the model: {exc}") if owner \
            else MODEL_DOWN_FOR_MEMBERS, "model-error"
    log.error("%s: the turn failed", session_key, exc_info=exc)  # a bug: the traceback is for the log
    return TURN_CRASHED, "error"


def settle_failed_turn(session: Session, added: int, reply: str) -> None:
    """A turn that failed before anything happened keeps its message and the failure for its
    reader (a page reloaded shows both) but out of later prompts, so the next turn does not
    answer it again; one that did some work keeps it, followed by what went wrong."""
    if added == 1:
        session.mark_failed()
        session.append({"role": "assistant", "content": reply, "failed": True})
    elif added > 1:
        session.append({"role": "assistant", "content": f"({reply})"})
