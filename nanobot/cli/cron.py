"""``nanobot cron``: manage jobs in nanobot.db, also while the gateway runs.

The CLI never schedules anything itself. It writes the store (same SQLite file, WAL mode,
or the PostgreSQL database); the table is the schedule, and a running gateway's cron clock
looks at it about every second. ``run JOB`` therefore *requests* a run (marks the row), which
the gateway performs: only the gateway has the sandbox, the model and the connected channels
a job needs.

Convention with the parent app: ``ctx.obj`` may be a dict with
``"config"`` (the ``--config`` path or None; ``load_config`` also honours NANOBOT_CONFIG)
and ``"validate_code"`` (an optional ``async (code) -> error text | None`` hook, e.g. the
sandbox's syntax check). Without ``ctx.obj`` both default to None.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import typer

from nanobot.cli.common import fail, get_config, table
from nanobot.config import Config, nanobot_home
from nanobot.cron.run_requests import RunRequests
from nanobot.cron.store import CronJob, CronStore
from nanobot.database import open_database
from nanobot.gateway_lock import nothing_runs_jobs, running_gateway_pid
from nanobot.sqlite_file import HomeError
from nanobot.utf8 import for_terminal

cron_app = typer.Typer(name="cron", no_args_is_help=True, rich_markup_mode=None,
                       help="Scheduled jobs. Changes reach a running gateway within about a second.")

CLI_SESSION = "cli:default"
JOB_HELP = "the job's id, or its name when no other job has it"


class CliError(Exception):
    """A message for stderr and the exit code that goes with it (1 runtime, 2 bad usage)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _options(ctx: typer.Context) -> dict[str, Any]:
    return ctx.obj if isinstance(ctx.obj, dict) else {}


def _run(ctx: typer.Context, action: Callable[[CronStore, Config], Awaitable[None]]) -> None:
    """Load the config, open the store, run ``action``, and map failures to exit codes."""
    config = get_config(ctx)

    async def main() -> None:
        db = await open_database(config)
        try:
            await action(await CronStore.open(db), config)
        finally:
            await db.close()

    try:
        asyncio.run(main())
    except CliError as exc:
        fail(str(exc), exc.code)
    except ValueError as exc:  # create_job's validation: a bad expression, zone, target or code
        fail(str(exc), 2)
    except HomeError as exc:
        fail(str(exc), 1)
    except (sqlite3.Error, OSError) as exc:
        fail(f"database {config.home / 'nanobot.db'}: {exc}", 1)


# ---- list -------------------------------------------------------------------------
def _when(job: CronJob) -> str:
    if job.next_run_at is None:
        return "-"
    try:
        from nanobot.cron import schedule

        tz = schedule.zone(job.timezone)
    except ValueError:
        tz = None
    return job.next_run_at.astimezone(tz).strftime("%Y-%m-%d %H:%M")


@cron_app.command("list")
def list_jobs(ctx: typer.Context) -> None:
    """List jobs: schedule, timezone, kind, delivery target, next run (in the job's zone)."""

    async def action(store: CronStore, config: Config) -> None:
        from nanobot.cron import schedule

        jobs = await store.list()
        if not jobs:
            typer.echo("No cron jobs.")
            return
        rows = [["ID", "NAME", "SCHEDULE", "TZ", "KIND", "TARGET", "ENABLED", "NEXT RUN", "LAST"]]
        rows += [[job.id, job.name, schedule.describe(job.schedule_kind, job.expression), job.timezone,
                  job.payload_kind, job.target, "yes" if job.enabled else "no", _when(job), job.last_status or "-"]
                 for job in jobs]
        typer.echo(table(rows))

    _run(ctx, action)


# ---- add --------------------------------------------------------------------------
def _one_of(options: dict[str, Any]) -> tuple[str, Any]:
    given = [(name, value) for name, value in options.items() if value is not None]
    if len(given) != 1:
        fail(f"give exactly one of {' / '.join('--' + name for name in options)}", 2)
    return given[0]


@cron_app.command("add")
def add(
    ctx: typer.Context,
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="A label for listings (default: from the payload)."),
    cron: Optional[str] = typer.Option(None, "--cron", metavar="EXPR",
                                       help="Crontab expression, 5 fields; weekday 0 and 7 = Sunday."),
    tz: Optional[str] = typer.Option(None, "--tz", metavar="ZONE",
                                     help="IANA zone for --cron and a naive --at (default: agents.defaults.timezone)."),
    every: Optional[str] = typer.Option(None, "--every", metavar="DURATION",
                                        help="Run every 90 (seconds), 30m, 2h, 1d or 1h30m; anchored to the last run."),
    at: Optional[str] = typer.Option(None, "--at", metavar="ISO8601", help="Run once at this date-time."),
    code: Optional[Path] = typer.Option(None, "--code", metavar="FILE", exists=True, dir_okay=False,
                                        help="Python file to run in the sandbox (no model call)."),
    message: Optional[str] = typer.Option(None, "--message", metavar="TEXT",
                                          help="Prompt to run as an agent turn."),
    to: Optional[str] = typer.Option(None, "--to", metavar="CHANNEL:CHAT_ID",
                                     help="Deliver results (and failure notices) to this chat; default: the "
                                          "owner's chat."),
) -> None:
    """Add a job and print its id."""
    kind, expression = _one_of({"cron": cron, "every": every, "at": at})
    payload_kind, payload_source = _one_of({"code": code, "message": message})
    if payload_kind == "code":
        try:
            payload = Path(payload_source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read --code file {payload_source}: {exc}", 2)
    else:
        payload = payload_source
    validate_code = _options(ctx).get("validate_code")

    async def action(store: CronStore, config: Config) -> None:
        from nanobot.cron.delivery import resolve_target
        from nanobot.cron.schedule import parse_every
        from nanobot.cron.service import create_job

        owner = to or CLI_SESSION
        job = await create_job(
            store, name=name, owner_session=owner, deliver_to=resolve_target(config, owner, to), schedule_kind=kind,
            expression=str(parse_every(expression) if kind == "every" else expression),
            timezone=tz or config.agents.defaults.timezone,
            payload_kind="code" if payload_kind == "code" else "prompt", payload=payload,
            validate_code=validate_code)
        typer.echo(job.id)
        typer.echo(f"Output goes to {job.target}.", err=True)
        if twins := [other.id for other in await store.list() if other.name == job.name and other.id != job.id]:
            typer.echo(f"Another job is named {job.name!r} too ({', '.join(twins)}): name each by its id.", err=True)
        if nothing_runs_jobs(config):
            typer.echo(f"No gateway runs on {config.home}: the job runs once one does (nanobot gateway, or "
                       "the systemd service).", err=True)

    _run(ctx, action)


# ---- runs -------------------------------------------------------------------------
@cron_app.command("runs")
def runs(ctx: typer.Context, ref: str = typer.Argument(..., metavar="JOB", help=JOB_HELP),
         limit: int = typer.Option(20, "--limit", min=1, metavar="N", help="How many of the latest runs.")) -> None:
    """The job's latest runs, newest first: when, how long, status, and the output or error."""

    async def action(store: CronStore, config: Config) -> None:
        job = await _existing(store, ref)
        history = await store.runs(job.id, limit=limit)
        if not history:
            typer.echo(f"No runs of {job.id} yet.")
            return
        rows = [["STARTED", "MS", "STATUS", "OUTPUT / ERROR"]]
        rows += [[r.started_at.isoformat(timespec="seconds"), str(r.duration_ms), r.status,
                  " ".join(r.output_excerpt.split())[:100]] for r in history]
        typer.echo(table(rows))

    _run(ctx, action)


# ---- remove / enable / disable / run ----------------------------------------------
async def _existing(store: CronStore, ref: str) -> CronJob:
    """The job ``ref`` names: its id, or its name when one job has that name."""
    if (job := await store.get(ref)) is not None:
        return job
    named = [job for job in await store.list() if job.name == ref]
    if len(named) > 1:
        raise CliError(f"{len(named)} cron jobs are named {ref!r} (ids {', '.join(j.id for j in named)}): "
                       "give the id", 1)
    if not named:
        raise CliError(f"no cron job with id or name {ref!r}", 1)
    return named[0]


@cron_app.command("remove")
def remove(ctx: typer.Context, ref: str = typer.Argument(..., metavar="JOB", help=JOB_HELP)) -> None:
    """Delete a job (its run history stays). Unknown job: exit 1."""

    async def action(store: CronStore, config: Config) -> None:
        job = await _existing(store, ref)
        await store.remove(job.id)
        typer.echo(f"Removed {job.id} ({job.name}).")

    _run(ctx, action)


def _set_enabled(ctx: typer.Context, ref: str, enabled: bool) -> None:
    async def action(store: CronStore, config: Config) -> None:
        job = await _existing(store, ref)
        await store.set_enabled(job.id, enabled)
        typer.echo(f"{'Enabled' if enabled else 'Disabled'} {job.id} ({job.name}).")

    _run(ctx, action)


@cron_app.command("enable")
def enable(ctx: typer.Context, ref: str = typer.Argument(..., metavar="JOB", help=JOB_HELP)) -> None:
    """Resume a paused job. One paused after 3 failures in a row starts again with its failure count reset."""
    _set_enabled(ctx, ref, True)


@cron_app.command("disable")
def disable(ctx: typer.Context, ref: str = typer.Argument(..., metavar="JOB", help=JOB_HELP)) -> None:
    """Pause a job without deleting it."""
    _set_enabled(ctx, ref, False)


@cron_app.command("run")
def run(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="JOB", help=JOB_HELP),
    wait: float = typer.Option(0, "--wait", metavar="SECONDS",
                               help="Wait up to this long for the run and print its result (exit 1 if it "
                                    "failed or did not happen)."),
) -> None:
    """Ask the running gateway to run the job now, once, even if disabled; its schedule is unchanged.

    The request is stored in the database and the gateway picks it up within about a second.
    With no gateway running nothing could run it (its output goes to a chat), so it is refused.
    """

    async def action(store: CronStore, config: Config) -> None:
        job_id = (await _existing(store, ref)).id
        if running_gateway_pid(nanobot_home()) is None:
            raise CliError(f"no gateway is running on {nanobot_home()}, so nothing would run job {job_id} or "
                           "deliver its output; start it (nanobot gateway, or the systemd service) and try again", 1)
        if wait <= 0:
            await store.request_run(job_id)
            typer.echo(f"Run of {job_id} requested; the running gateway starts it within about a second.")
            return
        try:
            run = await RunRequests(store, poll_interval=0.2).run(job_id, wait)
        except TimeoutError:
            raise CliError(f"no run of {job_id} within {wait:g} s: is the gateway running? (the request stays "
                           "queued)", 1) from None
        typer.echo(for_terminal(f"{run.status} ({run.duration_ms} ms)\n{run.output_excerpt}".rstrip()))  # what it printed
        if run.status != "ok":
            raise CliError(f"job {job_id} ended with status {run.status}", 1)

    _run(ctx, action)
