"""Schedules: parse and validate them, compute next fire times (with APScheduler's cron trigger).

Three kinds, each stored as (kind, expression, timezone) text:

- ``cron``: five crontab fields. Day-of-week numbers mean what crontab means (0 and 7 =
  Sunday, 1 = Monday). APScheduler 3.x counts 0 as *Monday*, so the field is expanded here
  into day names before APScheduler sees it. As in crontab, when both day-of-month and
  day-of-week are restricted, a day matching *either* fires (APScheduler alone would AND them).
- ``every``: a whole number of seconds, at least 1 (written ``90``, ``30m``, ``2h``, ``1d``
  or ``1h30m`` too); the runs are anchored to the last one.
- ``at``: one ISO 8601 date-time; a naive one is read in the job's timezone.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

ScheduleKind = Literal["cron", "every", "at"]
KINDS: tuple[str, ...] = ("cron", "every", "at")

# Crontab order: index 0 is Sunday. Both numbers and names are accepted in the field.
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW_ITEM = re.compile(r"^(?P<base>\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>\d+))?$")


def zone(name: str) -> ZoneInfo:
    """The ZoneInfo for an IANA name, or a ValueError that says what is expected."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"unknown timezone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'") from None


def _day_number(token: str) -> int:
    if token.isdigit() and 0 <= int(token) <= 7:
        return int(token) % 7  # 7 is Sunday too
    if token in _DAY_NAMES:
        return _DAY_NAMES.index(token)
    raise ValueError(f"bad day of week {token!r}: use 0-7 (0 and 7 = Sunday) or sun..sat")


def _crontab_days(field: str) -> set[int]:
    """Expand a crontab day-of-week field into day numbers, 0 = Sunday."""
    days: set[int] = set()
    for item in field.lower().split(","):
        match = _DOW_ITEM.match(item)
        if not match:
            raise ValueError(f"bad day-of-week item {item!r}")
        base, step = match["base"], int(match["step"] or 1)
        if step < 1:
            raise ValueError(f"bad step in day-of-week item {item!r}")
        if base == "*":
            first, last = 0, 6
        elif "-" in base:
            first_token, last_token = base.split("-")
            # Keep 7 as 7 at the top of a range so "5-7" means Fri..Sun.
            first = _day_number(first_token)
            last = 7 if last_token == "7" else _day_number(last_token)
            if last < first:
                raise ValueError(f"day-of-week range {item!r} goes backwards")
        else:
            first = last = _day_number(base)
            if match["step"]:  # "1/2" means from Monday every 2nd day, as in Vixie cron
                last = 6
        days.update(day % 7 for day in range(first, last + 1, step))
    return days


def _apscheduler_dow(field: str) -> str:
    """A crontab day-of-week field rewritten as APScheduler day names ('*' if every day)."""
    days = _crontab_days(field)
    if len(days) == 7:
        return "*"
    return ",".join(_DAY_NAMES[day] for day in sorted(days))


def cron_trigger(expression: str, tz: ZoneInfo) -> BaseTrigger:
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"cron expression {expression!r} needs 5 fields (minute hour day month weekday), got {len(fields)}")
    minute, hour, day, month, dow = fields
    try:
        dow = _apscheduler_dow(dow)

        def build(day_field: str, dow_field: str) -> CronTrigger:
            return CronTrigger(minute=minute, hour=hour, day=day_field, month=month, day_of_week=dow_field, timezone=tz)

        # crontab: a field starting with '*' is unrestricted; if both are restricted, either matches.
        if not day.startswith("*") and not fields[4].startswith("*"):
            return OrTrigger([build(day, "*"), build("*", dow)])
        return build(day, dow)
    except ValueError as exc:
        raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None


_DURATION_PART = re.compile(r"(\d+)\s*(days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)?", re.I)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_every(text: str) -> int:
    """``"90"``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"``, ``"30 minutes"`` -> seconds."""
    raw = text.strip().lower().removeprefix("every").strip()
    parts = list(_DURATION_PART.finditer(raw))
    if not raw or not parts or "".join(p.group(0) for p in parts).replace(" ", "") != raw.replace(" ", ""):
        raise ValueError(f"'every' needs a duration such as 90, 30m, 2h, 1d or 1h30m, got {text!r}")
    return every_seconds(str(sum(int(p.group(1)) * _UNIT_SECONDS[(p.group(2) or "s")[0]] for p in parts)))


def every_seconds(expression: str) -> int:
    try:
        seconds = int(expression.strip())
    except ValueError:
        raise ValueError(f"'every' needs a whole number of seconds, got {expression!r}") from None
    if seconds < 1:
        raise ValueError(f"'every' needs at least 1 second, got {seconds}")
    return seconds


def at_datetime(expression: str, tz: ZoneInfo) -> datetime:
    """The moment of an ``at`` schedule, timezone-aware (naive input is read in ``tz``)."""
    try:
        moment = datetime.fromisoformat(expression.strip())
    except ValueError:
        raise ValueError(f"'at' needs an ISO 8601 date-time such as 2026-12-24T18:00, got {expression!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)


def validate(kind: str, expression: str, timezone: str, *, now: datetime | None = None) -> str:
    """Check a schedule; returns the expression as it should be stored, or raises ValueError.

    ``at`` moments must lie in the future (relative to ``now``) and are stored normalized
    to an aware ISO string, so later readers need not know which zone the user meant.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}: use one of {', '.join(KINDS)}")
    tz = zone(timezone)
    if kind == "cron":
        cron_trigger(expression, tz)
        return " ".join(expression.split())
    if kind == "every":
        return str(every_seconds(expression))
    moment = at_datetime(expression, tz)
    if moment <= (now or datetime.now(dt_timezone.utc)):
        raise ValueError(f"'at' time {moment.isoformat()} is in the past")
    return moment.isoformat()


def next_fire(kind: str, expression: str, timezone: str, after: datetime) -> datetime | None:
    """The first fire time at or after ``after`` (aware), or None when the schedule is over.

    ``every`` counts from ``after``, like a job created at that moment.
    """
    if kind == "every":
        return after + timedelta(seconds=every_seconds(expression))
    if kind == "at":
        moment = at_datetime(expression, zone(timezone))
        return moment if moment >= after else None
    if kind == "cron":
        trigger = cron_trigger(expression, zone(timezone))
        fire = trigger.get_next_fire_time(None, after)
        # crontab's rule when the clock goes back an hour: a job at a fixed time ("30 2 * * *")
        # does not run again in the repeated hour; one with a wildcard hour or minute runs on.
        fixed = not any(field.startswith("*") for field in expression.split()[:2])
        while fire is not None and fixed and _repeated(fire):
            fire = trigger.get_next_fire_time(None, fire.astimezone(dt_timezone.utc) + timedelta(microseconds=1))
        return fire
    raise ValueError(f"unknown schedule kind {kind!r}")


def _repeated(moment: datetime) -> bool:
    """Whether ``moment`` is the second time its wall-clock time came (``fold``: the hour a
    clock goes back repeats)."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


def describe(kind: str, expression: str) -> str:
    """A short human form for listings: 'cron 0 9 * * 1-5', 'every 1h30m', 'at 2026-...'."""
    return f"every {duration(int(expression))}" if kind == "every" else f"{kind} {expression}"


_DAYS = {"1-5": "weekdays", "mon-fri": "weekdays", "0,6": "weekends", "6,0": "weekends", "sat,sun": "weekends",
         "0": "Sundays", "7": "Sundays", "1": "Mondays", "2": "Tuesdays", "3": "Wednesdays", "4": "Thursdays",
         "5": "Fridays", "6": "Saturdays", "sun": "Sundays", "mon": "Mondays", "tue": "Tuesdays",
         "wed": "Wednesdays", "thu": "Thursdays", "fri": "Fridays", "sat": "Saturdays"}


def in_words(kind: str, expression: str) -> str:
    """The schedule as a person says it: 'weekdays at 09:00', 'every 30m', 'once at 2026-12-01 09:00';
    a crontab line it cannot say simply stays as it is."""
    if kind == "every":
        return f"every {duration(int(expression))}"
    if kind == "at":
        return f"once at {expression.replace('T', ' ')[:16]}"
    fields = expression.split()
    if len(fields) != 5 or not all(f.isdigit() for f in fields[:2]):
        return f"cron {expression}"
    minute, hour, day, month, weekday = fields
    at = f"at {int(hour):02d}:{int(minute):02d}"
    if day == month == "*":
        if weekday == "*":
            return f"every day {at}"
        if weekday.lower() in _DAYS:
            return f"{_DAYS[weekday.lower()]} {at}"
    if month == weekday == "*" and day.isdigit():
        return f"on day {day} of every month {at}"
    return f"cron {expression}"


def duration(seconds: int) -> str:
    """5400 -> '1h30m', 90 -> '1m30s', 86400 -> '1d' (the form ``--every`` accepts)."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(p for p in parts if not p.startswith("0")) or "0s"
