"""Telegram's updates read one at a time.

python-telegram-bot's ``get_updates`` reads a batch whole: one update it cannot read (a newer
Bot API's shape: a field it requires that Telegram does not send, or the other way round)
failed every poll for ever, the same batch each time, with the batch's messages in the log at
CRITICAL, and a webhook refused such an update each time Telegram tried it again. Here each
update is read on its own: one that cannot be is passed over, named in the log by its id, and
the batch is confirmed past it, so the messages behind it are answered.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from telegram import Bot, Update
from telegram.warnings import PTBUserWarning

from nanobot_channels.telegram_http import READ_TIMEOUT

log = logging.getLogger(__name__)

ALLOWED_UPDATES = ["message", "callback_query"]  # a button under an answer pressed (TelegramChannel._pressed)
# PTB asks for get_updates instead of the raw call: that is the call whose batch fails whole.
warnings.filterwarnings("ignore", message=r"Please use 'Bot\.getUpdates'", category=PTBUserWarning)


def readable(data: Any, bot: Bot) -> Update | None:
    """``data`` as an Update, or None (logged by its id, not its content) if PTB cannot read it."""
    try:
        return Update.de_json(data, bot)
    except Exception as exc:  # whatever the library's constructors raise for a shape they do not know
        update_id = data.get("update_id") if isinstance(data, dict) else None
        log.warning("telegram: passed over update %s, which python-telegram-bot cannot read (%s: %.200s)",
                    update_id, type(exc).__name__, exc)
        return None


async def fetch_updates(bot: Bot, offset: int | None, timeout: int,
                        read_timeout: float = READ_TIMEOUT) -> tuple[list[Update], int | None]:
    """The readable updates from ``offset`` on (a long poll of ``timeout`` seconds, answered
    within ``read_timeout``), and the offset that confirms the whole batch, unreadable ones
    included (None: there were none)."""
    asked = {"timeout": timeout, "allowed_updates": ALLOWED_UPDATES, **({} if offset is None else {"offset": offset})}
    batch = await bot.do_api_request("getUpdates", api_kwargs=asked, read_timeout=read_timeout)
    ids = [item["update_id"] for item in batch if isinstance(item, dict) and isinstance(item.get("update_id"), int)]
    updates = [update for update in (readable(item, bot) for item in batch) if update is not None]
    return updates, max(ids) + 1 if ids else None
