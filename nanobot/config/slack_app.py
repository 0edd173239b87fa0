"""What the Slack app must grant the bot token: the scopes the adapter uses, read against what
Slack says a token has (the adapter's start and ``onboard``'s check both say what is lacking)."""

from __future__ import annotations

from collections.abc import Mapping

# docs/slack-app-manifest.json grants them (a test checks the two agree). An app made by hand,
# or before one was added, lacks it until reinstalled.
SCOPES = ("app_mentions:read", "channels:history", "chat:write", "commands", "files:read", "files:write",
          "groups:history", "im:history", "im:write", "reactions:write")


def lacking_scopes(headers: Mapping[str, str]) -> list[str]:
    """The scopes the bot token lacks, read off the X-OAuth-Scopes header Slack sends with each
    Web API answer ([] when there is none: a server that does not say)."""
    granted = next((value for name, value in headers.items() if name.lower() == "x-oauth-scopes"), None)
    have = {scope.strip() for scope in (granted or "").split(",")}
    return [scope for scope in SCOPES if scope not in have] if granted is not None else []
