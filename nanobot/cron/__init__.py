"""Scheduled jobs: ``store`` (the tables, source of truth), ``schedule`` (parsing, triggers),
``service`` (the scheduler inside the gateway) and ``cli`` (``nanobot cron``).

Nothing is imported here, so ``nanobot cron ...`` and the CLI's start-up do not load
APScheduler unless a command needs it.
"""
