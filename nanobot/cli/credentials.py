"""One call per platform (a chat channel's, a model server's): whether it takes the credentials.

``onboard`` makes it after the questions, ``status --check`` for each server the config names.
A refusal (a mistyped token, a wrong password) raises ``Refused`` (onboard asks again); no
answer (offline, a firewall, signal-cli not started yet) raises ``NoAnswer`` (said, and the
answers kept). Each call only reads: it keeps no connection, makes no device and changes
nothing on the platform. What is said names no secret (a token sits in Telegram's URLs, so no
URL of one is ever shown), and no redirect is followed with a token.
"""

from __future__ import annotations

import http.client
import imaplib
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from nanobot.config import ChannelSection
from nanobot.config.slack_app import lacking_scopes

TIMEOUT_S = 15
OPENAI = "https://api.openai.com/v1"  # a provider's apiBase when it names none
# The platforms' public APIs where the section names none (the adapters' defaults too, which
# nanobot does not import: tests/test_cli.py checks they are the same).
PUBLIC_API = {"telegram": "https://api.telegram.org", "discord": "https://discord.com/api/v10",
              "slack": "https://slack.com/api/"}

MESSAGE_CONTENT_ON = 1 << 18 | 1 << 19  # a Discord application's flags: the intent on (100 servers and more, fewer)


class Refused(Exception):
    """The platform answered, and said no: the message says what it said; ``key`` is the
    section's key it refused (asking again for anything else would not help)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class NoAnswer(Exception):
    """No answer came (offline, a firewall, a refused connection, a bad certificate, another
    server there): nothing is known of the credentials."""


def check(name: str, section: ChannelSection) -> str:
    """One line on what the platform said of ``section``'s credentials; ``Refused`` if it said
    no, ``NoAnswer`` if it said nothing."""
    try:
        return CHECKS[name](section)
    except OSError as exc:  # the IMAP login's socket (the HTTP calls say NoAnswer themselves)
        raise NoAnswer(str(exc)) from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the answer is the redirect itself: urllib would send the token on to any host


_OPENER = urllib.request.build_opener(_NoRedirect)


def served_models(base: str, key: str) -> list[str]:
    """The model ids the model server lists (``GET /models`` through the SDK the turns use);
    ``Refused`` when it answers an error (a wrong key, a wrong URL), ``NoAnswer`` when it does
    not (said as a turn would say it: a refused certificate, an unreachable host)."""
    import openai

    from nanobot.providers.openai_provider import classify_error

    client = openai.OpenAI(base_url=base, api_key=key or "none", max_retries=0, timeout=TIMEOUT_S)
    try:
        return sorted(m.id for m in client.models.list())
    except openai.APIStatusError as exc:
        where = base.rstrip("/")  # Ollama, vLLM and llama.cpp serve it under /v1
        v1 = exc.status_code == 404 and not where.endswith("/v1")
        body = exc.body if isinstance(exc.body, dict) else {}
        raise Refused(f"The server answered {exc.status_code}: {body.get('message') or exc.message}. Check the URL"
                      f"{f' (the API is usually under /v1: {where}/v1)' if v1 else ''} and key", "api_key") from None
    except openai.APIError as exc:  # "Connection error." would hide why
        raise NoAnswer(classify_error(exc)[0]) from None
    finally:
        client.close()


def _call(url: str, *, token: str = "", scheme: str = "Bearer", post: bool = False, json_body: Any = None,
          timeout_s: float = TIMEOUT_S) -> tuple[int, dict[str, Any], Mapping[str, str]]:
    """The status, JSON body ({} if none) and headers of one request (a POST with ``post`` or a
    ``json_body``); ``NoAnswer`` when none came."""
    sent = {"Authorization": f"{scheme} {token}"} if token else {}
    data = b"" if post else None
    if json_body is not None:
        data, sent["Content-Type"] = json.dumps(json_body).encode(), "application/json"
    request = urllib.request.Request(url, data=data, headers=sent)
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            status, body, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        status, body, headers = exc.code, exc.read(), exc.headers
    except (OSError, http.client.HTTPException) as exc:  # unreachable, a timeout, a bad certificate, not HTTP
        raise NoAnswer(getattr(exc, "reason", exc)) from None
    try:
        found = json.loads(body or b"{}")
    except ValueError:
        found = {}  # a page of another server, say: its status tells
    return status, found if isinstance(found, dict) else {}, headers


def _answer(url: str, refused: str = "", key: str = "", **call: Any) -> dict[str, Any]:
    return _answered(url, refused, key, **call)[0]


def _answered(url: str, refused: str = "", key: str = "", *, refusals: tuple[int, ...] = (401,),
              **auth: Any) -> tuple[dict[str, Any], Mapping[str, str]]:
    """The body of a 200 and its headers; ``Refused`` (``refused``, and what the platform said,
    of ``key``) on a refusal's status; any other status is the platform's trouble, not the
    credentials'."""
    status, body, headers = _call(url, **auth)
    said = body.get("description") or body.get("message") or body.get("error") or f"HTTP {status}"
    said = said.get("message") if isinstance(said, dict) else said  # the Graph API's error object
    if status in refusals:
        raise Refused(f"{refused}: {said}", key)
    if status != 200:
        raise NoAnswer(said)
    return body, headers


def _base(name: str, section: Any) -> str:
    return (section.api_base or PUBLIC_API[name]).rstrip("/")


def _telegram(section: Any) -> str:
    me = _answer(f"{_base('telegram', section)}/bot{section.token}/getMe",
                 "Telegram refused the token", "token", refusals=(401, 404), post=True)  # 404: not a token's shape
    return f"Telegram knows the token: the bot is @{(me.get('result') or {}).get('username')}."


def telegram_senders(section: Any, wait_s: float = 120) -> Iterator[tuple[str, str]]:
    """The id and name of each person who writes to the bot in private, for ``wait_s`` (Telegram
    shows nobody their own id). A message is marked read only by the poll after it, so the one
    taken stays for the gateway to answer. Ends early when the messages cannot be read (a
    gateway already polls with this token, or Telegram does not answer)."""
    url, offset = f"{_base('telegram', section)}/bot{section.token}/getUpdates", 0
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        poll = {"offset": offset, "timeout": int(min(left, 30)), "allowed_updates": ["message"]}
        try:
            updates = _answer(url, json_body=poll, timeout_s=45).get("result") or []
        except NoAnswer:
            return
        for update in updates:
            offset = max(offset, int(update.get("update_id", 0)) + 1)
            message = update.get("message") or {}
            person = message.get("from") or {}
            if (message.get("chat") or {}).get("type") == "private" and person.get("id"):
                name = " ".join(filter(None, (person.get("first_name"), person.get("last_name"))))
                yield str(person["id"]), name + (f" (@{person['username']})" if person.get("username") else "")


def _discord(section: Any) -> str:
    """The bot's user, then its application's flags: whether the Message Content intent is on
    (without it the gateway cannot connect; a setting in the Developer Portal, not the token)."""
    base = _base("discord", section)
    me = _answer(f"{base}/users/@me", "Discord refused the token", "token", token=section.token, scheme="Bot")
    flags = int(_answer(f"{base}/oauth2/applications/@me", token=section.token, scheme="Bot").get("flags") or 0)
    off = "" if flags & MESSAGE_CONTENT_ON else (" Its Message Content intent is off: switch it on (Developer Portal, "
                                                 "the app, Bot, Privileged Gateway Intents), or it cannot connect.")
    return f"Discord knows the token: the bot is {me.get('username')}.{off}"


def _slack(section: Any) -> str:
    """auth.test with the bot token; with Socket Mode's app-level token, the address of a
    connection (which lapses unused). Slack answers 200 with ``ok`` false and an error code."""
    base = _base("slack", section)
    me, headers = _answered(f"{base}/auth.test", token=section.bot_token, post=True)
    if not me.get("ok"):
        raise Refused(f"Slack refused the bot token: {me.get('error')}", "bot_token")
    if section.app_token:
        socket = _answer(f"{base}/apps.connections.open", token=section.app_token, post=True)
        if not socket.get("ok"):
            raise Refused(f"Slack refused the app-level token: {socket.get('error')} (it needs connections:write)",
                          "app_token")
    lacking = lacking_scopes(headers)  # an app made by hand, or before a scope was added
    return (f"Slack knows the tokens: the bot is {me.get('user')} in {me.get('team') or me.get('team_id')}."
            + (f" The bot token lacks {', '.join(lacking)}: add them to the app and reinstall it." if lacking else ""))


def _matrix(section: Any) -> str:
    base = f"{section.homeserver.rstrip('/')}/_matrix/client"
    if not section.access_token:  # a password signs in at start, as a device: none is made here
        flows = [flow.get("type") for flow in _answer(f"{base}/v3/login", refusals=()).get("flows") or []
                 if isinstance(flow, dict)]
        if "m.login.password" in flows:
            return "The homeserver takes a password login; the bot signs in when the gateway starts."
        return (f"The homeserver takes no password login (only {', '.join(map(str, flows)) or 'none'}): give the "
                "bot an access token instead, channels.matrix.accessToken (and deviceId) in the config file.")
    me = _answer(f"{base}/v3/account/whoami", "The homeserver refused the access token", "access_token",
                 refusals=(401, 403), token=section.access_token)
    if me.get("user_id") != section.user_id:
        raise Refused(f"The access token is {me.get('user_id')}'s, not {section.user_id}'s", "user_id")
    return f"The homeserver knows the token: {section.user_id}."


def _signal(section: Any) -> str:
    try:
        _answer(f"{section.rpc_url.rstrip('/')}/api/v1/check", refusals=())  # what the gateway asks at start
    except NoAnswer as exc:
        raise NoAnswer(f"{exc}; start it with: {section.daemon_command()}") from None
    return f"signal-cli answers at {section.rpc_url}."


def _email(section: Any) -> str:
    """A login to the IMAP server, which reads the mail (the same password sends it)."""
    server = section.imap
    try:
        imap = imaplib.IMAP4_SSL(server.host, server.port, ssl_context=ssl.create_default_context(),
                                 timeout=TIMEOUT_S) if server.tls else imaplib.IMAP4(server.host, server.port,
                                                                                      timeout=TIMEOUT_S)
    except imaplib.IMAP4.error as exc:  # a greeting of another server
        raise NoAnswer(f"{server.host}:{server.port}: {exc}") from None
    try:
        imap.login(server.username, server.password)
    except imaplib.IMAP4.abort as exc:
        raise NoAnswer(f"{server.host}:{server.port}: {exc}") from None
    except imaplib.IMAP4.error as exc:
        said = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise Refused(f"The IMAP server refused the login as {server.username}: {said}", "password") from None
    finally:
        imap.shutdown()
    return f"The IMAP server took the login as {server.username}."


def _whatsapp(section: Any) -> str:
    number = _answer(f"{section.api_base.rstrip('/')}/{quote(section.phone_number_id)}"
                     "?fields=display_phone_number", "The Graph API refused", "access_token", refusals=(400, 401, 403),
                     token=section.access_token)  # 400: a token or a phone number id it does not know
    return f"The Graph API knows the token and the number: {number.get('display_phone_number') or number.get('id')}."


CHECKS: dict[str, Callable[[Any], str]] = {"telegram": _telegram, "discord": _discord, "slack": _slack,
                                           "matrix": _matrix, "signal": _signal, "email": _email,
                                           "whatsapp": _whatsapp}
