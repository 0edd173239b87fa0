"""The pieces every config section shares: the base class, the one-line error, and the checks of values."""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote, urlsplit, urlunsplit
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel



ExecutionMode = Literal["tools", "code", "hybrid"]


class ConfigError(Exception):
    """A config problem, already phrased as the one line the user sees."""


class Section(BaseModel):
    """Base of every config section: camelCase on the way out, unknown keys rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


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


# Names that stay on this machine or a private network: domains for local use that no public
# DNS has (a Kubernetes service's .svc, .home.arpa, .test, the never delegated .home and .corp),
# or a tailnet's (WireGuard carries it encrypted). Plain HTTP may go there.
NEAR_NAME_SUFFIXES = (".localhost", ".local", ".lan", ".home", ".corp", ".internal", ".home.arpa", ".svc", ".test",
                      ".ts.net")


def is_near(host: str) -> bool:
    """Whether ``host`` is this machine or on a private network: an address that is not global
    (loopback, 10/8, 192.168/16, a tailnet's 100.64/10, fd00::/8), a single-label name (a
    container's), or a name under ``NEAR_NAME_SUFFIXES``."""
    host = host.lower().rstrip(".")
    try:
        return not ipaddress.ip_address(host).is_global
    except ValueError:
        return "." not in host or host.endswith(NEAR_NAME_SUFFIXES)


def plain_and_far(url: str | None) -> str | None:
    """Why nothing secret may go to ``url`` (plain HTTP to a server that is not near), or None."""
    parts = urlsplit((url or "").strip())
    if parts.scheme.lower() in ("http", "ws") and parts.hostname and not is_near(parts.hostname):
        return (f"{url_without_password(url or '')!r} is plain {parts.scheme}: keys and messages sent there would "
                "cross the network unencrypted; use https:// (for a server without TLS: a reverse proxy, an SSH "
                "or WireGuard tunnel, or its private address)")
    return None


def url_trouble(url: str | None) -> str | None:
    """Why ``url`` cannot be a server's address (no scheme or host: "localhost:11434/v1", which
    failed only at the first request; or ``plain_and_far``), or None. Empty is for ``missing``."""
    text = (url or "").strip()
    parts = urlsplit(text)
    if text and (parts.scheme.lower() not in ("http", "https", "ws", "wss") or not parts.hostname):
        return f"{text!r} is not a URL: it starts with https:// or http://" + \
            (f" (http://{text}?)" if "://" not in text else "")
    return plain_and_far(url)


def _a_server(url: str | None) -> str | None:
    if trouble := url_trouble(url):
        raise ValueError(trouble)
    return url.strip() if url else url  # as pasted, with its line end


# The URL of a server that gets a key, a token or the chats (a model server, a chat platform's API).
ServerUrl = Annotated[str, AfterValidator(_a_server)]
# A key or token as pasted (``cat key.txt``, an env file): a line end read with it failed every
# request as a "potential header injection"; none has white space of its own.
Token = Annotated[str, AfterValidator(str.strip)]


def _check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. \"127.0.0.1:8765\")")
    return value


def listen_address(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:80`` too) as (host, port)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
