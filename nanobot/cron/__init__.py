"""Scheduled jobs: ``store`` (the tables: the schedule itself), ``schedule`` (parsing, next
times), ``service`` (the clock inside the gateway that claims due rows and runs them) and
``delivery`` (where output may go). What a run does is the gateway's
(``gateway/cron_jobs.py``); ``nanobot cron`` is ``cli/cron.py``.

Nothing is imported here, so ``nanobot cron ...`` and the CLI's start-up do not load
APScheduler unless a command needs it.
"""
