"""Shared fixtures. Every test gets its own NANOBOT_HOME and workspace under tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

from typing import AsyncIterator

import pytest

from nanobot import eventloop
from nanobot.config import Config
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.postgres import pg_server, pg_url  # noqa: F401  (fixtures)
from tests.fakes.telegram_api import FakeTelegram


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
