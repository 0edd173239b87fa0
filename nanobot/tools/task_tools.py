"""spawn, list_tasks, task_result: background tasks from a chat (``nanobot.tasks``).

A task runs as a turn of its own (the chat's mode, model, tools and rights, a history and a
Python state of its own) while the chat goes on; its result comes to the chat as one message.
``spawn`` records it before returning, so it survives a crash. A turn that read outside content
may not spawn (like other lasting actions), nor may cron jobs or tasks themselves.
"""

from __future__ import annotations

import time
from typing import Annotated

from pydantic import Field

from nanobot.gateway_lock import nothing_runs_jobs
from nanobot.tools.registry import ToolContext, tool
from nanobot.trust import OWNER, quota_holder


async def _store(ctx: ToolContext):
    return ctx.needs_services("background tasks").tasks


@tool(brief=True)
async def spawn(
    ctx: ToolContext,
    task: Annotated[str, Field(description="what to do, said in full: the task sees none of this chat")],
    label: Annotated[str | None, Field(description="a few words the user will recognise it by")] = None,
) -> str:
    """Start a background task and return its id at once: it runs as a turn of its own while this chat goes on,
    and its result comes to this chat as one message. For long work (many pages, a report)."""
    if ctx.origin != "user":
        raise PermissionError(f"a {ctx.origin} turn may not start background tasks")
    ctx.guard.require_clean("spawn")
    if not task.strip():
        raise ValueError("spawn needs the task, said in full")
    services = ctx.needs_services("background tasks")
    if services.terminal and nothing_runs_jobs(ctx.config):
        raise RuntimeError("background tasks run in the gateway (nanobot gateway), and none runs on this home: do "
                           "the work in this chat, or start the gateway and ask again")  # (else it waited for one)
    limits = ctx.config.agent_for(ctx.session_key).tasks
    store = services.tasks
    holder, member = quota_holder(ctx.session_key), ctx.trust != OWNER
    if await store.active(holder=holder) >= limits.max_per_chat:  # an API key's sessions count together
        raise PermissionError(f"this chat has {limits.max_per_chat} background tasks running or waiting already "
                              "(agents.defaults.tasks.maxPerChat); wait for one, or stop one with /stop ID")
    if member and await store.active(members=True) >= limits.member_total:
        raise PermissionError(f"member chats have {limits.member_total} background tasks running or waiting "
                              "already (the rest of agents.defaults.tasks.maxTotal is the owner's); try again later")
    if await store.active() >= limits.max_total:
        raise PermissionError(f"{limits.max_total} background tasks are running or waiting already "
                              "(agents.defaults.tasks.maxTotal); try again when one has finished")
    return (await store.add(ctx.session_key, task.strip(), (label or "").strip()[:60] or None,
                            holder=holder, member=member)).id


@tool(brief=True)
async def list_tasks(ctx: ToolContext) -> list[dict]:
    """This chat's background tasks, newest first: id, label, state, started, attempts."""
    now = time.time()
    return [{"id": t.id, "label": t.label, "state": t.state,
             "started_seconds_ago": round(now - t.started) if t.started else None, "attempts": t.attempts}
            for t in await (await _store(ctx)).of_chat(ctx.session_key)]


@tool(brief=True)
async def task_result(ctx: ToolContext, task_id: str) -> str | None:
    """A finished task's result (or its error, or "stopped"); None while it runs."""
    found = await (await _store(ctx)).get(task_id)
    if found is None or found.chat != ctx.session_key:
        raise ValueError(f"no task {task_id!r} in this chat; list_tasks() shows them")
    return found.result


TASK_TOOLS = [spawn, list_tasks, task_result]
