"""Shared fixtures. Every test gets its own NANOBOT_HOME and workspace under tmp_path."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import tempfile
from pathlib import Path

from typing import Any, AsyncIterator, Callable

import pytest

from nanobot import eventloop
from nanobot.config import Config
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.postgres import pg_server, pg_url  # noqa: F401  (fixtures)
from tests.fakes.telegram_api import FakeTelegram


ASYNC_MARGIN_S = 10.0  # an async test is stopped this long before pytest-timeout's limit (at most half of it)


def pytest_configure(config: pytest.Config) -> None:
    """The hundreds of Python processes the tests start (gateways, CLIs, MCP servers) compile
    their modules once, not each time: where PYTHONDONTWRITEBYTECODE is set (CI images set it),
    the bytecode goes to a cache outside the tree instead of nowhere (about 20 s of CPU a run here)."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "nanobot-tests-pycache"))
        sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An async test that hangs fails with the stack of the await it hangs on: its coroutine is
    cancelled a little before pytest-timeout's limit. That one's thread method (the only one
    that works on uvloop) ends the whole process, which under xdist loses the stack and can
    leave the run hanging until CI kills it."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        test = getattr(item, "obj", None)
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(test):
            marker = item.get_closest_marker("timeout")
            limit = float(marker.args[0]) if marker and marker.args else default
            if limit > 0:  # 0: no limit
                item.obj = _within(test, limit - min(ASYNC_MARGIN_S, limit / 2))


def _within(test: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.wait_for(test(*args, **kwargs), seconds)

    return bounded


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("NANOBOT_HOME", str(home))
    for key in list(os.environ):
        if key.startswith("NANOBOT_") and key != "NANOBOT_HOME":
            monkeypatch.delenv(key)
    return home


@pytest.fixture
def home(_isolated_home: Path) -> Path:
    return _isolated_home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def config(workspace: Path) -> Config:
    cfg = Config()
    cfg.agents.defaults.workspace = str(workspace)
    return cfg


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    """The scripted OpenAI-compatible model server on loopback."""
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The stand-in Telegram Bot API on loopback."""
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    """The stand-in Discord gateway and REST API on loopback."""
    async with FakeDiscord() as fake:
        yield fake


@pytest.fixture(scope="session")
def event_loop_policy():
    """The loop the gateway runs on (uvloop where installed), for the in-process tests too."""
    return eventloop.policy()
