"""Shared fixtures. Every test gets its own NANOBOT_HOME and workspace under tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nanobot.config import Config


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
