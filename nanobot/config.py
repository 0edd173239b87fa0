"""Configuration: a camelCase JSON file, overridden by ``NANOBOT_*`` environment variables.

pydantic-settings lets a camelCase file silently beat env vars when aliases are used for
validation, so aliases here serve serialization only; the JSON source renames camelCase keys
to field names itself, and the sources are ordered (init, env, file): leftmost wins.
"""

from __future__ import annotations

import json
import functools
import ipaddress
import os
import re
import types
from contextvars import ContextVar
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError,
                      create_model,
                      model_validator)
from pydantic_settings.exceptions import SettingsError
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nanobot.chat_names import parent_chat

ExecutionMode = Literal["tools", "code", "hybrid"]


class ConfigError(Exception):
    """A config problem, already phrased as the one line the user sees."""


class Section(BaseModel):
    """Base of every config section: camelCase on the way out, unknown keys rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CodeRuntime(Section):
    max_memory_mb: int = Field(100, gt=0)
    max_execution_ms: int = Field(30000, gt=0)
    max_tool_calls: int = Field(200, gt=0)
    max_llm_queries: int = Field(20, ge=0)
    max_output_chars: int = Field(20000, gt=0)
    max_program_chars: int = Field(200_000, gt=0)  # longer programs are refused unparsed
    type_check: bool = False
    persist_state: bool = True
    large_input_chars: int = Field(8000, gt=0)


def _check_timezone(name: str | None) -> str | None:
    """An IANA zone name such as "Europe/Berlin"; caught here, not when the gateway schedules."""
    if name is not None:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin' or 'UTC')") \
                from None
    return name


Timezone = Annotated[str, AfterValidator(_check_timezone)]


def _check_http_proxy(url: str | None) -> str | None:
    """The Telegram adapter speaks to HTTP(S) proxies only (aiohttp has no SOCKS)."""
    if url and not url.lower().startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// or https:// proxy URL (SOCKS proxies are not supported)")
    return url


HttpProxy = Annotated[str, AfterValidator(_check_http_proxy)]


def _id_text(value: Any) -> Any:
    """Ids written as JSON numbers (``"allowFrom": [111]``) are ids all the same."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Id = Annotated[str, BeforeValidator(_id_text)]


def address_and_port(entry: str) -> tuple[str, int]:
    """``"192.168.1.10:8123"`` or ``"[fd00::5]:80"`` as (address, port); ValueError otherwise."""
    host, sep, port = entry.strip().rpartition(":")
    try:
        address = str(ipaddress.ip_address(host.strip("[]")))
        number = int(port)
    except ValueError:
        raise ValueError(f"{entry!r} is not ADDRESS:PORT (an IP address, e.g. \"192.168.1.10:8123\")") from None
    if not sep or not 0 < number < 65536:
        raise ValueError(f"{entry!r} needs a port from 1 to 65535, e.g. \"192.168.1.10:8123\"")
    return address, number


def _check_address_and_port(entry: str) -> str:
    address_and_port(entry)
    return entry


AddressAndPort = Annotated[str, AfterValidator(_check_address_and_port)]


class ModelChoice(Section):
    """A model on a provider: an entry of ``agents.models`` or ``fallbacks``."""

    provider: str
    model: str


class TaskLimits(Section):
    """``agents.defaults.tasks``: background tasks started with spawn()."""

    max_per_chat: int = Field(3, gt=0)  # running or queued, per chat
    max_total: int = Field(10, gt=0)  # running or queued, in the whole assistant
    max_minutes: float = Field(30, gt=0)  # a task running longer is stopped, and says so
    max_iterations: int = Field(50, gt=0)  # model calls of a task's turn


class AgentSettings(Section):
    workspace: str = "~/.nanobot/workspace"
    provider: str = "openai"
    model: str = "gpt-4.1-mini"
    max_tokens: int = Field(8192, gt=0)
    # The model server's context window: the prompt is trimmed to contextTokens - maxTokens.
    context_tokens: int = Field(65536, gt=0)
    temperature: float = 0.2
    max_iterations: int = Field(20, gt=0)
    memory_window: int = Field(50, gt=0)
    timezone: Timezone = "UTC"
    execution_mode: ExecutionMode = "code"
    code_runtime: CodeRuntime = CodeRuntime()
    fallbacks: list[ModelChoice] = []  # tried in order when the model fails (429, 5xx, timeout, no connection)
    daily_budget_usd: float | None = Field(None, gt=0)  # model calls stop for the day once spent
    tasks: TaskLimits = TaskLimits()  # background tasks (spawn)
    # What all member chats together may spend in a day (null: half of dailyBudgetUsd), so that
    # members can never spend the owner's share.
    member_daily_budget_usd: float | None = Field(None, gt=0)
    # Photos as image parts: "auto" sends them and, if the model server rejects them, falls
    # back to the file's path and remembers that for the model; "off" never sends them.
    vision: Literal["auto", "on", "off"] = "auto"

    @model_validator(mode="after")
    def _reply_fits_context(self) -> AgentSettings:
        if self.max_tokens >= self.context_tokens:
            raise ValueError(f"maxTokens ({self.max_tokens}) must be below contextTokens ({self.context_tokens}): "
                             "the reply has to fit in the model's context together with the prompt")
        return self


class AgentOverride(Section):
    """Any field of ``defaults``, all optional; keyed by session key."""

    workspace: str | None = None
    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    context_tokens: int | None = None
    temperature: float | None = None
    max_iterations: int | None = None
    memory_window: int | None = None
    timezone: Timezone | None = None
    execution_mode: ExecutionMode | None = None
    code_runtime: CodeRuntime | None = None
    fallbacks: list[ModelChoice] | None = None
    vision: Literal["auto", "on", "off"] | None = None
    # Not fields of defaults: widens a member chat ("owner") or narrows an owner chat ("member");
    # the MCP servers a member chat may use (owner chats reach them all).
    trust: Literal["owner", "member"] | None = None
    mcp_servers: list[str] | None = None


class Agents(Section):
    defaults: AgentSettings = AgentSettings()
    overrides: dict[str, AgentOverride] = {}
    models: dict[str, ModelChoice] = {}  # the choices of /model NAME
    member_models: list[str] = []  # the names of models that member chats may pick (none: the default only)

    @model_validator(mode="after")
    def _member_models_exist(self) -> Agents:
        unknown = [name for name in self.member_models if name not in self.models]
        if unknown:
            raise ValueError(f"memberModels: {', '.join(map(repr, unknown))} not in agents.models")
        return self


class Price(Section):
    input: float = Field(ge=0)  # USD per 1M prompt tokens
    output: float = Field(ge=0)  # USD per 1M completion tokens


class ProviderConfig(Section):
    api_key: str = ""
    api_base: str | None = None
    timeout: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    cooldown_seconds: float = Field(60.0, ge=0)  # after a failure, fallbacks are tried first for this long
    # Tools mode: tell the model the <tool_call>{...}</tool_call> text form (servers without native
    # tool calling); such blocks are accepted from any model either way.
    text_tool_calls: bool = False
    prices: dict[str, Price] = {}  # model name -> price


class ChannelSection(Section):
    """What every channel's section (``channels.<name>``) has; trust, messaging and the gateway
    read only these fields."""

    enabled: bool = False
    allow_from: list[Id] = []
    owners: list[Id] = []
    group_policy: Literal["mention", "open"] = "mention"
    streaming: bool = False  # show the reply as it is written (one message, edited as it grows)

    @property
    def owners_verified(self) -> bool:
        """Whether a sender id here is the platform's word (a bot token's API says who wrote);
        email's From is anyone's to write unless the receiving server vouches for it."""
        return True


class BotChannel(ChannelSection):
    """A built-in chat platform reached with a bot token."""

    token: str = ""
    api_base: str | None = None
    streaming: bool = True


def _check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. \"127.0.0.1:8765\")")
    return value


def listen_address(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:80`` too) as (host, port)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _check_webhook_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be the https:// URL Telegram posts updates to")
    return url


class TelegramWebhook(Section):
    """``channels.telegram.webhook``: Telegram posts updates to ``url``; we serve its path on
    ``listen`` and refuse requests without ``secretToken`` in their header."""

    url: Annotated[str, AfterValidator(_check_webhook_url)]
    listen: Annotated[str, AfterValidator(_check_listen)] = "0.0.0.0:8443"
    # Telegram allows 1-256 of A-Z, a-z, 0-9, _ and -; fewer than 16 is guessable.
    secret_token: str = Field(min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)

    @property
    def path(self) -> str:
        return urlsplit(self.url).path or "/"


class TelegramConfig(BotChannel):
    proxy: HttpProxy | None = None
    webhook: TelegramWebhook | None = None  # absent: one worker long-polls


class DiscordConfig(BotChannel):
    gateway_url: str | None = None


class SlackEvents(Section):
    """``channels.slack.events``: Slack posts events to ``path`` on ``listen`` (any worker),
    each request signed with ``signingSecret``."""

    listen: Annotated[str, AfterValidator(_check_listen)] = "0.0.0.0:3000"
    path: str = Field("/slack/events", pattern=r"^/")

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class SlackConfig(ChannelSection):
    """Slack: Socket Mode with ``appToken`` (one worker holds the connection), or the Events
    API over HTTP (``events`` and ``signingSecret``). ``allowFrom``/``owners``: user ids."""

    bot_token: str = ""
    app_token: str = ""
    signing_secret: str = ""
    events: SlackEvents | None = None
    # "allowlist": in channels, only those in groupAllowFrom, and every message there
    group_policy: Literal["mention", "open", "allowlist"] = "mention"  # type: ignore[assignment]
    group_allow_from: list[Id] = []
    streaming: bool = True
    api_base: str | None = None

    def missing(self) -> list[tuple[str, str]]:
        """(key, why) for what an enabled Slack section lacks."""
        found = [("bot_token", "is empty")] if not self.bot_token.strip() else []
        if self.events is None and not self.app_token.strip():
            found.append(("app_token", "is empty and there is no events section (Socket Mode needs an xapp- token)"))
        if self.events is not None and not self.signing_secret.strip():
            found.append(("signing_secret", "is empty while events is set (every request is verified with it)"))
        return found


class ImapServer(Section):
    host: str = ""
    port: int = Field(993, gt=0, lt=65536)
    username: str = ""
    password: str = ""
    mailbox: str = "INBOX"
    tls: bool = True  # IMAP over TLS from the first byte (993); false: plain, loopback or tests only


class SmtpServer(Section):
    host: str = ""
    port: int = Field(587, gt=0, lt=65536)
    username: str = ""
    password: str = ""
    starttls: bool = True  # upgrade with STARTTLS (587); false: plain, loopback or tests only
    tls: bool = False  # TLS from the first byte (465)


class EmailConfig(ChannelSection):
    """Email: IMAP in (IDLE, else a poll), SMTP out, replies in the thread. Chats are
    ``email:<address>``; an address counts for allowFrom/owners only in mail that
    ``trustedAuthServId``'s Authentication-Results shows as DMARC (or aligned DKIM) pass."""

    address: str = ""
    imap: ImapServer = ImapServer()
    smtp: SmtpServer = SmtpServer()
    trusted_auth_serv_id: str | None = None
    poll_seconds: float = Field(60.0, gt=0)

    @property
    def owners_verified(self) -> bool:
        return bool(self.trusted_auth_serv_id)

    def missing(self) -> list[tuple[str, str]]:
        keys = (("address", self.address), ("imap.host", self.imap.host), ("imap.username", self.imap.username),
                ("smtp.host", self.smtp.host))
        return [(key, "is empty") for key, value in keys if not value.strip()]


class PluginChannelConfig(ChannelSection):
    """The section of a third-party channel: the shared fields, plus the adapter's own keys
    (kept as they are; an adapter with a ``config_model`` validates them in the gateway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


BUILTIN_CHANNELS = ("telegram", "discord", "slack", "email")
LIVE_CHANNELS = ("cli", "api")  # the gateway's own: replies are shown piece by piece as they come
EDIT_EVERY_S = 1.0  # a chat platform's streamed message is edited at most this often


class Channels(Section):
    # Other keys are sections of third-party channels (entry points "nanobot.channels"). A key
    # no installed adapter claims is rejected as unknown, so a typo still fails here.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    __pydantic_extra__: dict[str, PluginChannelConfig] = Field(init=False)

    telegram: TelegramConfig = TelegramConfig()
    discord: DiscordConfig = DiscordConfig()
    slack: SlackConfig = SlackConfig()
    email: EmailConfig = EmailConfig()
    max_media_mb: int = Field(20, gt=0)

    @model_validator(mode="wrap")
    @classmethod
    def _installed_channels_only(cls, data: Any, handler: Any) -> Channels:
        channels = handler(data)
        extra = channels.model_extra or {}
        if extra:
            from importlib.metadata import entry_points

            installed = {ep.name for ep in entry_points(group="nanobot.channels")}
            unknown = [key for key in extra if key not in installed]
            if unknown:  # raised as pydantic's own "extra" error, so load_config names the key
                raise ValidationError.from_exception_data(cls.__name__, [
                    {"type": "extra_forbidden", "loc": (key,), "input": extra[key]} for key in unknown])
        return channels

    def section(self, name: str) -> ChannelSection | None:
        """``channels.<name>``, built-in or third-party; None when the config has none."""
        builtin: dict[str, ChannelSection] = {"telegram": self.telegram, "discord": self.discord,
                                              "slack": self.slack, "email": self.email}
        return builtin.get(name) or (self.model_extra or {}).get(name)

    def streams(self, name: str) -> bool:
        """Whether replies in this channel are shown as they are written (the terminal and the
        API: always; the API sends them only to clients that ask for a stream)."""
        return self.stream_pace(name) is not None

    def stream_pace(self, name: str) -> float | None:
        """How often a reply being written is shown, in seconds (None: not streamed). The
        terminal and the API get each visible piece as it comes (0: at most 50 ms behind the
        model); a chat platform's message is edited about once a second (its rate limits)."""
        if name in LIVE_CHANNELS:
            return 0.0
        section = self.section(name)
        return EDIT_EVERY_S if section is not None and section.streaming else None

    def enabled_names(self) -> list[str]:
        """Names of the channels switched on (``channels.<name>.enabled``), third-party ones included."""
        return [n for n in [*BUILTIN_CHANNELS, *(self.model_extra or {})] if (s := self.section(n)) and s.enabled]


class ExecTool(Section):
    enabled: bool = True
    timeout: int = Field(60, gt=0)
    max_output_chars: int = Field(10000, gt=0)
    # "auto": confine every command (Landlock + seccomp), refuse if this machine cannot;
    # "off": run commands with the daemon's own rights (a warning in the log and in status).
    sandbox: Literal["auto", "off"] = "auto"
    network: bool = False  # let confined commands open sockets
    read_paths: list[str] = []  # more read-only paths for confined commands, besides the system's
    max_memory_mb: int = Field(4096, gt=0)  # address space of each confined process


class WebSearch(Section):
    provider: Literal["duckduckgo", "brave"] = "duckduckgo"
    api_key: str = ""
    max_results: int = Field(5, gt=0)


class WebFetch(Section):
    max_chars: int = Field(50000, gt=0)
    max_bytes: int = Field(5_000_000, gt=0)
    timeout: float = Field(20.0, gt=0)
    # Private addresses web_fetch may reach all the same, each as "ADDRESS:PORT" (a service on
    # your LAN): that address and port only, so a redirect to any other private one is refused.
    allow_private: list[AddressAndPort] = []

    def allowed_private(self) -> frozenset[tuple[str, int]]:
        return frozenset(address_and_port(entry) for entry in self.allow_private)


class Web(Section):
    search: WebSearch = WebSearch()
    fetch: WebFetch = WebFetch()


class McpServer(Section):
    """One MCP server: a command (stdio) or a URL (streamable HTTP, or SSE)."""

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    transport: Literal["stdio", "streamable-http", "sse"] | None = None  # default: from command / url
    enabled: bool = True
    tool_timeout: float = Field(30.0, gt=0)  # a call past it raises TimeoutError (and is cancelled)
    start_timeout: float = Field(30.0, gt=0)  # connecting and listing the tools
    allowed_tools: list[str] | None = None  # the server's own tool names; all when absent
    # "auto": its tools go with every request (native schemas, code stubs) unless all MCP
    # schemas together pass 10% of contextTokens; "onDemand": found through find_tools / tool_help.
    load: Literal["auto", "always", "onDemand"] = "auto"

    @model_validator(mode="after")
    def _one_way_to_reach_it(self) -> McpServer:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either 'command' (a stdio server) or 'url' (an HTTP server), not both or neither")
        if self.transport is None:
            self.transport = "stdio" if self.command else "streamable-http"
        if (self.transport == "stdio") != bool(self.command):
            raise ValueError(f"transport {self.transport!r} needs {'command' if self.transport == 'stdio' else 'url'}")
        return self


class Transcription(Section):
    """Voice notes to text; ``provider`` names a ``providers`` entry (empty: off)."""

    provider: str = ""
    model: str = "whisper-1"
    language: str | None = None  # ISO-639-1 hint, e.g. "de"; None lets the server detect it
    max_seconds: int = Field(600, gt=0)  # longer notes are refused with a reply saying so
    max_mb: int = Field(25, gt=0)  # OpenAI's own upload limit
    timeout: float = Field(120.0, gt=0)


class Tools(Section):
    restrict_to_workspace: bool = True
    max_workspace_mb: int = Field(1024, gt=0)  # what the file tools may fill the workspace up to
    exec: ExecTool = ExecTool()
    web: Web = Web()
    mcp_servers: dict[str, McpServer] = {}
    transcription: Transcription = Transcription()


class Heartbeat(Section):
    enabled: bool = True
    interval_minutes: int = Field(30, gt=0)
    to: str | None = Field(None, pattern=r"^[^:\s]+:\S+$")  # "channel:chat_id"; default: the first owner chat


class Api(Section):
    """The OpenAI-compatible API and the web page on the gateway (nanobot/api/)."""

    enabled: bool = False
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:8765"  # beyond loopback: a key first
    max_body_kb: int = Field(1024, gt=0)
    requests_per_minute: int = Field(60, gt=0)  # per key
    concurrent_turns: int = Field(4, gt=0)  # per key

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class Metrics(Section):
    """Prometheus metrics (and /healthz, /readyz) of this worker (nanobot/metrics.py)."""

    enabled: bool = False
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:9464"

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class Gateway(Section):
    heartbeat: Heartbeat = Heartbeat()
    api: Api = Api()
    metrics: Metrics = Metrics()
    log_format: Literal["text", "json"] = "text"  # json: one object per line (time, level, logger, ...)
    max_concurrent_sessions: int = Field(16, gt=0)
    idle_worker_seconds: float = Field(300.0, gt=0)
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    cron_grace_seconds: int = Field(3600, ge=0)
    max_messages_per_turn: int = Field(20, gt=0)
    max_cron_jobs_per_chat: int = Field(20, gt=0)
    # Workers on one PostgreSQL (database.url): who this one is, and how soon the others take
    # over what a dead one held.
    worker_id: str = Field("", max_length=100)  # "": HOST:PID
    failover_seconds: float = Field(10.0, ge=4.0, le=300.0)


def url_password(url: str) -> str:
    """The password in ``scheme://user:password@host/...``, or ""."""
    credentials = urlsplit(url).netloc.rpartition("@")[0] if "://" in url else ""
    return unquote(credentials.partition(":")[2])


def url_without_password(url: str) -> str:
    """The URL as it may be shown or logged: a password becomes ``***``."""
    password = url_password(url)
    if not password:
        return url
    parts = urlsplit(url)
    user, _, _ = parts.netloc.rpartition("@")[0].partition(":")
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}"))


def _check_database_url(url: str) -> str:
    url = url.strip()
    if url in ("", "sqlite") or urlsplit(url).scheme in ("postgresql", "postgres"):
        return url
    raise ValueError(f"{url_without_password(url)!r} is not a database this nanobot knows: use \"sqlite\" "
                     "(the default) or postgresql://USER:PASSWORD@HOST:PORT/DATABASE")


DatabaseUrl = Annotated[str, AfterValidator(_check_database_url)]


class Database(Section):
    # "" or "sqlite": nanobot.db and JSONL histories in the home (the default). A PostgreSQL URL
    # (any libpq URI; a Unix socket directory as ?host=/path) is for several workers (issue 21).
    url: DatabaseUrl = ""

    @property
    def engine(self) -> Literal["sqlite", "postgresql"]:
        return "sqlite" if self.url in ("", "sqlite") else "postgresql"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# Maps keyed by the user's own names ("telegram:123", "notes", "API_KEY"): their keys stay as written.
_USER_KEYED = ("overrides", "providers", "mcp_servers", "env", "headers", "models", "prices")


def _snake_keys(value: Any, *, keep_keys: bool = False, where: str = "") -> Any:
    """Rename camelCase keys to snake_case, except the user's own keys (see ``_USER_KEYED``).
    A snake_case key is refused: next to its camelCase twin one of them would silently win."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not keep_keys and "_" in key:
                raise ConfigError(f"unknown key '{where}{key}' (keys are camelCase: {to_camel(key)})")
            new_key = key if keep_keys else _snake(key)
            out[new_key] = _snake_keys(item, keep_keys=new_key in _USER_KEYED and not keep_keys,
                                       where=f"{where}{key}.")
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
        provider(("tools", "transcription", "provider"), self.tools.transcription.provider)
        for name in BUILTIN_CHANNELS:
            section = self.channels.section(name)
            if isinstance(section, BotChannel) and section.enabled and not section.token.strip():
                found.append((("channels", name, "token"), f"is empty while channels.{name}.enabled is true"))
            if isinstance(section, (SlackConfig, EmailConfig)) and section.enabled:
                found += [(("channels", name, *key.split(".")), f"{why} while channels.{name}.enabled is true")
                          for key, why in section.missing()]
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


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600), replacing it whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def config_path(explicit: str | Path | None = None) -> tuple[Path, bool]:
    """Where the config lives and whether the user named it (a named file must exist)."""
    if explicit:
        return Path(explicit).expanduser(), True
    if os.environ.get("NANOBOT_CONFIG"):
        return Path(os.environ["NANOBOT_CONFIG"]).expanduser(), True
    return nanobot_home() / "config.json", False


def _read_file(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: config file not found")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"  # json's messages may end in "at": finish the sentence
        what = f"{exc.msg} {where}" if exc.msg.endswith(" at") else f"{exc.msg} at {where}"
        raise ConfigError(f"{path}: invalid JSON: {what[0].lower()}{what[1:]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    try:
        return _snake_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _key_path(loc: tuple[Any, ...]) -> str:
    return ".".join(to_camel(str(p)) if isinstance(p, str) and "_" in str(p) else str(p) for p in loc)


def _env_source(loc: tuple[Any, ...]) -> str | None:
    """The environment variable a bad value came from (env beats the file), if one did."""
    env = {name.upper(): name for name in os.environ}
    parts = [str(p).upper() for p in loc if not isinstance(p, int)]
    for end in range(len(parts), 0, -1):  # NANOBOT_AGENTS__DEFAULTS='{...}' sets a whole section
        name = "NANOBOT_" + "__".join(parts[:end])
        if name in env:
            return f"environment variable {env[name]}"
    return None


# The file's own shape, validated strictly (``true`` is no temperature, ``"yes"`` no boolean);
# environment variables are text by nature and go through Config's usual conversions.
_FileShape = create_model("ConfigFile", __config__=ConfigDict(extra="forbid"),
                          **{name: (field.annotation, field) for name, field in Config.model_fields.items()})


def _bad_value(source: str, loc: tuple[Any, ...], message: str) -> ConfigError:
    return ConfigError(f"{source}: invalid value for '{_key_path(loc)}': {message}")


def _validation_error(exc: ValidationError, path: Path, *, from_file: bool) -> ConfigError:
    err = exc.errors()[0]
    source = str(path) if from_file else _env_source(err["loc"]) or str(path)
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{source}: unknown key '{_key_path(err['loc'])}'")
    return _bad_value(source, err["loc"], err["msg"].removeprefix("Value error, "))


def _env_parse_error(exc: SettingsError) -> ConfigError:
    """pydantic-settings names only the top-level field; find the variable that holds bad JSON
    (a list, a map or a section is read as JSON; a plain value never is)."""
    for name, value in sorted(os.environ.items()):
        parts = name.upper().removeprefix("NANOBOT_").lower().split("__")
        if not name.upper().startswith("NANOBOT_") or not _is_structured(Config, parts):
            continue
        try:
            json.loads(value)
        except ValueError as bad:
            return ConfigError(f"environment variable {name}: invalid JSON ({bad.msg} at column {bad.colno}); "
                               """lists and objects are written as JSON, e.g. '["111"]'""")
    return ConfigError(f"environment: {exc}")


def _is_structured(annotation: Any, parts: list[str]) -> bool:
    """Whether the setting at ``parts`` under ``annotation`` is a list, a map or a section."""
    while get_origin(annotation) in (Union, types.UnionType):  # Optional[X], X | None
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if not parts:
        return get_origin(annotation) in (list, dict) or isinstance(annotation, type) and issubclass(annotation,
                                                                                                     BaseModel)
    if get_origin(annotation) is dict:
        return _is_structured(get_args(annotation)[1], parts[1:])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and parts[0] in annotation.model_fields:
        return _is_structured(annotation.model_fields[parts[0]].annotation, parts[1:])
    return False


def load_config(explicit: str | Path | None = None) -> tuple[Config, Path]:
    """Load and validate; every problem becomes one ConfigError line naming the key and file
    (or environment variable)."""
    path, required = config_path(explicit)
    data = _read_file(path, required)
    try:
        _FileShape.model_validate(data, strict=True)
    except ValidationError as exc:
        raise _validation_error(exc, path, from_file=True) from None
    token = _FILE_DATA.set(data)
    try:
        config = Config()
    except ValidationError as exc:
        raise _validation_error(exc, path, from_file=False) from None
    except SettingsError as exc:
        raise _env_parse_error(exc) from None
    finally:
        _FILE_DATA.reset(token)
    for loc, message in config.problems():
        raise _bad_value(_env_source(loc) or str(path), loc, message)
    config._source = path.resolve()
    return config, path

