"""Who a chat is, where it may work, and what a turn that read outside content may not do.

- **Owner chats**: the terminal (``cli:*``), the heartbeat, and private chats with a user in
  ``channels.<name>.owners`` (when that is empty: in ``allowFrom``, ``"*"`` excepted). They
  work in the whole workspace.
- **Member chats**: every other allowed chat (groups, paired users, ``"*"``). Each works in
  its own folder ``chats/<channel>_<chat_id>/`` (``chat_names``) and never sees the owner's files, memory,
  history, inbox or MCP servers. ``agents.overrides[key].trust`` widens or narrows a chat.

A private chat's user is remembered in its session (``peer_id``, ``peer_handle``: what the
platform vouches for, never a display name), written only by the daemon when a private message
arrives, so cron jobs and the heartbeat can tell an owner's Discord DM (whose channel id is not
the user's id) from a group. On Telegram a private chat's id is the user's id. A chat that
changes hands (a Matrix room of two that grows, shrinks back, or has another person in it)
starts over with its new party's trust (``Agent.meet``).

**Taint**: a turn that took in web pages, MCP results, documents, media or forwarded messages
may carry an attacker's instructions. For the rest of that turn it may not change steering
files, cron jobs or pairing, nor write to another chat (``TurnGuard.require_clean``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Container, Iterable, Literal, Mapping

from nanobot.handles import listed
from nanobot.bus import Identity
from nanobot.chat_names import chat_name, parent_chat

if TYPE_CHECKING:
    from nanobot.config import ChannelSection, Config

Trust = Literal["owner", "member"]
OWNER: Trust = "owner"
MEMBER: Trust = "member"

CHATS_DIR = "chats"
# What steers the assistant: in every prompt, run on a schedule, or loaded as code.
STEERING_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "HEARTBEAT.md")
STEERING_DIRS = ("memory", "skills")
OWNER_ONLY_CHANNELS = ("cli", "heartbeat")  # the terminal and the heartbeat act for the owner
API_CHANNEL = "api"  # chats of API keys: api:NAME, or api:NAME:SESSION
# Chats nobody can push a message to (the API answers requests, the terminal may be closed):
# what is sent to them (a cron job's output, a notice) is kept in their history, read there.
HISTORY_CHANNELS = (API_CHANNEL, "cli")

TAINTED = "this turn read external content ({source}); ask the user to confirm in a new message"


def owner_ids(section: ChannelSection | None) -> list[str]:
    """A channel's owners: ``owners``, or when empty the named entries of ``allowFrom``."""
    if section is None:
        return []
    owners = [str(o) for o in section.owners if str(o).strip()]
    return owners or [str(a) for a in section.allow_from if str(a).strip() not in ("", "*")]


class OwnerKeys:
    """The names of the API's owner keys: the API puts the current names in, a turn asks about
    one. Built once and handed to both; a reload replaces the whole set in one step."""

    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()

    def replace(self, names: Iterable[str]) -> None:
        self._names = frozenset(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def chat_trust(config: Config, session_key: str, peer: Identity | None = None,
               api_owners: Container[str] = ()) -> Trust:
    """Owner or member, from the config and the chat's remembered private peer;
    an API chat (``api:NAME[:S]``) is the owner's when NAME is an owner key (``api_owners``). A
    background task's session has the trust of the chat that spawned it."""
    session_key = parent_chat(session_key)
    override = config.agents.overrides.get(session_key)
    if override is not None and override.trust is not None:
        return override.trust
    channel, _, chat_id = session_key.partition(":")
    if channel in OWNER_ONLY_CHANNELS:
        return OWNER
    if channel == API_CHANNEL:
        return OWNER if chat_id.partition(":")[0] in api_owners else MEMBER
    section = config.channels.section(channel)
    if section is None or not section.owners_verified:
        return MEMBER  # email without a trusted receiving server: From is anyone's to write
    if peer is not None:  # who the chat is with, as vouched (a number now another account's is not the owner)
        return OWNER if is_owner(config, channel, peer) else MEMBER
    # Before anyone wrote: a private chat named after an owner (a Telegram id, a number), never a
    # group's or a channel's id however the config lists it.
    return OWNER if any(section.private_chat(owner) == chat_id for owner in owner_ids(section)) else MEMBER


def is_owner(config: Config, channel: str, who: Identity) -> bool:
    """Whether ``who`` is one of ``channel``'s owners, as its platform vouches (an override's
    trust widens a chat, never makes its person an owner)."""
    section = config.channels.section(channel)
    return section is not None and section.owners_verified and listed(owner_ids(section), who)


def chat_scope(config: Config, session_key: str, peer: Identity | None = None,
               api_owners: Container[str] = ()) -> tuple[Trust, Path]:
    """A chat's trust and root: the whole workspace for owner chats, its own folder for members."""
    trust = chat_trust(config, session_key, peer, api_owners)
    root = config.workspace_path
    return trust, root if trust == OWNER else chat_folder(root, parent_chat(session_key))


def chat_folder(workspace: Path, session_key: str) -> Path:
    """A member chat's own folder inside the workspace (one per chat: ``chat_names``)."""
    return workspace / CHATS_DIR / chat_name(session_key)


def quota_holder(session_key: str) -> str:
    """Who a chat's quotas (``gateway.maxCronJobsPerChat``) count for: an API key's sessions
    together (``api:NAME``, whatever ``X-Nanobot-Session`` says); elsewhere the chat itself (a
    private chat is its user; a thread is its channel's: ``slack:C:TS`` counts for ``slack:C``)."""
    channel, _, rest = session_key.partition(":")
    return f"{channel}:{rest.partition(':')[0]}"


def owner_chat(config: Config, heard: Mapping[str, tuple[str, Identity]] | None = None, *,
               notices: bool = False) -> str | None:
    """Where the owner hears from the assistant: ``gateway.heartbeat.to``, else on the first
    enabled channel (Telegram, then Discord, then others) the private chat where an owner last
    wrote (``heard``: ``PairingStore.owner_chats``, checked against today's owners), else the
    one an owner's id names (``ChannelSection.private_chat``). ``notices`` pass over a
    heartbeat.to in the terminal's or an API chat: what is kept there for its reader is in the
    model's history too, and a notice quotes what a member wrote (a job's name)."""
    to = config.gateway.heartbeat.to
    if to and not (notices and to.partition(":")[0] in HISTORY_CHANNELS):
        return to
    for channel in config.channels.enabled_names():
        if (remembered := (heard or {}).get(channel)) and is_owner(config, channel, remembered[1]):
            return f"{channel}:{remembered[0]}"
        section = config.channels.section(channel)
        if section is not None and (named := [c for o in owner_ids(section) if (c := section.private_chat(o))]):
            return f"{channel}:{named[0]}"
    return None


def steering_name(relative: str) -> str | None:
    """The steering file or folder a chat-root-relative path falls in, or None."""
    parts = PurePosixPath(relative).parts
    if not parts:
        return None
    if len(parts) == 1 and parts[0] in STEERING_FILES:
        return parts[0]
    return parts[0] + "/" if parts[0] in STEERING_DIRS else None


@dataclass
class TurnGuard:
    """What one turn has done so far that the trust rules care about (what it read from outside,
    what it sent): a tool context's ``guard``; not to be mixed up with the agent's TurnState."""

    tainted_by: str | None = None  # the first source of external content this turn read
    messages_sent: int = 0

    def taint(self, source: str) -> None:
        if self.tainted_by is None:
            self.tainted_by = source

    def refusal(self, action: str) -> PermissionError | None:
        """Why ``action`` may not happen in this turn, or None when it may."""
        if self.tainted_by is None:
            return None
        return PermissionError(f"{action} refused: " + TAINTED.format(source=self.tainted_by))

    def require_clean(self, action: str) -> None:
        if error := self.refusal(action):
            raise error
