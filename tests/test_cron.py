"""Cron: store, schedules, the service on a real AsyncIOScheduler, and the CLI.

Everything real: aiosqlite on tmp files, APScheduler 3.11, typer's CliRunner. Waits are on
events with timeouts, never fixed sleeps longer than a schedule needs.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanobot.cron import schedule
from nanobot.cli.cron import cron_app
from nanobot.cron.run_requests import RunRequests
from nanobot.cron.service import CronService, RunOutcome, create_job
from nanobot.cron.store import MIGRATIONS, CronJob, CronStore, utcnow
from tests.helpers import add_cron_job, until

UTC = timezone.utc
WEDNESDAY_NOON = datetime(2026, 11, 4, 12, 0, tzinfo=UTC)


# ---- fixtures -------------------------------------------------------------------------
@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nanobot.db"


@pytest.fixture
async def store(db_path: Path):
    store = await CronStore.open(db_path)
    yield store
    await store.close()


class Recorder:
    """A runner that records calls and lets a test await the n-th one."""

    def __init__(self, outcome: RunOutcome | None = None):
        self.calls: list[CronJob] = []
        self.outcome = outcome or RunOutcome("ok", "done", 2)
        self._changed = asyncio.Condition()

    async def __call__(self, job: CronJob) -> RunOutcome:
        async with self._changed:
            self.calls.append(job)
            self._changed.notify_all()
        return self.outcome

    async def wait_for(self, count: int, timeout: float = 3.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.calls) >= count), timeout)


@pytest.fixture
async def make_service(store: CronStore):
    services: list[CronService] = []

    async def make(runner, **kwargs) -> CronService:
        kwargs = {"timezone": "UTC", "grace_seconds": 60, "poll_interval": 0.2, **kwargs}
        service = CronService(RunRequests(store, poll_interval=0.2), runner, **kwargs)
        await service.start()
        services.append(service)
        return service

    yield make
    for service in services:
        await service.stop()


async def add(store: CronStore, kind: str, expression: str, payload: str = "print(1)", **kwargs) -> CronJob:
    return await create_job(store, owner_session="telegram:1", schedule_kind=kind, expression=expression,
                            timezone=kwargs.pop("timezone", "UTC"), payload_kind=kwargs.pop("payload_kind", "code"),
                            payload=payload, **kwargs)


async def set_next_run(store: CronStore, job_id: str, when: datetime) -> None:
    """What a run missed while nanobot was down looks like: the job's next time, past."""
    await store.db.execute("UPDATE cron_jobs SET next_run_at = $1 WHERE id = $2",
                           when.astimezone(timezone.utc).isoformat(timespec="microseconds"), job_id)


# ---- store ----------------------------------------------------------------------------
async def test_store_round_trip_and_schema_version(store: CronStore):
    version = await store.db.fetchval("SELECT version FROM schema_versions WHERE component = 'cron'")
    assert version == len(MIGRATIONS["sqlite"])
    job = await add(store, "cron", "0  9 * * 1-5", name="standup", deliver_to="discord:7")
    assert len(job.id) == 8 and int(job.id, 16) >= 0
    assert (job.name, job.expression, job.target, job.enabled) == ("standup", "0 9 * * 1-5", "discord:7", True)
    assert job.next_run_at is not None and job.next_run_at > utcnow()
    assert [j.id for j in await store.list()] == [job.id]
    assert await store.list(owner_session="telegram:2") == []

    started = utcnow()
    for status in ("error", "error", "missed"):
        updated = await store.record_run(job.id, started, 12, status, "boom" * 1000, 3)
    assert (updated.last_status, updated.consecutive_failures) == ("missed", 2)
    assert (await store.record_run(job.id, started, 5, "ok", "fine")).consecutive_failures == 0
    runs = await store.runs(job.id)
    assert [r.status for r in runs] == ["ok", "missed", "error", "error"]
    assert len(runs[1].output_excerpt) == 2000 and runs[2].function_calls == 3

    assert await store.set_enabled(job.id, False)
    assert (await store.get(job.id)).enabled is False
    assert await store.remove(job.id) and not await store.remove(job.id)
    assert await store.get(job.id) is None


# ---- schedules ------------------------------------------------------------------------
@pytest.mark.parametrize("dow", ["0", "7", "sun"])
def test_weekday_zero_and_seven_are_sunday(dow: str):
    fire = schedule.next_fire("cron", f"0 9 * * {dow}", "UTC", WEDNESDAY_NOON)
    assert fire == datetime(2026, 11, 8, 9, 0, tzinfo=UTC) and fire.strftime("%a") == "Sun"


def test_weekday_range_is_monday_to_friday():
    fires, moment = [], WEDNESDAY_NOON
    for _ in range(10):
        moment = schedule.next_fire("cron", "0 9 * * 1-5", "UTC", moment + timedelta(seconds=1))
        fires.append(moment.strftime("%a"))
    assert fires == ["Thu", "Fri", "Mon", "Tue", "Wed"] * 2


def test_both_day_fields_restricted_means_either_as_in_crontab():
    fire = schedule.next_fire("cron", "0 9 1 * 1", "UTC", WEDNESDAY_NOON)
    assert fire == datetime(2026, 11, 9, 9, 0, tzinfo=UTC)  # the Monday, before Dec 1


def test_timezone_berlin_morning_in_utc():
    winter = schedule.next_fire("cron", "0 9 * * *", "Europe/Berlin", WEDNESDAY_NOON)
    summer = schedule.next_fire("cron", "0 9 * * *", "Europe/Berlin", datetime(2026, 7, 1, tzinfo=UTC))
    assert winter.astimezone(UTC) == datetime(2026, 11, 5, 8, 0, tzinfo=UTC)
    assert summer.astimezone(UTC) == datetime(2026, 7, 1, 7, 0, tzinfo=UTC)


@pytest.mark.parametrize("expression, runs", [
    ("30 2 * * *", ["10-25 00:30", "10-26 01:30", "10-27 01:30"]),  # a fixed time: once, at the first 02:30
    ("*/30 * * * *", ["10-25 00:00", "10-25 00:30", "10-25 01:00", "10-25 01:30", "10-25 02:00"]),  # on, in real time
    ("0 * * * *", ["10-25 00:00", "10-25 01:00", "10-25 02:00", "10-25 03:00"]),
])
def test_a_clock_going_back_repeats_no_fixed_time_job_as_in_crontab(expression: str, runs: list[str]) -> None:
    """Europe/Berlin, 2026-10-25: 03:00 summer time becomes 02:00 again (01:00 UTC)."""
    moment, fired = datetime(2026, 10, 24, 23, 45, tzinfo=UTC), []
    while len(fired) < len(runs):
        moment = schedule.next_fire("cron", expression, "Europe/Berlin", moment + timedelta(microseconds=1)).astimezone(UTC)
        fired.append(moment.strftime("%m-%d %H:%M"))
    assert fired == runs


def test_at_naive_is_read_in_the_jobs_zone():
    stored = schedule.validate("at", "2030-01-01T09:00", "Europe/Berlin")
    assert datetime.fromisoformat(stored).astimezone(UTC) == datetime(2030, 1, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize("kind, expression, zone, message", [
    ("cron", "0 9 * *", "UTC", "needs 5 fields"),
    ("cron", "0 25 * * *", "UTC", "invalid cron expression '0 25 * * *'"),
    ("cron", "0 9 * * 8", "UTC", "bad day of week '8'"),
    ("cron", "0 9 * * 5-1", "UTC", "goes backwards"),
    ("cron", "0 9 * * *", "Mars/Olympus", "unknown timezone 'Mars/Olympus'"),
    ("every", "0", "UTC", "at least 1 second"),
    ("every", "soon", "UTC", "whole number of seconds"),
    ("at", "2020-01-01T00:00", "UTC", "in the past"),
    ("at", "tomorrow", "UTC", "ISO 8601"),
    ("hourly", "1", "UTC", "unknown schedule kind"),
])
def test_bad_schedules_say_what_is_wrong(kind, expression, zone, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        schedule.validate(kind, expression, zone)


async def test_create_job_rejects_bad_target_and_code(store: CronStore):
    async def syntax_check(code: str) -> str | None:
        return "SyntaxError: line 1" if "(" not in code else None

    with pytest.raises(ValueError, match="channel:chat_id"):
        await add(store, "every", "5", deliver_to="telegram")
    with pytest.raises(ValueError, match="rejected: SyntaxError: line 1"):
        await add(store, "every", "5", payload="print 1", validate_code=syntax_check)
    for too_much in ({"name": "x" * 101}, {"payload": "print(1)\n" * 20_000}):
        with pytest.raises(ValueError, match="name is at most 100 characters"):  # listed to the owner
            await add(store, "every", "5", **too_much)
    assert await store.list() == []


# ---- service --------------------------------------------------------------------------
async def test_every_second_job_fires_and_is_recorded(store, make_service):
    runner = Recorder()
    service = await make_service(runner)
    job = await add_cron_job(service, owner_session="telegram:1", schedule_kind="every", expression="1",
                                payload_kind="prompt", payload="ping")
    await runner.wait_for(1)
    assert runner.calls[0].id == job.id and runner.calls[0].payload == "ping"
    await until(lambda: _status(store, job.id, "ok"))
    run = (await store.runs(job.id))[0]
    assert (run.status, run.output_excerpt, run.function_calls) == ("ok", "done", 2)
    assert (await store.get(job.id)).next_run_at > run.started_at


async def _status(store: CronStore, job_id: str, status: str) -> bool:
    job = await store.get(job_id)
    return job is not None and job.last_status == status


async def test_at_job_runs_once_and_is_gone(store, make_service):
    runner = Recorder()
    service = await make_service(runner)
    when = (utcnow() + timedelta(seconds=0.5)).isoformat()
    job = await add_cron_job(service, owner_session="telegram:1", schedule_kind="at", expression=when,
                                payload_kind="code", payload="print(1)")
    await runner.wait_for(1)
    await until(lambda: _gone(store, job.id))
    assert [r.status for r in await store.runs(job.id)] == ["ok"]
    assert await service.store.list() == [] and len(runner.calls) == 1


async def _gone(store: CronStore, job_id: str) -> bool:
    return await store.get(job_id) is None


async def test_three_failures_pause_the_job_and_tell_the_owner(store, make_service):
    notices: list[tuple[str, str]] = []

    async def on_notice(job: CronJob, text: str) -> None:
        notices.append((job.id, text))

    service = await make_service(Recorder(RunOutcome("error", "ZeroDivisionError: division by zero")),
                                 on_notice=on_notice)
    job = await add_cron_job(service, owner_session="telegram:1", schedule_kind="cron", expression="0 9 * * *",
                                payload_kind="code", payload="1/0")
    for _ in range(3):
        assert (await service.requests.run(job.id, 5)).status == "error"
    paused = await store.get(job.id)
    assert (paused.enabled, paused.consecutive_failures, paused.next_run_at) == (False, 3, None)
    assert [text.split(": ")[0] for _, text in notices[:2]] == [
        f"Cron job '1/0' ({job.id}) failed (1/3)", f"Cron job '1/0' ({job.id}) failed (2/3)"]
    assert "paused" in notices[2][1] and "ZeroDivisionError" in notices[2][1] and len(notices) == 3


async def test_runner_exception_counts_as_a_failure(store, make_service):
    async def broken(job: CronJob) -> RunOutcome:
        raise RuntimeError("sandbox gone")

    service = await make_service(broken)
    job = await add(store, "every", "3600")
    run = await service.requests.run(job.id, 5)
    assert run.status == "error" and "sandbox gone" in run.output_excerpt
    assert (await store.get(job.id)).consecutive_failures == 1


async def test_missed_run_within_grace_runs_once_at_start(store, make_service):
    job = await add(store, "cron", "*/5 * * * *")
    await set_next_run(store, job.id, utcnow() - timedelta(seconds=30))  # due while "down"
    runner = Recorder()
    await make_service(runner, grace_seconds=60)
    await runner.wait_for(1)
    await until(lambda: _status(store, job.id, "ok"))
    assert (await store.get(job.id)).next_run_at > utcnow()


async def test_missed_run_beyond_grace_is_recorded_as_missed(store, make_service):
    job = await add(store, "cron", "0 * * * *")
    await set_next_run(store, job.id, utcnow() - timedelta(hours=2))
    notices: list[str] = []
    runner = Recorder()
    await make_service(runner, grace_seconds=60, on_notice=lambda job, text: notices.append(text))
    assert (await store.get(job.id)).last_status == "missed"
    assert [r.status for r in await store.runs(job.id)] == ["missed"]
    assert runner.calls == [] and "missed its run" in notices[0]


async def test_changes_from_another_connection_reach_the_running_service(db_path, store, make_service):
    runner = Recorder()
    service = await make_service(runner)
    cli_store = await CronStore.open(db_path)  # what `nanobot cron add` does from its own process
    try:
        job = await add(cli_store, "every", "1")
        await runner.wait_for(1, timeout=2.5)  # picked up within a poll, then fires within 1 s
        assert runner.calls[0].id == job.id

        assert await cli_store.remove(job.id)
        await until(lambda: _no_jobs(service))

        manual = await add(cli_store, "cron", "0 0 1 1 *", payload="print('manual')")
        calls = len(runner.calls)
        await cli_store.request_run(manual.id)  # what `nanobot cron run ID` does
        await runner.wait_for(calls + 1, timeout=2.0)
        assert runner.calls[-1].id == manual.id
        await until(lambda: _status(store, manual.id, "ok"))
        assert (await store.get(manual.id)).run_requested is False
    finally:
        await cli_store.close()


async def _no_jobs(service: CronService) -> bool:
    return await service.store.list() == []


async def test_stop_cancels_a_running_job(store, make_service):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(job: CronJob) -> RunOutcome:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return RunOutcome("ok")

    requests = RunRequests(store, poll_interval=0.2)
    service = CronService(requests, slow, poll_interval=0.2)
    await service.start()
    job = await add(store, "every", "3600")
    await store.request_run(job.id)
    requests.asked.set()
    await asyncio.wait_for(started.wait(), 2)
    await asyncio.wait_for(service.stop(), 2)
    assert cancelled.is_set()


# ---- CLI ------------------------------------------------------------------------------
@pytest.fixture
def owner_config(home: Path) -> None:
    """Telegram on, with user 42 as the owner: the chat a job made in the terminal delivers to."""
    (home / "config.json").write_text(json.dumps({"channels": {"telegram": {
        "enabled": True, "token": "1:x", "allowFrom": ["42"]}}}))


def invoke(*args: str, obj: dict | None = None):
    return CliRunner().invoke(cron_app, list(args), obj=obj if obj is not None else {"config": None})


def test_cli_add_list_remove(home: Path, tmp_path: Path, owner_config: None):
    script = tmp_path / "job.py"
    script.write_text("print('hello')\n")
    result = invoke("add", "--name", "weekly", "--cron", "0 9 * * 0", "--tz", "Europe/Berlin",
                    "--code", str(script), "--to", "telegram:42")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert len(job_id) == 8

    result = invoke("add", "--every", "60", "--message", "check the news")
    assert result.exit_code == 0, result.output

    listing = invoke("list")
    assert listing.exit_code == 0
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:6] == ["ID", "NAME", "SCHEDULE", "TZ", "KIND", "TARGET"]
    weekly = next(row for row in rows if row.startswith(job_id))
    for cell in ("weekly", "cron 0 9 * * 0", "Europe/Berlin", "code", "telegram:42", "yes"):
        assert cell in weekly
    next_run = datetime.strptime(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", weekly)[0], "%Y-%m-%d %H:%M")
    assert next_run.strftime("%a %H:%M") == "Sun 09:00"  # shown in the job's zone
    assert any("every 1m" in row and "cli:default" in row and "prompt" in row for row in rows)  # the terminal chat

    assert invoke("remove", job_id).exit_code == 0
    assert job_id not in invoke("list").stdout
    assert (home / "nanobot.db").exists()


def test_cli_names_a_job_by_its_id_or_its_name(home: Path, owner_config: None):
    """People name their jobs and then type the name (it was "no cron job with id 'stretch'")."""
    stretch = invoke("add", "--name", "stretch", "--every", "1h", "--message", "stretch").stdout.strip()
    added = [invoke("add", "--name", "twin", "--every", "1h", "--message", "x") for _ in range(2)]
    twins = [result.stdout.strip() for result in added]
    assert f"Another job is named 'twin' too ({twins[0]}): name each by its id." in added[1].stderr
    assert invoke("disable", "stretch").stdout == f"Disabled {stretch} (stretch).\n"
    assert invoke("runs", "stretch").stdout == f"No runs of {stretch} yet.\n"
    both = invoke("remove", "twin")
    assert both.exit_code == 1 and "2 cron jobs are named 'twin' (ids " in both.stderr and "give the id" in both.stderr
    assert all(twin in both.stderr for twin in twins)
    assert invoke("remove", twins[0]).exit_code == 0 and invoke("remove", "twin").exit_code == 0
    assert invoke("remove", "stretch").stdout == f"Removed {stretch} (stretch).\n"
    assert invoke("list").stdout.strip() == "No cron jobs."


def test_cli_run_without_a_gateway_refuses(home: Path, owner_config: None):
    added = invoke("add", "--every", "60", "--message", "hi")  # added all the same, and says when it runs
    assert added.exit_code == 0 and f"No gateway runs on {home}: the job runs once one does" in added.stderr
    result = invoke("run", added.stdout.strip())
    assert result.exit_code == 1 and "no gateway is running" in result.stderr and not result.stdout


def test_cli_run_requests_a_run(home: Path, owner_config: None):
    from nanobot.gateway_lock import GatewayLock

    lock = GatewayLock(home)  # what a running gateway holds (the CLI reads only this lock)
    lock.acquire()
    try:
        added = invoke("add", "--every", "60", "--message", "hi")
        assert added.exit_code == 0 and "No gateway runs" not in added.stderr
        job_id = added.stdout.strip()
        result = invoke("run", job_id)
        timed_out = invoke("run", job_id, "--wait", "0.3")
    finally:
        lock.release()
    assert result.exit_code == 0 and "requested" in result.stdout

    async def check() -> bool:
        store = await CronStore.open(home / "nanobot.db")
        try:
            return (await store.get(job_id)).run_requested
        finally:
            await store.close()

    assert asyncio.run(check()) is True
    assert timed_out.exit_code == 1 and "is the gateway running" in timed_out.stderr


@pytest.mark.parametrize("args, code, message", [
    (["add", "--cron", "0 9 * *", "--message", "x"], 2, "needs 5 fields"),
    (["add", "--cron", "0 9 * * *", "--tz", "Nowhere/City", "--message", "x"], 2, "unknown timezone"),
    (["add", "--every", "5", "--message", "x", "--code", __file__], 2, "exactly one of --code / --message"),
    (["add", "--every", "5", "--at", "2030-01-01T00:00", "--message", "x"], 2, "exactly one of --cron"),
    (["add", "--every", "5"], 2, "exactly one of --code / --message"),
    (["add", "--every", "5", "--code", "missing.py"], 2, "does not exist"),
    (["add", "--every", "5", "--message", "x", "--to", "telegram"], 2, "channel:chat_id"),
    (["add", "--every", "5", "--message", "x", "--to", "slack:1"], 2, "channel 'slack' is not enabled"),
    (["add", "--every", "5 parsecs", "--message", "x"], 2, "needs a duration such as"),
    (["remove", "deadbeef"], 1, "no cron job with id or name 'deadbeef'"),
    (["run", "deadbeef"], 1, "no cron job with id or name 'deadbeef'"),
])
def test_cli_errors_and_exit_codes(home: Path, args, code, message, owner_config: None):
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert message in " ".join(result.stderr.split())
    assert result.stderr.startswith(("nanobot: ", "Usage: "))  # ours as every command says it; or click's usage


def test_cli_help_lists_whole_sentences(home: Path) -> None:
    shown = invoke("--help").stdout
    assert "Resume a paused job." in shown and "(e.g." not in shown


def test_cli_jobs_deliver_to_the_terminal_or_an_api_chat_without_an_owner_chat(home: Path):
    """An API-only or terminal-only set-up: the terminal's and the API's chats are targets too."""
    assert invoke("add", "--every", "60", "--message", "x").exit_code == 0
    assert invoke("add", "--every", "60", "--message", "x", "--to", "api:bob").exit_code == 0
    assert invoke("add", "--every", "60", "--message", "x", "--to", "cli:notes").exit_code == 0
    rows = invoke("list").stdout
    assert "cli:default" in rows and "api:bob" in rows and "cli:notes" in rows


def test_cli_every_takes_durations_and_runs_shows_history(home: Path, owner_config: None):
    job_id = invoke("add", "--every", "1h30m", "--message", "x").stdout.strip()
    assert "every 1h30m" in invoke("list").stdout

    async def record() -> None:
        store = await CronStore.open(home / "nanobot.db")
        try:
            await store.record_run(job_id, datetime.now(timezone.utc), 12, "error", "ZeroDivisionError: division by zero")
        finally:
            await store.close()

    assert "No runs" in invoke("runs", job_id).stdout
    asyncio.run(record())
    result = invoke("runs", job_id)
    assert result.exit_code == 0 and "error" in result.stdout and "ZeroDivisionError: division by zero" in result.stdout


def test_cli_code_validation_hook(home: Path, tmp_path: Path, owner_config: None):
    script = tmp_path / "bad.py"
    script.write_text("def (:\n")

    async def syntax_check(code: str) -> str | None:
        return "SyntaxError: invalid syntax (line 1)"

    result = invoke("add", "--every", "5", "--code", str(script), obj={"validate_code": syntax_check})
    assert result.exit_code == 2 and "invalid syntax" in result.stderr


def test_cli_config_error_exits_2(home: Path, tmp_path: Path):
    result = invoke("list", obj={"config": str(tmp_path / "nope.json")})
    assert result.exit_code == 2 and "config file not found" in result.stderr


# ---- every: anchored to the last run ------------------------------------------------------
async def test_every_is_anchored_to_the_last_run_across_restarts(store, make_service):
    """A daily job on a daemon restarted more than once a day must still fire once a day: its
    next time is the due time plus a day, whatever restarts come between."""
    job = await add(store, "every", "86400")
    due = utcnow() - timedelta(seconds=1)
    await set_next_run(store, job.id, due)
    runner = Recorder()
    service = await make_service(runner)
    await runner.wait_for(1)
    await service.stop()
    for _ in range(3):  # three restarts: the next run stays a day after the last one was due
        service = await make_service(runner)
        assert (await store.get(job.id)).next_run_at == due + timedelta(days=1)
        await service.stop()
    assert len(runner.calls) == 1


async def test_a_one_shot_running_past_the_next_look_is_neither_paused_nor_run_again(store, make_service):
    """A claimed one-shot has no next time while it runs; the clock's next look must not take it
    for a job to schedule (it would pause it) or run it again."""
    started, release = asyncio.Event(), asyncio.Event()
    runs = 0

    async def slow(job: CronJob) -> RunOutcome:
        nonlocal runs
        runs += 1
        started.set()
        await release.wait()
        return RunOutcome("ok")

    due = utcnow() - timedelta(seconds=1)  # stored as it was when it was made, a moment ago
    job = await store.add(name="once", owner_session="telegram:1", schedule_kind="at", expression=due.isoformat(),
                          timezone="UTC", payload_kind="code", payload="print(1)", next_run_at=due)
    service = await make_service(slow, poll_interval=3600)
    await asyncio.wait_for(started.wait(), 5)
    await service._tick()  # the clock's next look, while the run goes on
    assert (await store.get(job.id)).enabled and runs == 1
    release.set()
    await until(lambda: _gone(store, job.id))
    assert runs == 1


async def test_two_clocks_run_a_due_job_once(store, make_service):
    """The row is the schedule: a clock claims a due run by moving next_run_at on, and a second
    clock (two workers over one hand-over) finds nothing left to claim."""
    job = await add(store, "every", "3600")
    await set_next_run(store, job.id, utcnow() - timedelta(seconds=1))
    runner = Recorder()
    first, second = await asyncio.gather(make_service(runner), make_service(runner))
    await runner.wait_for(1)
    await until(lambda: _status(store, job.id, "ok"))
    await asyncio.gather(first.stop(), second.stop())
    assert len(runner.calls) == 1 and len(await store.runs(job.id)) == 1


async def test_a_missed_interval_run_is_caught_up_within_the_grace(store, make_service):
    ran = asyncio.Event()

    async def runner(job: CronJob) -> RunOutcome:
        ran.set()
        return RunOutcome("ok")

    job = await add(store, "every", "3600")
    await store.record_run(job.id, utcnow() - timedelta(seconds=3630), 5, "ok")  # due 30 s ago
    await set_next_run(store, job.id, utcnow() - timedelta(seconds=30))
    await make_service(runner, grace_seconds=60)
    await asyncio.wait_for(ran.wait(), 5)


def test_schedules_are_described_with_units() -> None:
    from nanobot.cron.schedule import describe

    assert [describe("every", s) for s in ("60", "90", "5400", "86400")] == \
        ["every 1m", "every 1m30s", "every 1h30m", "every 1d"]
    assert describe("cron", "0 9 * * 1-5") == "cron 0 9 * * 1-5"
