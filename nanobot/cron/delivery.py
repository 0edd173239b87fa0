"""Where a job's output goes, checked when the job is made and again when it runs.

Output for a chat the gateway cannot reach would be lost while the run counted as ``ok``, so:
a job made in the terminal (``cli:*``, which the gateway has no way to print to) delivers to
the owner's chat; a target on a channel that is not enabled is refused when the job is added;
and a run whose channel is not running records a failed run instead of dropping the output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanobot.bus import split_target
from nanobot.trust import owner_chat

if TYPE_CHECKING:
    from nanobot.config import Config


def resolve_target(config: Config, owner_session: str, deliver_to: str | None,
                   naming: str = "--to CHANNEL:CHAT_ID") -> str | None:
    """The ``deliver_to`` to store (None: the owning chat itself); ValueError when it is nowhere
    (``naming``: how the caller names a chat, a CLI flag or a function's argument)."""
    target = deliver_to or owner_session
    channel, _ = split_target(target)
    if channel == "cli":
        if deliver_to:
            raise ValueError(f"{target}: the terminal is not a chat the gateway can deliver to; "
                             "use a chat such as telegram:123456")
        owner = owner_chat(config)
        if owner is None:
            raise ValueError("a job made in the terminal delivers to the owner's chat, and there is none: set "
                             f"channels.<name>.owners (or allowFrom), or name the chat with {naming}")
        return owner
    if deliver_to is None:
        return None  # the chat the job was made in: a message came from it, so its channel runs
    enabled = config.channels.enabled_names()
    if channel not in enabled:
        raise ValueError(f"{target}: channel {channel!r} is not enabled (enabled: {', '.join(enabled) or 'none'})")
    return deliver_to
