"""Configuration: a camelCase JSON file, overridden by ``NANOBOT_*`` environment variables.

pydantic-settings lets a camelCase file silently beat env vars when aliases are used for
validation, so aliases here serve serialization only; the JSON source renames camelCase keys
to field names itself, and the sources are ordered (init, env, file): leftmost wins.

The sections, one module each: ``base`` (Section, ConfigError, value checks),
``agent_settings``, ``channel_settings``, ``tool_settings``, ``gateway_settings``; ``root``
(Config, the home) and ``loading`` (load_config). Everything is importable from here.
"""

from nanobot.config.base import (AddressAndPort, ConfigError, ExecutionMode, HttpProxy, Id, Section, Timezone,
    address_and_port, listen_address, url_password, url_without_password)
from nanobot.config.agent_settings import (AgentOverride, AgentSettings, Agents, CodeRuntime, ModelChoice, Price,
    ProviderConfig, TaskLimits)
from nanobot.config.channel_settings import (BUILTIN_CHANNELS, BotChannel, ChannelSection, Channels, DiscordConfig,
    EDIT_EVERY_S, EmailConfig, ImapServer, LIVE_CHANNELS, MatrixConfig, PluginChannelConfig, SignalConfig, SlackConfig,
    SlackEvents, SmtpServer, TelegramConfig, TelegramWebhook, WhatsAppConfig, WhatsAppWebhook)
from nanobot.config.tool_settings import (ExecTool, McpServer, Tools, Transcription, Web, WebFetch, WebSearch)
from nanobot.config.gateway_settings import (Api, Database, DatabaseUrl, Gateway, Heartbeat, Metrics)
from nanobot.config.root import (Config, nanobot_home, own_account, private_dir, write_private)
from nanobot.config.loading import (config_path, defaults_and_environment, load_config)

__all__ = ["AddressAndPort", "ConfigError", "ExecutionMode", "HttpProxy", "Id", "Section", "Timezone",
           "address_and_port", "listen_address", "url_password", "url_without_password", "AgentOverride",
           "AgentSettings", "Agents", "CodeRuntime", "ModelChoice", "Price", "ProviderConfig", "TaskLimits",
           "BUILTIN_CHANNELS", "BotChannel", "ChannelSection", "Channels", "DiscordConfig", "EDIT_EVERY_S",
           "EmailConfig", "ImapServer", "LIVE_CHANNELS", "MatrixConfig", "PluginChannelConfig", "SignalConfig", "SlackConfig",
           "SlackEvents", "SmtpServer", "TelegramConfig", "TelegramWebhook", "WhatsAppConfig", "WhatsAppWebhook", "ExecTool", "McpServer", "Tools", "Transcription",
           "Web", "WebFetch", "WebSearch", "Api", "Database", "DatabaseUrl", "Gateway", "Heartbeat", "Metrics",
           "Config", "nanobot_home", "own_account", "private_dir", "write_private", "config_path", "defaults_and_environment", "load_config"]
