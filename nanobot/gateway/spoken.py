"""A turn's reply spoken as a voice note after its text (``tools.speech``, ``/voice``).

The text reply always goes first and never waits for speech: the dispatcher records it, then
speaks in the background. The voice note is its own outbox message (durable, sent once, after
the text). A reply too long (``maxChars``), a failed or slow speech call or a spent budget
leaves the text alone, with one log line. The text reply carries ``VOICE_FOLLOWS`` so the API
keeps its request open for the voice note (``voice_follows``); the voice note (or, when none
comes, an empty message that no chat shows) is the turn's last message.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nanobot.agent.commands import is_command
from nanobot.agent.markup import FailedReply
from nanobot.agent.spend import BudgetSpent, metered_speech
from nanobot.bus import InboundMessage, OutboundMessage, OutgoingFile
from nanobot.media.speech import SPOKEN_NAME, SpeechError, speaks, speech_enabled, spoken_text

if TYPE_CHECKING:
    from nanobot.agent.loop import Agent

log = logging.getLogger(__name__)

def will_speak(agent: Agent, msg: InboundMessage, text: str) -> bool:
    """Whether ``msg``'s reply ``text`` is spoken too: a chat message's reply (not a command's,
    not a cron job's, not one saying the turn failed: its words are for reading, HTTP statuses
    and all), by the chat's /voice choice or ``tools.speech.reply``."""
    config = agent.deps.config
    if not speech_enabled(config) or not text.strip() or msg.source == "cron" or is_command(msg.content) \
            or isinstance(text, FailedReply):
        return False  # (every reply passes here: the chat's session is looked at only when speech is on)
    return speaks(config, agent.session(msg.session_key).meta.voice, msg.media)


async def voice_note(agent: Agent, msg: InboundMessage, text: str) -> OutboundMessage:
    """The reply's voice note, or an empty message saying none comes (to close the API's request)."""
    key, limit = msg.session_key, agent.deps.config.tools.speech.max_chars
    words = spoken_text(text)
    audio = None
    if not words or len(words) > limit:
        log.info("%s: the reply is not spoken: %d characters (tools.speech.maxChars: %d)", key, len(words), limit)
    else:
        try:
            audio = await metered_speech(agent.deps, key, words)
        except (SpeechError, BudgetSpent) as exc:
            log.warning("%s: the reply was not spoken: %s", key, exc)
    if audio is None:
        return OutboundMessage(msg.channel, msg.chat_id, "", durable=False, turn_reply=True)
    return OutboundMessage(msg.channel, msg.chat_id, kind="file", turn_reply=True, reply_context=msg.reply_context,
                           file=OutgoingFile(SPOKEN_NAME, audio, photo=False, voice=True))


def voice_wait(agent: Agent) -> float:
    """How long the API waits after a reply for its voice note: the speech call's timeout, and a little."""
    return agent.deps.config.tools.speech.timeout + 5.0
