"""👀 on the message the bot is answering, while it works: Slack shows no typing indicator for
a bot, so without it a turn of half a minute (a program running, a long answer before its first
words) looked like nobody heard. Put where the gateway's typing indicator would show (a turn
that lasts), taken off when the answer goes out. It needs the ``reactions:write`` scope:
without it there is none, said once in the log. Kept in memory on the worker that took the
message in (best effort, like a typing indicator: a restart forgets it).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

WORKING = "eyes"
NO_SCOPE = ("missing_scope", "not_allowed_token_type", "no_permission")


class WorkingMarks:
    """The mark of each chat: on its latest message taken in, while its turn lasts."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.allowed = True  # until Slack says the app may not react
        self._heard: dict[str, tuple[str, str]] = {}  # chat -> (channel, ts) of its latest message taken in
        self._marked: dict[str, tuple[str, str]] = {}  # chat -> the message that carries the mark now

    def heard(self, chat_id: str, channel: str, ts: str) -> None:
        self._heard[chat_id] = (channel, ts)

    async def working(self, chat_id: str) -> None:
        """The chat's turn goes on: its latest message gets the mark, unless one carries it still
        (a message that came during a turn waits for its own: the chat's turns go one by one)."""
        if chat_id in self._marked:
            return
        message = self._heard.pop(chat_id, None)
        if message is not None and self.allowed and await self._react("reactions_add", message):
            self._marked[chat_id] = message

    async def answered(self, chat_id: str) -> None:
        if (message := self._marked.pop(chat_id, None)) is not None:
            await self._react("reactions_remove", message)

    async def _react(self, method: str, message: tuple[str, str]) -> bool:
        channel, ts = message
        try:
            await getattr(self.client, method)(channel=channel, timestamp=ts, name=WORKING)
            return True
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in NO_SCOPE:
                self.allowed = False
                log.info("slack: no 👀 on messages being answered: the app lacks the reactions:write scope")
            else:
                log.debug("slack: %s on %s failed: %s", method, channel, error)
            return error == "already_reacted"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.debug("slack: %s on %s failed: %r", method, channel, exc)
            return False
