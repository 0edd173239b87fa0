"""The prompt texts (``*.md`` here), with ``$name`` slots filled by ``render_prompt``."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from string import Template


@lru_cache(maxsize=None)
def prompt_template(name: str) -> Template:
    return Template(resources.files("nanobot.prompts").joinpath(name).read_text(encoding="utf-8"))


def render_prompt(name: str, **values: object) -> str:
    return prompt_template(name).safe_substitute(**{k: str(v) for k, v in values.items()})
