"""Scheduled jobs: ``store`` (the tables, source of truth), ``schedule`` (parsing, triggers),
``service`` (the scheduler inside the gateway) and ``cli`` (``nanobot cron``)."""

from nanobot.cron.service import CronService, RunOutcome, create_job
from nanobot.cron.store import CronJob, CronRun, CronStore

__all__ = ["CronJob", "CronRun", "CronService", "CronStore", "RunOutcome", "create_job"]
