"""``Config``: the whole file, its sources in order (init, env, file: leftmost wins), and the home."""

from __future__ import annotations

import json
import functools
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nanobot.chat_names import parent_chat
from nanobot.config.agent_settings import AgentSettings, Agents, ProviderConfig
from nanobot.config.base import ConfigError
from nanobot.config.channel_settings import (BUILTIN_CHANNELS, LIVE_CHANNELS, ChannelSection, Channels, EmailConfig,
                                              MatrixConfig, SignalConfig)
from nanobot.config.gateway_settings import Database, Gateway
from nanobot.config.tool_settings import Tools


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# Maps keyed by the user's own names ("telegram:123", "notes", "API_KEY"): their keys stay as written.
_USER_KEYED = ("overrides", "providers", "mcp_servers", "env", "headers", "models", "prices")
_VERBATIM = ("extra_body",)  # another API's fields, sent as written (reasoning_effort), however deep


def _snake_keys(value: Any, *, keep_keys: bool = False, where: str = "") -> Any:
    """Rename camelCase keys to snake_case, except the user's own keys (see ``_USER_KEYED``).
    A snake_case key is refused: next to its camelCase twin one of them would silently win."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not keep_keys and "_" in key:
                raise ConfigError(f"unknown key '{where}{key}' (keys are camelCase: {to_camel(key)})")
            new_key = key if keep_keys else _snake(key)
            out[new_key] = item if new_key in _VERBATIM and not keep_keys else \
                _snake_keys(item, keep_keys=new_key in _USER_KEYED and not keep_keys, where=f"{where}{key}.")
        return out
    return value


class _JsonFileSource(PydanticBaseSettingsSource):
    """Reads the config file, renaming camelCase keys so env vars can beat them on merge."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


class Config(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NANOBOT_",
        env_nested_delimiter="__",
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_by_alias=False,
        validate_by_name=True,
    )

    agents: Agents = Agents()
    providers: dict[str, ProviderConfig] = {"openai": ProviderConfig()}
    channels: Channels = Channels()
    # NANOBOT_HOME as it was when the config was made (the CLI's entry), or the Runtime's home:
    # everything below reads it here, so a runtime built with another home guards that one.
    _home: Path = PrivateAttr(default_factory=lambda: nanobot_home())
    _source: Path | None = PrivateAttr(None)  # the file it was loaded from (None: built in code)
    tools: Tools = Tools()
    gateway: Gateway = Gateway()
    database: Database = Database()

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        return (init_settings, env_settings, _JsonFileSource(settings_cls, _FILE_DATA.get()))

    def problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """What refers to something that is not there, as (key path, why): a provider no entry
        of ``providers`` defines (the first call or failover would fail), a channel switched
        on without its token (it would retry forever)."""
        found: list[tuple[tuple[Any, ...], str]] = []
        known = ", ".join(self.providers) or "none"

        def provider(loc: tuple[Any, ...], name: str | None) -> None:
            if name and name not in self.providers:
                found.append((loc, f"names provider {name!r}, which is not in providers ({known})"))

        provider(("agents", "defaults", "provider"), self.agents.defaults.provider)
        for i, choice in enumerate(self.agents.defaults.fallbacks):
            provider(("agents", "defaults", "fallbacks", i, "provider"), choice.provider)
        for key, choice in self.agents.models.items():
            provider(("agents", "models", key, "provider"), choice.provider)
        for key, override in self.agents.overrides.items():
            provider(("agents", "overrides", key, "provider"), override.provider)
            for i, choice in enumerate(override.fallbacks or []):
                provider(("agents", "overrides", key, "fallbacks", i, "provider"), choice.provider)
            found += [(("agents", "overrides", key, "mcpServers"), f"names MCP server {name!r}, which is not in "
                       f"tools.mcpServers ({', '.join(self.tools.mcp_servers) or 'none'})")
                      for name in override.mcp_servers or [] if name not in self.tools.mcp_servers]
        heartbeat, live = self.gateway.heartbeat, [*self.channels.enabled_names(), *LIVE_CHANNELS]
        if heartbeat.enabled and heartbeat.to and (channel := heartbeat.to.partition(":")[0]) not in live:
            found.append((("gateway", "heartbeat", "to"), f"names channel {channel!r}, which is not enabled "
                          f"(enabled: {', '.join(live)})"))
        provider(("tools", "transcription", "provider"), self.tools.transcription.provider)
        provider(("tools", "speech", "provider"), self.tools.speech.provider)
        for name in BUILTIN_CHANNELS:
            section = self.channels.section(name)
            if section is not None and section.enabled:
                found += [(("channels", name, *key.split(".")), f"{why} while channels.{name}.enabled is true")
                          for key, why in section.missing()]
        channels = self.channels  # the bot on its owner's account (``own_account``)
        for name, key, section in (("signal", "account", channels.signal), ("email", "address", channels.email),
                                   ("matrix", "userId", channels.matrix)):
            if (own := own_account(section)) and own in (*section.allow_from, *section.owners):
                found.append((("channels", name, key), f"{own} is also in allowFrom or owners: the bot never "
                              "reads its own messages; give it an account of its own"))
        return found

    # ---- derived values -------------------------------------------------------------
    @property
    def workspace_path(self) -> Path:
        """The workspace; a path under ``~/.nanobot`` follows NANOBOT_HOME when that is set, and a
        relative path is relative to NANOBOT_HOME (not to wherever the command was started)."""
        return _resolve_workspace(self.agents.defaults.workspace, self._home)

    @property
    def home(self) -> Path:
        """The nanobot home (config, database, histories): never reachable by the agent's tools."""
        return self._home

    def use_home(self, home: Path) -> None:
        self._home = home

    @property
    def source(self) -> Path | None:
        """The config file this was loaded from, resolved (``nanobot agent`` checks that a
        running gateway uses the same one before it hands it a message)."""
        return self._source

    def agent_for(self, session_key: str) -> AgentSettings:
        """The agent settings for one session: defaults with its chat's override applied (a
        background task has its chat's, with ``tasks.maxIterations`` model calls)."""
        chat = parent_chat(session_key)
        override = self.agents.overrides.get(chat)
        settings = self.agents.defaults if override is None else self.agents.defaults.model_copy(
            update=override.model_dump(exclude_none=True, exclude={"trust", "mcp_servers"}))
        if chat != session_key:
            settings = settings.model_copy(update={"max_iterations": settings.tasks.max_iterations})
        return settings

    def chat_model(self, session_key: str, choice: str | None = None, *, member: bool = False) -> tuple[str, str]:
        """(provider, model) for a chat: its /model ``choice`` (a name in agents.models; for a
        ``member`` chat only one of agents.memberModels), else agents.overrides, else agents.defaults."""
        chosen = self.agents.models.get(choice or "")
        if chosen is not None and (not member or choice in self.agents.member_models):
            return chosen.provider, chosen.model
        settings = self.agent_for(session_key)
        return settings.provider, settings.model

    def member_budget_usd(self) -> float | None:
        """What member chats together may spend today: memberDailyBudgetUsd, else half the budget."""
        defaults = self.agents.defaults
        if defaults.member_daily_budget_usd is not None:
            return defaults.member_daily_budget_usd
        return defaults.daily_budget_usd / 2 if defaults.daily_budget_usd is not None else None

    def models_in_use(self) -> list[tuple[str, str]]:
        """(provider, model) of each model the daemon may call, once each: the default's and its
        fallbacks first, then the overrides', the /model choices, transcription's and speech's."""
        chats = [self.agents.defaults, *(self.agent_for(key) for key in self.agents.overrides)]
        used = [pair for chat in chats for pair in [(chat.provider, chat.model), *chat.fallback_models()]]
        used += [(choice.provider, choice.model) for choice in self.agents.models.values()]
        used += [(tool.provider, tool.model) for tool in (self.tools.transcription, self.tools.speech) if tool.provider]
        return list(dict.fromkeys(used))

    def unpriced_models(self) -> list[str]:
        """``provider/model`` of each model in use with no ``providers.<name>.prices`` entry: its
        calls cost 0 to the daily budgets."""
        return [f"{provider}/{model}" for provider, model in self.models_in_use()
                if provider in self.providers and model not in self.providers[provider].prices]

    def provider_config(self, name: str | None = None) -> ProviderConfig:
        name = name or self.agents.defaults.provider
        try:
            return self.providers[name]
        except KeyError:
            raise ConfigError(f"agents.defaults.provider: no provider named {name!r} in providers") from None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), indent=2) + "\n"


# pydantic-settings builds its sources from the class, not the call, so the file's data is
# handed to the source here, for the duration of one load_config() call.
_FILE_DATA: ContextVar[dict[str, Any]] = ContextVar("nanobot_config_file_data", default={})


@functools.lru_cache(maxsize=64)


def _resolve_workspace(raw: str, home: Path) -> Path:
    """Cached: every turn asks, and resolving walks the path on disk."""
    if raw == "~/.nanobot" or raw.startswith("~/.nanobot/"):
        return (home / raw[len("~/.nanobot"):].lstrip("/")).resolve()
    return (home / Path(raw).expanduser()).resolve()


def nanobot_home() -> Path:
    return Path(os.environ.get("NANOBOT_HOME", "~/.nanobot")).expanduser()


def private_dir(path: Path) -> Path:
    """Create ``path`` (0700): the home holds API keys, tokens and every chat's history."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def own_account(section: ChannelSection) -> str:
    """The bot's own account where its section names one (Signal's number, the mailbox, the
    Matrix user), else "". Not its owner's: on their account it would never read their messages
    (they are its own), and would read, and answer as them, what others send them."""
    if isinstance(section, SignalConfig):
        return section.account
    if isinstance(section, MatrixConfig):
        return section.user_id
    return section.address.lower() if isinstance(section, EmailConfig) else ""


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600), replacing it whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
