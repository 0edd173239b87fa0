"""How the Slack adapter reaches Slack over HTTP: through the proxy the environment names for
the host (honouring ``NO_PROXY``, which slack_sdk ignores), and with the bot token sent to
Slack alone."""

from __future__ import annotations

import urllib.request
from typing import TypeVar
from urllib.parse import urlsplit

import aiohttp

from nanobot.listener import read_whole

FILE_HOSTS = ("files.slack.com",)  # where the bot token may be sent to fetch a file


def token_may_go_to(url: str, api_base: str) -> bool:
    """The bot token goes only to Slack: its file host over https, or the configured API's
    origin (scheme, host and port all the same: another port of that host is another server)."""
    return _origin(url) in {("https", host, 443) for host in FILE_HOSTS} | {_origin(api_base)}


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:  # a port that is not a number
        return ("", None, None)
    return parts.scheme, parts.hostname, port


async def fetch_file(url: str, token: str, limit: int) -> bytes:
    """A file people sent (check ``token_may_go_to`` first), through the environment's proxy."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http, \
            http.get(url, headers=headers, allow_redirects=False, proxy=proxy_for(url)) as response:
        response.raise_for_status()
        return await read_whole(response.content, limit)


def proxy_for(url: str) -> str | None:
    """The proxy for ``url`` from the environment, honouring ``NO_PROXY`` as httpx and aiohttp
    do (slack_sdk reads ``HTTPS_PROXY``/``HTTP_PROXY`` itself and ignores ``NO_PROXY``)."""
    parts = urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


_Client = TypeVar("_Client")


def without_env_proxy(proxy: str | None, client: _Client) -> _Client:
    """``client`` going direct when ``NO_PROXY`` names the host: slack_sdk's constructors take
    the environment's proxy when given none, and have no way to say "direct"."""
    if proxy is None:
        client.proxy = None  # type: ignore[attr-defined]
    return client
