"""Small builders shared by tests: a config pointed at the fake model server, a runtime."""

from __future__ import annotations

from pathlib import Path

from nanobot.config import Config


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
