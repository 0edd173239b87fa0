"""Telegram albums: pictures sent together arrive as updates of their own, a moment apart, each
with the album's ``media_group_id`` (the caption on one of them). Answered one by one, "add up
these three receipts" got three answers, two of them to a picture without words.

While polling, a batch whose last message belongs to an album is read again after a short wait
(``ALBUM_WAIT_S``): unconfirmed, it comes back whole with whatever arrived meanwhile, until it
stops growing. The album's admitted messages then become one message: all the files, the
words of each, the first one's delivery key (a batch read again after a crash joins the same
way, so the repeat is dropped). With a webhook each update is posted alone: the pictures are
then answered one by one.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Sequence

from telegram import Bot, Update

from nanobot.bus import InboundMessage
from nanobot_channels.telegram_updates import fetch_updates

ALBUM_WAIT_S = 1.0  # Telegram posts an album's pictures within a fraction of a second
ALBUM_MAX = 10  # pictures in an album: as many waits at the most


async def with_whole_albums(bot: Bot, updates: Sequence[Update], confirms: int | None,
                            wait_s: float = ALBUM_WAIT_S) -> tuple[Sequence[Update], int | None]:
    """``updates`` read again, after a wait, while the last of them belongs to an album that may
    still be growing (``offset`` at the first: nothing is confirmed); with the offset that
    confirms them (``fetch_updates``)."""
    for _ in range(ALBUM_MAX):
        last = updates[-1].message
        if last is None or last.media_group_id is None:
            break
        await asyncio.sleep(wait_s)
        again, then = await fetch_updates(bot, updates[0].update_id, 0)
        if len(again) <= len(updates):
            break
        updates, confirms = again, then
    return updates, confirms


def albums_joined(messages: list[InboundMessage], updates: Sequence[Update]) -> list[InboundMessage]:
    """``messages`` (admitted from ``updates``) with each album's in a row joined into one."""
    album_of = {str(u.update_id): u.message.media_group_id for u in updates if u.message is not None}
    joined: list[InboundMessage] = []
    for msg in messages:
        album, last = album_of.get(str(msg.delivery_key)), joined[-1] if joined else None
        if album and last is not None and last.chat_id == msg.chat_id and album_of.get(str(last.delivery_key)) == album:
            joined[-1] = replace(last, content="\n".join(filter(None, [last.content, msg.content])),
                                 media=[*last.media, *msg.media], durations={**(last.durations or {}),
                                                                             **(msg.durations or {})} or None,
                                 untrusted=last.untrusted or msg.untrusted)
        else:
            joined.append(msg)
    return joined
