"""Small builders shared by tests: a config pointed at the fake model server, a runtime."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from nanobot.config import Config
from tests import cli_zygote

if TYPE_CHECKING:
    from nanobot.cron.service import CronService
    from nanobot.cron.store import CronJob
    from nanobot.delivery.intake import DurableIntake
    from nanobot.gateway import Gateway
    from nanobot.gateway.app import Pace


def kept_about(obj: Any, needle: str) -> list[str]:
    """The dicts and sets of ``obj``, and of our objects it holds, with a key naming ``needle``:
    what a long-lived part still keeps of a chat (months of chats pass through it)."""
    found = []
    for name, value in vars(obj).items():
        ours = type(value).__module__.startswith("nanobot") and hasattr(value, "__dict__")  # nanobot_channels too
        for where, held in [(name, value), *((f"{name}.{n}", v) for n, v in (vars(value).items() if ours else ()))]:
            if isinstance(held, (dict, set)) and any(needle in str(key) for key in held):
                found.append(where)
    return found


async def until(condition: Callable[[], Any], timeout: float = 30.0) -> None:
    """Wait for what another task, process or the database makes true and no stand-in request
    marks: ``condition`` (awaited if it is async) is looked at every 20 ms."""
    async with asyncio.timeout(timeout):
        while True:
            done = condition()
            if inspect.isawaitable(done):
                done = await done
            if done:
                return
            await asyncio.sleep(0.02)


def keep_discord_urls(monkeypatch) -> None:
    """discord.py keeps its URLs process-wide and the adapter points them at the stand-in: put
    them back after the test."""
    from discord.gateway import DiscordWebSocket
    from discord.http import Route

    monkeypatch.setattr(Route, "BASE", Route.BASE)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)


# A reply that every chat platform shows in two parts (each under its length limit): sent with
# ``parts_sent=1``, as an attempt after one that got part one out, only "B-PART ..." shows.
TWO_PARTS = "A-PART " + "x" * 2500 + "\n\nB-PART " + "y" * 2500

def fast_pace(**changes: Any) -> "Pace":
    """The gateway's waits for tests: short polls against the stand-ins, quick retries, API keys
    made or revoked and users approved by a test counted at once."""
    from nanobot.gateway.app import Pace

    adapters = {"telegram": {"poll_timeout": 1.0, "poll_interval": 0.01, "poll_backoff_max": 0.05},
                "discord": {"guild_ready_timeout": 0.01, "retry_delays": (0.01,)}}
    return Pace(**{"send_retry": (0.01, 0.05), "key_refresh_s": 0.0, "welcome_s": 0.05, "adapters": adapters,
                   **changes})


@asynccontextmanager
async def recorded_intake() -> AsyncIterator["DurableIntake"]:
    """The gateway's intake on a throwaway database, for a channel tested alone: admitted
    messages are recorded (repeats dropped), then reach ``intake.bus.inbound``."""
    from nanobot.bus import MessageBus
    from nanobot.database import SqliteDatabase
    from nanobot.delivery.intake import DurableIntake
    from nanobot.delivery.store import DeliveryStore

    db = await SqliteDatabase.open(":memory:")
    store = DeliveryStore(db, None)
    try:
        await store.migrate()
        yield DurableIntake(store, MessageBus())
    finally:
        await store.close()
        await db.close()


def config_for(llm_base_url: str, workspace: Path, *, mode: str = "tools", **defaults) -> Config:
    cfg = Config()
    cfg.agents.defaults.workspace = str(workspace)
    cfg.agents.defaults.execution_mode = mode
    cfg.agents.defaults.model = "fake-model"
    for key, value in defaults.items():
        setattr(cfg.agents.defaults, key, value)
    cfg.providers["openai"].api_base = llm_base_url
    cfg.providers["openai"].api_key = "test-key"
    return cfg


def telegram_gateway_config(llm_base_url: str, workspace: Path, tg, *allowed: int, mode: str = "tools") -> Config:
    """A gateway config with the stand-in Telegram on, ``allowed`` users admitted, no heartbeat."""
    cfg = config_for(llm_base_url, workspace, mode=mode)
    t = cfg.channels.telegram
    t.enabled, t.token, t.api_base, t.allow_from = True, tg.token, tg.api_base, [str(a) for a in allowed]
    cfg.gateway.heartbeat.enabled = False
    return cfg


@asynccontextmanager
async def running_gateway(config: Config, *, with_services: bool = False,
                          pace: "Pace | None" = None) -> AsyncIterator["Gateway"]:
    """A started in-process gateway (channels, dispatcher; cron and heartbeat with
    ``with_services``), at the tests' pace (``fast_pace``) unless told another."""
    from nanobot.gateway import Gateway
    from nanobot.runtime import open_runtime

    async with open_runtime(config) as rt:
        gateway = Gateway(rt, pace=pace or fast_pace(), with_services=with_services)
        try:
            await gateway.start()
            yield gateway
        finally:
            await gateway.stop()


@asynccontextmanager
async def nanobot_process(*args: str, home: Path, env: dict[str, str] | None = None,
                          **streams) -> AsyncIterator[asyncio.subprocess.Process]:
    """``nanobot ARGS`` as a process of its own with ``NANOBOT_HOME=home``; killed on the way out if
    the test has not ended it. ``streams``: stdin/stdout/stderr as for create_subprocess_exec.
    Forked from a process that has imported nanobot already (tests/cli_zygote.py), unless ``env``
    sets what only a fresh interpreter reads (``PYTHON*``)."""
    whole_env = {**os.environ, "NANOBOT_HOME": str(home), **(env or {})}
    if any(name.startswith("PYTHON") for name in env or {}):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", *args, env=whole_env, **streams)
    else:
        proc = await cli_zygote.start(list(args), whole_env, **streams)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def add_cron_job(service: "CronService", **job: Any) -> "CronJob":
    """A job made as the cron tools and ``nanobot cron add`` make one, and the clock told to look now."""
    from nanobot.cron.service import create_job

    made = await create_job(service.store, timezone=job.pop("timezone", service.timezone), **job)
    service.requests.asked.set()
    return made
