"""Where a Slack chat is: a DM's channel (``D123``), or a channel's thread
(``C123:1700000000.000100``); and message times (``ts``) in order."""

from __future__ import annotations

from nanobot.bus import OutboundMessage


def ts_order(ts: str) -> tuple[int, ...]:
    """A message's ``ts`` ("1700000000.000100") as something that compares in time order."""
    return tuple(int(part) for part in ts.split(".") if part.isdigit())


def target(chat_id: str) -> tuple[str, str | None]:
    """(channel, thread ts): ``C123:1700000000.000100`` is a thread, ``D123`` a DM."""
    channel, _, thread = chat_id.partition(":")
    return channel, thread or None


def where(msg: OutboundMessage) -> tuple[str, str | None]:
    """Where ``msg`` goes: its chat's channel and thread; in a DM, the thread its question was in."""
    channel, thread = target(msg.chat_id)
    return channel, thread or msg.answers
