"""An album's parts answered as one message.

Telegram sends an album's pictures as messages of their own, a moment apart, each with the
album's id (``InboundMessage.album``; the caption on one of them). Answered one by one, "add up
these three receipts" got three answers, two of them to a picture without words. Each part is
recorded as it comes (from a poll or a webhook alike: a webhook gets one part per request, the
next only once the last was answered); the chat's worker, given a part, waits until its album
has been quiet for ``ALBUM_QUIET_S`` and runs one turn with all of them, and the reply settles
every part in the same commit. After a restart the recorded parts are joined the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from nanobot.bus import InboundMessage

ALBUM_QUIET_S = 1.0  # Telegram sends an album's pictures within a fraction of a second


async def whole_album(first: InboundMessage, queue: asyncio.Queue[InboundMessage],
                      quiet_s: float) -> tuple[InboundMessage, InboundMessage | None]:
    """``first`` with the parts of its album that follow it in ``queue`` joined in; and the
    chat's next message if one was taken off the queue meanwhile (it runs next)."""
    msg = first
    while msg.album is not None:
        try:
            async with asyncio.timeout(quiet_s):
                part = await queue.get()
        except TimeoutError:
            return msg, None
        if (part.album, part.sender_id) != (msg.album, msg.sender_id):
            return msg, part
        msg = joined(msg, part)
    return msg, None


def joined(msg: InboundMessage, part: InboundMessage) -> InboundMessage:
    """One message with both one's files and words; ``part`` is settled with its reply."""
    return replace(msg, content="\n".join(filter(None, [msg.content, part.content])), media=[*msg.media, *part.media],
                   durations={**(msg.durations or {}), **(part.durations or {})} or None,
                   untrusted=msg.untrusted or part.untrusted,
                   joined=[*msg.joined, *part.joined, *([part.intake_id] if part.intake_id is not None else [])])
