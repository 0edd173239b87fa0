"""Where a job's output goes, checked when the job is made and again when it runs.

Output for a chat the gateway cannot reach would be lost while the run counted as ``ok``, so:
a target on a channel that is not enabled is refused when the job is added, and a run whose
channel is not running records a failed run instead of dropping the output. The terminal's and
the API's chats (``HISTORY_CHANNELS``) are targets like any other: their output is kept in
their history, where ``nanobot agent``, the history endpoint and the page show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanobot.bus import split_target
from nanobot.trust import HISTORY_CHANNELS

if TYPE_CHECKING:
    from nanobot.config import Config


def resolve_target(config: Config, owner_session: str, deliver_to: str | None) -> str | None:
    """The ``deliver_to`` to store (None: the owning chat itself); ValueError when it is nowhere."""
    target = deliver_to or owner_session
    channel, _ = split_target(target)
    if deliver_to is None:
        return None  # the chat the job was made in: a message came from it, so it can be answered
    if channel in HISTORY_CHANNELS:
        return deliver_to  # kept in that chat's history
    enabled = config.channels.enabled_names()
    if channel not in enabled:
        raise ValueError(f"{target}: channel {channel!r} is not enabled (enabled: {', '.join(enabled) or 'none'})")
    return deliver_to
