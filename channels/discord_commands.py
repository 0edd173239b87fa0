"""Discord's slash commands: the chat commands in the menu Discord shows when "/" is typed.

They are the application's global commands, put at each connection where they differ (Discord
limits how often commands are created). A command is taken as the message it stands for
(``/model gpt-5``), in the chat it was typed in, from its user as Discord vouches for them, and
addressed to the bot. Its answer takes the place of the "thinking…" Discord shows meanwhile:
a follow-up on the interaction's token, which any worker can send within the 15 minutes the
token holds; later it is posted as a message. Commands work where messages do, a server's
channels and the DM with the bot; one typed in someone else's DM (where a user installed the
app) is refused, as that chat is not the bot's. An answer that offers what to pick (a bare
``/model``) has buttons; a press is taken as that command typed, as a slash command is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import discord

from nanobot.chat_commands import COMMANDS, as_chat_message, choices, picked, shown

log = logging.getLogger(__name__)

GUILD, BOT_DM = 0, 1  # Discord's interaction contexts: a server's channel, the DM with the bot
ONLY_HERE = "I take commands in a server's channels and in our direct messages."


def command_payloads() -> list[dict[str, Any]]:
    """The chat commands as Discord's application commands (with one optional argument where
    the command takes one; its choices offered where they are few)."""
    return [{"name": name, "type": 1, "description": what[:100], "contexts": [GUILD, BOT_DM],
             "integration_types": [0], "options": [_option(name, arguments)] if arguments else []}
            for name, arguments, what in COMMANDS]


def _option(name: str, arguments: str) -> dict[str, Any]:
    option: dict[str, Any] = {"type": 3, "name": "argument", "description": arguments, "required": False}
    if words := choices(f"/{name}"):  # [tools|code|hybrid|default]; not [NAME|default]
        option["choices"] = [{"name": word, "value": word} for word in words]
    return option


async def register(client: discord.Client) -> None:
    """Our commands as the application's, unless they are already (a failure is logged: the
    commands typed as text work all the same)."""
    application, ours = client.application_id, command_payloads()
    try:
        if application is None or [_shape(c) for c in await client.http.get_global_commands(application)] \
                == [_shape(c) for c in ours]:
            return
        await client.http.bulk_upsert_global_commands(application, ours)
        log.info("discord: registered the chat commands as slash commands")
    except discord.HTTPException as exc:
        log.warning("discord: could not register the slash commands: %s", exc)


def _shape(command: Any) -> tuple[Any, ...]:
    return (command.get("name"), command.get("description"), command.get("contexts"),
            [(o.get("name"), o.get("description"), o.get("choices")) for o in command.get("options") or []])


def as_message(interaction: discord.Interaction) -> str | None:
    """The chat message a slash command, or a press of one of our buttons, stands for; None
    where it may not be taken, "" for a press of something no answer offers."""
    if interaction.guild_id is None and not interaction.context.dm_channel:
        return None
    data: dict[str, Any] = dict(interaction.data or {})
    if interaction.type is discord.InteractionType.component:
        return picked(str(data.get("custom_id") or ""))
    words = " ".join(str(option.get("value", "")) for option in data.get("options") or [])
    return as_chat_message(str(data.get("name", "")), words)


def pick_buttons(offer: Sequence[str]) -> dict[str, discord.ui.View]:
    """What an answer offers as buttons (``view=``; none when nothing fits Discord's limits: five
    rows of five, 80-character labels, 100-character ids). The view is stopped before it is sent,
    so discord.py keeps nothing of it: a press comes to ``on_interaction`` like a slash command."""
    if not (picks := shown(offer, most=25, label_chars=80, sends_bytes=100)):
        return {}
    view = discord.ui.View()
    for i, (word, sends) in enumerate(picks):
        view.add_item(discord.ui.Button(label=word, custom_id=sends, row=i // 5))
    view.stop()
    return {"view": view}


async def answer(client: discord.Client, token: str, text: str, mentions: discord.AllowedMentions,
                 **view: discord.ui.View) -> bool:
    """``text`` in place of the interaction's "thinking…"; False when its token is gone."""
    if client.application_id is None:
        return False
    try:
        await discord.Webhook.partial(client.application_id, token, client=client).send(
            text, allowed_mentions=mentions, suppress_embeds=True, wait=True, **view)
        return True
    except discord.HTTPException as exc:  # 401/404 after 15 minutes: posted instead
        log.info("discord: the slash command's answer went as a message (%s)", exc)
        return False
