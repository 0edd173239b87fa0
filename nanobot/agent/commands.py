"""Chat commands, the same on every channel: /new /stop /mode /model /voice /status /budget /help.

``/stop`` needs to cancel a running turn, so the session worker handles it; the rest are here.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Protocol

from nanobot.chat_commands import Offer, choices, help_for
from nanobot.agent.context import cache_starts_over
from nanobot.trust import MEMBER, OWNER
from nanobot.usage import plural, start_of_today

if TYPE_CHECKING:
    from nanobot.agent.deps import AgentDeps
    from nanobot.session import Session


class Agent(Protocol):
    """What the commands use of the agent (``loop.Agent``, which calls them)."""

    deps: AgentDeps

    def session(self, key: str) -> Session: ...

    def mode_name(self, session: Session) -> str: ...

    async def reset_state(self, session_key: str) -> None: ...

MODES = ("tools", "code", "hybrid")


_COMMAND = re.compile(r"^/[A-Za-z][A-Za-z0-9_]*(@\w+)?(\s|$)")  # not "/etc/hosts is odd"


def is_command(text: str) -> bool:
    return bool(_COMMAND.match(text))


async def start_over(agent: Agent, session_key: str, why: str) -> None:
    """A new conversation: later turns start from an empty history and a fresh Python state."""
    session = agent.session(session_key)
    session.reset()
    session.set_meta(long_message=None)  # it belongs to the old conversation
    await agent.reset_state(session_key)
    cache_starts_over(session_key, why)


async def handle_command(agent: Agent, session_key: str, text: str) -> str | None:
    """The reply to a chat command, or None when ``text`` is not a command."""
    if not is_command(text):
        return None
    name, _, arg = text.strip().partition(" ")
    name = name.split("@", 1)[0].lower()  # Telegram groups send /cmd@botname
    arg = arg.strip().lower()
    session = agent.session(session_key)
    if name == "/new":
        await start_over(agent, session_key, "/new")
        return "Started a new conversation."
    if name == "/mode":
        if not arg:
            return offer("/mode", f"Mode: {agent.mode_name(session)} (choose with /mode tools|code|hybrid).")
        if arg == "default":  # back to agents.overrides / agents.defaults
            session.set_meta(mode=None)
            session.sync()
            cache_starts_over(session_key, "/mode default")
            return f"Mode reset to the configured default for this chat: {agent.mode_name(session)}."
        if arg not in MODES:
            return f"Unknown mode {arg!r}: choose tools, code, hybrid or default."
        session.set_meta(mode=arg)
        session.sync()
        cache_starts_over(session_key, f"/mode {arg}")
        return f"Mode set to {arg} for this chat."
    if name == "/model":
        return model_command(agent, session_key, text.strip().partition(" ")[2].strip())
    if name == "/voice":
        return voice_command(agent, session_key, arg)
    if name == "/status":
        return await status_text(agent, session_key)
    if name == "/budget":
        return await budget_text(agent, session_key)
    if name == "/tasks":
        return await tasks_text(agent, session_key)
    if name == "/stop" and arg:
        return await stop_task(agent, session_key, arg)
    if name in ("/help", "/start"):
        return help_for(session_key.partition(":")[0])
    if name == "/stop":
        return "Nothing is running."
    return f"Unknown command {name}. /help lists the commands."  # not a model turn: it was meant for me


def offer(command: str, text: str, words: list[str] | None = None) -> Offer:
    """A bare command's answer, with its words (by default the few it always takes) to pick."""
    return Offer(text, [f"{command} {word}" for word in (choices(command) if words is None else words)])


def model_command(agent: Agent, session_key: str, arg: str) -> str:
    """``/model``: the chat's model and the choices; ``/model NAME`` picks one (kept in the session).
    A member chat may pick only from agents.memberModels (by default none)."""
    session = agent.session(session_key)
    config = agent.deps.config
    member = agent.deps.trust(session_key) == MEMBER
    names = config.agents.member_models if member else list(config.agents.models)
    listed = ", ".join(names) or ("none for member chats (agents.memberModels)" if member
                                  else "none configured (agents.models)")
    if not arg:
        provider, model = config.chat_model(session_key, session.meta.model, member=member)
        picked = session.meta.model
        return offer("/model", f"Model: {provider}/{model}{f' ({picked})' if picked in names else ''}. "
                               f"Choices: {listed}; /model default goes back to the configured one.",
                     [*names, "default"] if names else [])
    if arg.lower() == "default":
        session.set_meta(model=None)
    elif arg in names:
        session.set_meta(model=arg)
    elif member and arg in config.agents.models:
        return f"Member chats may not pick {arg!r}: the owner lists theirs in agents.memberModels ({listed})."
    else:
        return f"Unknown model {arg!r}: " + (f"choose one of {listed}, or default." if names else f"there are {listed}.")
    session.sync()
    cache_starts_over(session_key, f"/model {arg}")
    provider, model = config.chat_model(session_key, session.meta.model, member=member)
    return f"Model set to {provider}/{model} for this chat."


VOICE_CHOICES = {"always": "always", "whenvoice": "whenVoice", "never": "never", "default": None}


def voice_command(agent: Agent, session_key: str, arg: str) -> str:
    """``/voice``: when this chat's replies are spoken too (``tools.speech``), kept in the session."""
    session, speech = agent.session(session_key), agent.deps.config.tools.speech
    off = "" if speech.provider else " Spoken replies are off on this assistant (tools.speech.provider)."
    configured = f"{speech.reply} (the configured default, tools.speech.reply)"
    if not arg:
        return offer("/voice", f"Voice: {session.meta.voice or configured} "
                               f"(choose with /voice always|whenVoice|never|default).{off}")
    if arg not in VOICE_CHOICES:
        return f"Unknown choice {arg!r}: choose always, whenVoice, never or default."
    session.set_meta(voice=VOICE_CHOICES[arg])
    session.sync()
    if session.meta.voice is None:  # it said "set to always", as if fixed here: the config decides
        return f"Voice reset to the configured default for this chat: {speech.reply} (tools.speech.reply).{off}"
    return f"Voice set to {session.meta.voice} for this chat.{off}"


async def status_text(agent: Agent, session_key: str) -> str:
    session = agent.session(session_key)
    settings = agent.deps.config.agent_for(session_key)
    ctx = agent.deps.chat_context(session_key)
    owner = ctx.trust == OWNER
    where = "the whole workspace" if owner else \
        f"its own folder {ctx.workspace.relative_to(agent.deps.config.workspace_path).as_posix()}/"
    provider, model = agent.deps.config.chat_model(session_key, session.meta.model, member=not owner)
    lines = [f"Session {session_key}: {session.count} messages, mode {agent.mode_name(session)}, "
             f"model {model}.",
             f"This is {'an owner' if owner else 'a member'} chat: it works in {where}."]
    if agent.deps.usage:  # a member chat sees its own figures; the bot's use and cost are the owner's business
        totals = await agent.deps.usage.totals(None if owner else session_key)
        lines += [f"{mode}: {t.summary(cost=owner)}" for mode, t in sorted(totals.items())]
        if owner:
            lines += await agent.deps.usage.cost_lines(settings.timezone)
    cooling = agent.deps.provider.cooling_down() if owner else {}
    if cooling:
        lines.append("Cooling down: " + ", ".join(f"{p} ({s:.0f} s)" for p, s in cooling.items()))
    return "\n".join(lines)


async def budget_text(agent: Agent, session_key: str) -> str:
    """``/budget``: today's spend against the budgets for an owner chat; a member chat is told
    whether it may go on, with no figures (cost is the owner's business)."""
    config, usage = agent.deps.config, agent.deps.usage
    settings = config.agents.defaults
    share = config.member_budget_usd()
    if settings.daily_budget_usd is None and share is None:
        return "No daily budget is set (agents.defaults.dailyBudgetUsd)."
    since = start_of_today(settings.timezone)
    spent, members = await usage.cost_since(since), await usage.cost_since(since, members=True)
    if agent.deps.trust(session_key) == MEMBER:
        left = (settings.daily_budget_usd is None or spent < settings.daily_budget_usd) and \
            (share is None or members < share)
        return "Member chats may still use the model today." if left else \
            "Today's model budget for member chats is spent; it starts again at midnight."
    lines = [f"Today ({settings.timezone}): ${spent:.2f} spent"
             + (f" of ${settings.daily_budget_usd:.2f} (agents.defaults.dailyBudgetUsd)"
                if settings.daily_budget_usd is not None else "") + "."]
    if share is not None:
        lines.append(f"Member chats: ${members:.2f} of their ${share:.2f} (agents.defaults.memberDailyBudgetUsd).")
    if unpriced := config.unpriced_models():
        lines.append(f"Not counted, no price in providers.<name>.prices: {', '.join(unpriced)}.")
    return "\n".join(lines)


async def tasks_text(agent: Agent, session_key: str) -> str:
    """``/tasks``: the chat's background tasks (id, label, state, age, model calls; cost for owners)."""
    from nanobot.chat_names import task_key
    tasks = await agent.deps.tasks.of_chat(session_key, limit=10)
    if not tasks:
        return "No background tasks in this chat (the model starts them with spawn)."
    owner = agent.deps.trust(session_key) == OWNER
    lines = ["Background tasks, newest first:"]
    for task in tasks:
        calls, cost = await agent.deps.usage.of_chat(task_key(session_key, task.id)) if agent.deps.usage else (0, 0.0)
        age = _age(time.time() - task.created)
        money = f", ${cost:.4f}" if owner and cost else ""
        lines.append(f"- {task.id} {task.label or ''} — {task.state}, {age} ago, {plural(calls, 'model call')}{money}".replace("  ", " "))
    return "\n".join(lines)


async def stop_task(agent: Agent, session_key: str, task_id: str) -> str:
    task = await agent.deps.tasks.request_stop(session_key, task_id)
    if task is None or task.chat != session_key:
        return f"No background task {task_id!r} in this chat; /tasks lists them."
    if task.state not in ("queued", "running"):
        return f"Task {task.id} has {task.state} already."
    return f"Stopping task {task.name}; this chat hears when it has stopped."


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
