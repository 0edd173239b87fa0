"""schedule_cron, list_cron, remove_cron, enable_cron, run_cron: the agent's hands on the cron store.

They write nanobot.db, the scheduler's source of truth; a running gateway picks a change up
within its poll interval (about a second), the same way it sees ``nanobot cron add``. Code is
checked (syntax, and types with typeCheck) when it is scheduled, so a broken job is refused
now rather than failing at 3 a.m.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from nanobot.tools.messaging import allowed_target
from nanobot.notices import NEW_JOB
from nanobot.tools.registry import ToolContext, tool
from nanobot.trust import API_CHANNEL, quota_holder

if TYPE_CHECKING:
    from nanobot.cron.store import CronJob

MIN_EVERY_SECONDS = 60  # for jobs made from a chat (the CLI may go lower)


def parse_expression(expression: str) -> tuple[str, str]:
    """``"0 9 * * 1-5"`` -> cron; ``"every 10m"`` -> every 600 s; ``"at 2026-12-01T09:00"`` -> one shot."""
    from nanobot.cron.schedule import parse_every

    text = expression.strip()
    if text.lower().startswith("every"):
        return "every", str(parse_every(text))
    if text.lower().startswith("at "):
        return "at", text[3:].strip()
    return "cron", text


async def _store(ctx: ToolContext):
    return ctx.needs_services("cron").cron


async def _validator(ctx: ToolContext):
    if ctx.services is None:
        return None
    programs = ctx.services.code
    limits = ctx.config.agent_for(ctx.session_key).code_runtime

    async def validate(program: str) -> str | None:
        return await programs.check(program, limits)

    return validate


@tool(brief=True)
async def schedule_cron(
    ctx: ToolContext,
    expression: Annotated[str, Field(description='crontab "0 9 * * 1-5" (0 and 7 = Sunday), "every 30m", or "at 2026-12-01T09:00"')],
    code: Annotated[str, Field(description="Python run on schedule with the same functions, no model call; "
                                           "its printed output or last value is sent to this chat")] = "",
    name: str | None = None,
    message: Annotated[str | None, Field(description="instead of code: a request run as a chat turn")] = None,
    to: Annotated[str | None, Field(description='the chat its output goes to, "channel:chat_id" (send_message\'s '
                                                'rules); default this chat')] = None,
) -> str:
    """Schedule code (or a message turn) in this chat's timezone; returns the job id. Output goes to this chat,
    or to `to`. run_cron(id) tries a job once now."""
    from nanobot.cron.delivery import resolve_target
    from nanobot.cron.schedule import describe
    from nanobot.cron.service import create_job

    if bool(code.strip()) == bool(message):
        raise ValueError("schedule_cron needs exactly one of code or message")
    ctx.guard.require_clean("schedule_cron")
    kind, expr = parse_expression(expression)
    if kind == "every" and int(expr) < MIN_EVERY_SECONDS:
        raise ValueError(f"jobs made from a chat run at most once a minute: use 'every {MIN_EVERY_SECONDS}s' or more")
    store = await _store(ctx)
    limit, holder = ctx.config.gateway.max_cron_jobs_per_chat, quota_holder(ctx.session_key)
    if sum(quota_holder(job.owner_session) == holder for job in await store.list()) >= limit:
        whose = "this API key's chats have" if holder.startswith(f"{API_CHANNEL}:") else "this chat has"
        raise PermissionError(f"{whose} {limit} scheduled jobs already (gateway.maxCronJobsPerChat); "
                              "remove one with remove_cron first")
    if to:
        to = (await allowed_target(ctx, to, "schedule_cron"))[2]
    deliver_to = resolve_target(ctx.config, ctx.session_key, to)
    job = await create_job(store, owner_session=ctx.session_key, schedule_kind=kind, expression=expr,
                           timezone=ctx.config.agent_for(ctx.session_key).timezone,
                           payload_kind="prompt" if message else "code", payload=message or code, name=name,
                           deliver_to=deliver_to, validate_code=await _validator(ctx))
    await ctx.announce(f"{NEW_JOB}{job.id} ({describe(kind, expr)}) made by {ctx.session_key}: {job.name}")
    return job.id


@tool(brief=True)
async def list_cron(ctx: ToolContext) -> list[dict]:
    """This chat's jobs: id, name, schedule, next run, last status."""
    from nanobot.cron.schedule import describe

    jobs = await (await _store(ctx)).list(owner_session=ctx.session_key)
    return [{"id": j.id, "name": j.name, "schedule": describe(j.schedule_kind, j.expression), "timezone": j.timezone,
             "kind": j.payload_kind, "enabled": j.enabled, "delivers_to": j.target,
             "next_run": j.next_run_at.isoformat() if j.next_run_at else None, "last_status": j.last_status}
            for j in jobs]


async def _own_job(ctx: ToolContext, job_id: str) -> CronJob:
    """One of this chat's jobs (another chat's is not there for it)."""
    job = await (await _store(ctx)).get(job_id)
    if job is None or job.owner_session != ctx.session_key:
        raise ValueError(f"no job {job_id!r} in this chat; list_cron() shows them")
    return job


@tool(brief=True)
async def remove_cron(ctx: ToolContext, job_id: str) -> str:
    """Delete one of this chat's scheduled jobs."""
    ctx.guard.require_clean("remove_cron")
    await (await _store(ctx)).remove((await _own_job(ctx, job_id)).id)
    return f"removed {job_id}"


@tool(brief=True)
async def enable_cron(ctx: ToolContext, job_id: str, enabled: bool = True) -> str:
    """Resume one of this chat's jobs (one paused after 3 failures in a row starts again), or pause it with
    enabled=False."""
    ctx.guard.require_clean("enable_cron")
    await (await _store(ctx)).set_enabled((await _own_job(ctx, job_id)).id, enabled)
    return f"{'resumed' if enabled else 'paused'} {job_id}"


@tool(brief=True)
async def run_cron(ctx: ToolContext, job_id: str) -> dict:
    """Run a job once now; returns {"status": "ok" or "error", "output": ...}."""
    job = await _own_job(ctx, job_id)
    if job.payload_kind != "code":  # its turn would queue behind this one, which waits for it
        raise ValueError("only code jobs can be run from a chat; a message job runs as a turn at its time")
    services = ctx.needs_services("run_cron")
    if services.terminal:
        raise RuntimeError("jobs run in the gateway (nanobot gateway), not in this terminal chat; to test a code "
                           "job here, run its code directly")
    from nanobot.cron.run_requests import run_wait_s

    run = await services.cron_runs.run(job_id, run_wait_s(ctx.config.agent_for(job.owner_session).code_runtime))
    return {"status": run.status, "output": run.output_excerpt}


CRON_TOOLS = [schedule_cron, list_cron, remove_cron, enable_cron, run_cron]
