"""``channels``: one typed section per built-in channel, and what a plugin channel's may hold."""

from __future__ import annotations

import re
from urllib.parse import urlsplit
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from nanobot.config.base import HttpProxy, Id, Section, ServerUrl, Token, _check_listen, is_near, listen_address


# What a platform names a sender by, where a config entry of another shape would match nobody.
_ID_OR_USERNAME = re.compile(r"\d+|@?[A-Za-z0-9_.]+")  # Telegram's and Discord's (a group's id is negative)
_SLACK_USER = re.compile(r"[UW][A-Z0-9]+")
_SLACK_CHANNEL = re.compile(r"[CG][A-Z0-9]+")
_MATRIX_USER = re.compile(r"@[^:\s]+:\S+")
_PHONE_PUNCTUATION = re.compile(r"[\s().-]")
_BSUID = re.compile(r"[A-Z]{2}\.(?:ENT\.)?[A-Za-z0-9]+")  # WhatsApp's business-scoped user id (US.1349…)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _all_like(entries: list[str], shape: re.Pattern[str], what: str) -> list[str]:
    """``entries`` (trimmed) if each is "*" or has ``shape``; ValueError naming the first that is not ``what``."""
    entries = [entry.strip() for entry in entries]
    for entry in entries:
        if entry != "*" and not shape.fullmatch(entry):
            raise ValueError(f"{entry!r} is not {what}")
    return entries


def _phone(entry: str, *, plus: bool = False, other: str) -> str:
    """A phone number as the platforms write it ("+15550002222"; with ``plus``, its "+" is
    required: Signal's are), or "*"; ValueError otherwise, naming the ``other`` kind of entry."""
    number = _PHONE_PUNCTUATION.sub("", entry)
    if number != "*" and not (number.removeprefix("+").isdigit() and (number.startswith("+") or not plus)):
        raise ValueError(f"{entry!r} is not a phone number with its country code (+15550001111) or {other}")
    return number


class ChannelSection(Section):
    """What every channel's section (``channels.<name>``) has; trust, messaging and the gateway
    read only these fields."""

    enabled: bool = False
    allow_from: list[Id] = []
    owners: list[Id] = []
    group_policy: Literal["mention", "open"] = "mention"
    # Group messages not for the bot kept (the latest so many of a chat, in the delivery store,
    # at most 3 days) to go with the next one that is: "@bot what do you think?" after a discussion. 0: none.
    group_history: int = Field(20, ge=0, le=200)
    streaming: bool = False  # show the reply as it is written (one message, edited as it grows)

    @property
    def let_in(self) -> list[str]:
        """Who may talk (besides paired users): ``allowFrom``, and the owners, who were not let in
        when a one-person set-up listed its owner in ``owners`` alone."""
        return [*self.allow_from, *self.owners]

    @property
    def owners_verified(self) -> bool:
        """Whether a sender id here is the platform's word (a bot token's API says who wrote);
        email's From is anyone's to write unless the receiving server vouches for it."""
        return True

    def missing(self) -> list[tuple[str, str]]:
        """(key, why) for what this section lacks while it is enabled (a built-in's required keys)."""
        return []

    def private_chat(self, user_id: str) -> str | None:
        """The id of a user's private chat where the platform names it after its user (Telegram,
        WhatsApp, a Signal number, a vouched-for address); else None: it is learnt when they write."""
        return None


class BotChannel(ChannelSection):
    """A built-in chat platform reached with a bot token."""

    token: Token = ""
    api_base: ServerUrl | None = None
    streaming: bool = True

    @field_validator("allow_from", "owners")
    @classmethod
    def _ids_or_usernames(cls, entries: list[str]) -> list[str]:
        return _all_like(entries, _ID_OR_USERNAME, "a user id or a username (a group's id, a phone number, an "
                                                   "old-style name#1234 or a display name never names a sender "
                                                   "here; to trust a whole group: agents.overrides)")

    def missing(self) -> list[tuple[str, str]]:
        return [("token", "is empty")] if not self.token.strip() else []


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

    def private_chat(self, user_id: str) -> str | None:
        return user_id if user_id.isdigit() else None  # not an @username


class DiscordConfig(BotChannel):
    gateway_url: ServerUrl | None = None


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

    bot_token: Token = ""
    app_token: Token = ""
    signing_secret: Token = ""
    events: SlackEvents | None = None
    # "allowlist": in channels, only those in groupAllowFrom, and every message there
    group_policy: Literal["mention", "open", "allowlist"] = "mention"  # type: ignore[assignment]
    group_allow_from: list[Id] = []
    streaming: bool = True
    api_base: ServerUrl | None = None

    @field_validator("allow_from", "owners")
    @classmethod
    def _user_ids(cls, entries: list[str]) -> list[str]:
        return _all_like(entries, _SLACK_USER, "a Slack user id (U…: a profile's ⋮ menu, Copy member ID)")

    @field_validator("group_allow_from")
    @classmethod
    def _channel_ids(cls, entries: list[str]) -> list[str]:
        return _all_like(entries, _SLACK_CHANNEL, "a Slack channel id (C…: at the bottom of the channel's details)")

    def missing(self) -> list[tuple[str, str]]:
        found = [("bot_token", "is empty")] if not self.bot_token.strip() else []
        if self.events is None and not self.app_token.strip():
            found.append(("app_token", "is empty and there is no events section (Socket Mode needs an xapp- token)"))
        if self.events is not None and not self.signing_secret.strip():
            found.append(("signing_secret", "is empty while events is set (every request is verified with it)"))
        return found


def _plain_only_when_near(plain: bool, info: ValidationInfo) -> None:
    host = info.data.get("host") or ""
    if plain and host and not is_near(host):
        raise ValueError(f"false: the password and every mail would cross the network to {host} unencrypted "
                         "(plain is for a server on this machine or a private network)")


class ImapServer(Section):
    host: str = ""
    port: int = Field(993, gt=0, lt=65536)
    username: str = ""
    password: str = ""
    mailbox: str = "INBOX"
    tls: bool = True  # IMAP over TLS from the first byte (993); false: plain, a near server's only

    @field_validator("tls")
    @classmethod
    def _encrypted_when_far(cls, tls: bool, info: ValidationInfo) -> bool:
        _plain_only_when_near(not tls, info)
        return tls


class SmtpServer(Section):
    host: str = ""
    port: int = Field(587, gt=0, lt=65536)
    username: str = ""
    password: str = ""
    tls: bool = False  # TLS from the first byte (465)
    starttls: bool = True  # upgrade with STARTTLS (587); false (and tls false): plain, a near server's only

    @field_validator("starttls")
    @classmethod
    def _encrypted_when_far(cls, starttls: bool, info: ValidationInfo) -> bool:
        _plain_only_when_near(not starttls and not info.data.get("tls"), info)
        return starttls


class EmailConfig(ChannelSection):
    """Email: IMAP in (IDLE, else a poll), SMTP out, replies in the thread. Chats are
    ``email:<address>``; an address counts for allowFrom/owners only in mail that
    ``trustedAuthServId``'s Authentication-Results shows as DMARC (or aligned DKIM) pass."""

    address: str = ""
    imap: ImapServer = ImapServer()
    smtp: SmtpServer = SmtpServer()
    trusted_auth_serv_id: str | None = None
    poll_seconds: float = Field(60.0, gt=0)

    @field_validator("allow_from", "owners")
    @classmethod
    def _as_senders_are_read(cls, addresses: list[str]) -> list[str]:
        """Lower case, as the adapter reads a sender: "Ada@Example.org" was never admitted."""
        return [address.strip().lower() for address in addresses]

    @property
    def owners_verified(self) -> bool:
        return bool(self.trusted_auth_serv_id)

    def private_chat(self, user_id: str) -> str | None:
        return user_id if self.owners_verified and "@" in user_id.lstrip("@") else None

    def missing(self) -> list[tuple[str, str]]:
        keys = (("address", self.address), ("imap.host", self.imap.host), ("imap.username", self.imap.username),
                ("smtp.host", self.smtp.host))
        return [(key, "is empty") for key, value in keys if not value.strip()]


class MatrixConfig(ChannelSection):
    """Matrix: one account on ``homeserver`` (its ``accessToken``, or ``password`` to log in).
    ``allowFrom``/``owners``: Matrix user ids (``@ada:example.org``)."""

    homeserver: ServerUrl = ""
    user_id: str = ""
    access_token: Token = ""
    password: str = ""
    device_id: str = ""  # kept across restarts with a password login (one device, not one per start)
    streaming: bool = True
    encryption: bool = True  # read and answer end-to-end encrypted rooms (one gateway: its keys live in its home)

    @field_validator("allow_from", "owners")
    @classmethod
    def _user_ids(cls, entries: list[str]) -> list[str]:
        return _all_like(entries, _MATRIX_USER, "a Matrix user id (@ada:example.org)")

    def missing(self) -> list[tuple[str, str]]:
        found = [(key, "is empty") for key, value in (("homeserver", self.homeserver), ("user_id", self.user_id))
                 if not value.strip()]
        if not self.access_token.strip() and not self.password:  # the password first: a device of its own
            found.append(("password", "is empty and there is no accessToken to sign in with"))
        return found


class WhatsAppWebhook(Section):
    """``channels.whatsapp.webhook``: Meta posts messages to ``path`` on ``listen``."""

    listen: Annotated[str, AfterValidator(_check_listen)] = "0.0.0.0:8444"
    path: str = Field("/whatsapp", pattern=r"^/")

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class WhatsAppConfig(ChannelSection):
    """WhatsApp through the Cloud API: Meta's webhook in (signed with ``appSecret``), the Graph
    API out. ``allowFrom``/``owners``: wa_ids (the phone number, digits only), or business-scoped
    user ids (``US.1349…``: how Meta names a user who hides their number behind a username)."""

    phone_number_id: str = ""
    access_token: Token = ""
    app_secret: Token = ""
    verify_token: Token = ""
    webhook: WhatsAppWebhook = WhatsAppWebhook()
    api_base: ServerUrl = "https://graph.facebook.com/v21.0"

    @field_validator("allow_from", "owners")
    @classmethod
    def _as_meta_names_senders(cls, entries: list[str]) -> list[str]:
        """wa_ids: "+1 555-000-2222" is 15550002222 (Meta's name for a sender has no "+"); a BSUID as it is."""
        return [entry.strip() if _BSUID.fullmatch(entry.strip()) else
                _phone(entry, other="a business-scoped user id (US.1349…)").removeprefix("+") for entry in entries]

    def private_chat(self, user_id: str) -> str | None:
        return user_id if user_id.isdigit() or _BSUID.fullmatch(user_id) else None

    def missing(self) -> list[tuple[str, str]]:
        keys = (("phone_number_id", self.phone_number_id), ("access_token", self.access_token),
                ("app_secret", self.app_secret), ("verify_token", self.verify_token))
        return [(key, "is empty") for key, value in keys if not value.strip()]


class SignalConfig(ChannelSection):
    """Signal through a ``signal-cli daemon --http`` at ``rpcUrl`` for ``account``.
    ``allowFrom``/``owners``: phone numbers (``+15550001111``) or Signal's account UUIDs."""

    account: str = ""
    rpc_url: ServerUrl = "http://127.0.0.1:8080"
    attachments_dir: str = "~/.local/share/signal-cli/attachments"  # what it received (read without following links)

    @field_validator("allow_from", "owners")
    @classmethod
    def _as_signal_cli_names_senders(cls, entries: list[str]) -> list[str]:
        """"+1 555 000 2222" is +15550002222; a UUID is in lower case."""
        return [entry.strip().lower() if _UUID.fullmatch(entry.strip()) else _phone(entry, plus=True, other="an account UUID")
                for entry in entries]

    @field_validator("account")
    @classmethod
    def _as_signal_cli_names_it(cls, account: str) -> str:
        """The bot's number as signal-cli writes it ("+1 555 000 1111" is +15550001111): its own
        messages and mentions of it are told by it."""
        number = _PHONE_PUNCTUATION.sub("", account)
        if number and not (number.startswith("+") and number[1:].isdigit()):
            raise ValueError(f"{account!r} is not a phone number with its country code (+15550001111)")
        return number

    def private_chat(self, user_id: str) -> str | None:
        return user_id if user_id.startswith("+") and user_id[1:].isdigit() else None  # not a UUID

    def daemon_command(self) -> str:  # what serves rpcUrl for account: said where nothing answers there
        return f"signal-cli -a {self.account} daemon --http {urlsplit(self.rpc_url).netloc} --receive-mode on-connection"

    def missing(self) -> list[tuple[str, str]]:
        return [("account", "is empty")] if not self.account.strip() else []


class PluginChannelConfig(ChannelSection):
    """The section of a third-party channel: the shared fields, plus the adapter's own keys
    (kept as they are; an adapter with a ``config_model`` validates them in the gateway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


BUILTIN_CHANNELS = ("telegram", "discord", "slack", "email", "matrix", "whatsapp", "signal")
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
    matrix: MatrixConfig = MatrixConfig()
    whatsapp: WhatsAppConfig = WhatsAppConfig()
    signal: SignalConfig = SignalConfig()
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
        if name in BUILTIN_CHANNELS:
            return getattr(self, name)
        return (self.model_extra or {}).get(name)

    def stream_pace(self, name: str, edit_every_s: float = EDIT_EVERY_S) -> float | None:
        """How often a reply being written is shown, in seconds (None: not streamed). The
        terminal and the API get each visible piece as it comes (0: at most 50 ms behind the
        model); a chat platform's message is edited about once a second (its rate limits)."""
        if name in LIVE_CHANNELS:
            return 0.0
        section = self.section(name)
        return edit_every_s if section is not None and section.streaming else None

    def enabled_names(self) -> list[str]:
        """Names of the channels switched on (``channels.<name>.enabled``), third-party ones included."""
        return [n for n in [*BUILTIN_CHANNELS, *(self.model_extra or {})] if (s := self.section(n)) and s.enabled]
