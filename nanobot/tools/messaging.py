"""``send_message``: how a turn, a program or a cron job writes to a chat.

Messages go through ``bus.outbound``, so the same call works inside a turn and inside a cron
job run by the gateway. Besides the current chat, only chats the owner has vouched for can
be addressed: a chat id listed in the channel's ``allowFrom`` (or ``"*"``), a paired user's
private chat (on Telegram a private chat's id is the user's id), or a chat that has already
talked to the bot (it has a session file). Anything else is a PermissionError, so a
prompt-injected web page cannot make the bot write to strangers.

Member chats write only to themselves, and a turn that read outside content (a web page, a
document) only to its own chat. At most ``gateway.maxMessagesPerTurn`` messages go out per turn,
each of at most ``MAX_MESSAGE_CHARS`` (``fit_message``; a program's ``final_answer`` too).
"""

from __future__ import annotations

import re
from pathlib import Path

from nanobot.handles import listed
from nanobot.bus import Identity, MessageBus, OutboundMessage, OutgoingFile, split_target
from nanobot.media import MB, kind_of, upload_limit
from nanobot.chat_names import history_file
from nanobot.tools.files import read_checked_bytes
from nanobot.tools.registry import ToolContext, tool
from nanobot.trust import HISTORY_CHANNELS, OWNER
from nanobot.workspace_quota import check_room


# A model writes at most maxTokens, but a program can make a string of any length: "x" * 3_000_000
# was 734 Telegram messages in the chat, and "[" * 3_000_000 also 41 s of the daemon's time to format.
MAX_MESSAGE_CHARS = 50_000


def fit_message(text: str) -> str:
    """``text``, cut at MAX_MESSAGE_CHARS with a note saying so (a long result goes as a file)."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return (text[:MAX_MESSAGE_CHARS] + f"\n\n[… cut here: {len(text) - MAX_MESSAGE_CHARS:,} more characters. "
            "A result this long goes better as a file: write it, then send_file.]")


@tool
async def send_message(ctx: ToolContext, content: str, to: str | None = None) -> str:
    """Send a message now: to this chat, or to another as "channel:chat_id".

    Only chats that may talk to the bot; the turn's reply is sent anyway.
    """
    if not content.strip():
        raise ValueError("send_message: the content is empty")
    channel, chat_id, target = await _checked_target(ctx, to, "send_message")
    await _bus(ctx, "send_message").publish_outbound(OutboundMessage(channel, chat_id, fit_message(content)))
    return f"Message sent to {target}."


@tool(brief=True)
async def send_file(ctx: ToolContext, path: str, caption: str | None = None, to: str | None = None) -> str:
    """Send a file (pictures as photos): to this chat, or to another as "channel:chat_id".

    The same chats as for send_message can be addressed. Make the file first.
    """
    channel, chat_id, target = await _checked_target(ctx, to, "send_file")
    limit = upload_limit(channel)
    data, shown = read_checked_bytes(ctx, path, limit, f"{channel} takes files up to {limit // MB} MB")
    if channel in HISTORY_CHANNELS:  # a copy is kept in the chat's folder (sent/), for its reader to fetch
        check_room(ctx.config.workspace_path, ctx.config.tools.max_workspace_mb, len(data))
    photo = kind_of(shown) == "image"
    await _bus(ctx, "send_file").publish_outbound(OutboundMessage(channel, chat_id, caption or "", kind="file",
                                                                  file=OutgoingFile(Path(shown).name, data, photo)))
    return f"{'Photo' if photo else 'File'} {shown} ({len(data):,} bytes) sent to {target}."


async def _checked_target(ctx: ToolContext, to: str | None, what: str) -> tuple[str, str, str]:
    """(channel, chat_id, target) of a chat this turn may write to, counted against the turn's limit."""
    channel, chat_id, target = await allowed_target(ctx, to, what)
    if target != ctx.session_key and ctx.needs_services(what).terminal:
        raise _no_channels(ctx)
    if target != ctx.session_key and not _enabled(ctx, channel):
        raise RuntimeError(f"{what}: channel {channel!r} is not enabled (channels.{channel}.enabled)")
    count_message(ctx)
    return channel, chat_id, target


async def allowed_target(ctx: ToolContext, to: str | None, what: str) -> tuple[str, str, str]:
    """(channel, chat_id, target): this chat, or another one an owner chat may write to (it
    may talk to the bot) in an untainted turn (``send_message``'s rules; ``schedule_cron`` too)."""
    target = to.strip() if to else ctx.session_key
    channel, chat_id = split_target(target)
    if target != ctx.session_key:
        if ctx.trust != OWNER:
            raise PermissionError(f"{what}: this chat may only send messages to itself")
        ctx.guard.require_clean(f"{what} to {target}")
        await _check_allowed(ctx, channel, chat_id, what)
    return channel, chat_id, target


def _no_channels(ctx: ToolContext) -> RuntimeError:
    """Why this process (``nanobot agent``) cannot send to another chat, and what can."""
    from nanobot.gateway_lock import running_gateway_pid  # an error path: the gateway package is heavy

    pid = running_gateway_pid(ctx.config.home)
    if pid is None:
        return RuntimeError("this terminal session has no chat channels and no gateway is running: messages to "
                            "other chats go out only from the gateway (nanobot gateway)")
    return RuntimeError(f"this terminal session cannot send to other chats: the gateway running on this home "
                        f"(PID {pid}) holds the chat connections, and the terminal cannot hand it messages yet. "
                        "Ask for it in a chat with the bot, or schedule it (schedule_cron) so the gateway sends it")


def _bus(ctx: ToolContext, what: str) -> MessageBus:
    return ctx.needs_services(what).bus


def count_message(ctx: ToolContext) -> None:
    """One more message out this turn, within ``gateway.maxMessagesPerTurn``."""
    limit = ctx.config.gateway.max_messages_per_turn
    if ctx.guard.messages_sent >= limit:
        raise PermissionError(f"at most {limit} messages per turn (gateway.maxMessagesPerTurn); "
                              "put the rest into the reply")
    ctx.guard.messages_sent += 1


async def _check_allowed(ctx: ToolContext, channel: str, chat_id: str, what: str) -> None:
    section = ctx.config.channels.section(channel)
    if section and listed(section.let_in, Identity(chat_id)):
        return
    if await _paired(ctx, channel, chat_id) or await _has_talked(ctx, f"{channel}:{chat_id}"):
        return
    raise PermissionError(
        f"{what}: {channel}:{chat_id} is not a chat I may write to (it is not this chat, not in "
        f"channels.{channel}.allowFrom, not a paired user, and has never talked to me)")


def _enabled(ctx: ToolContext, channel: str) -> bool:
    section = ctx.config.channels.section(channel)
    return bool(section and section.enabled)


async def _paired(ctx: ToolContext, channel: str, chat_id: str) -> bool:
    return ctx.services is not None and await ctx.services.pairing.is_paired(channel, chat_id)


async def _has_talked(ctx: ToolContext, target: str) -> bool:
    # Only plain ids: a target is CHANNEL:CHAT_ID, nothing a path or a shell would read otherwise.
    if not re.fullmatch(r"[\w.-]+:[\w.-]+", target):
        return False
    if ctx.services is not None:
        return await ctx.services.sessions.exists(target)
    return (ctx.config.home / "sessions" / history_file(target)).exists()


MESSAGING_TOOLS = [send_message, send_file]
