"""What a Telegram message says, where it is, what it answers, and where its answer goes.

A group with topics holds many conversations: each topic is its own chat here,
``telegram:<group id>:<topic id>``, with its own history, answered in its topic (every topic was
one chat, and the answers went to the group's General topic). In a group the answer is a reply
to the question (``reply_context``), so a busy group sees which one it answers.
"""

from __future__ import annotations

from typing import Any

from telegram import Message, ReplyParameters

from nanobot.bus import OutboundMessage
from nanobot.message_context import shared_contact, shared_place, shared_poll


def words_of(message: Message) -> str:
    """Its text or caption; a shared place, contact or poll as words the model can use."""
    spot, venue, card, poll = message.location, message.venue, message.contact, message.poll
    if card:  # a card or a poll has no text of its own
        return shared_contact(" ".join(filter(None, (card.first_name, card.last_name))), [card.phone_number])
    if poll:
        return shared_poll(poll.question, [option.text for option in poll.options])
    return message.text or message.caption or (shared_place(spot.latitude, spot.longitude, venue and
                                                            f"{venue.title}, {venue.address}") if spot else "")


def chat_of(message: Message) -> str:
    """A message's chat: a forum topic's is ``<group id>:<topic id>``, any other the chat's id."""
    topic = message.message_thread_id if message.is_topic_message else None
    return f"{message.chat_id}:{topic}" if topic else str(message.chat_id)


def answered(message: Message) -> tuple[str | None, str | None]:
    """The words a reply answers (the part the sender picked, else the whole message) and their
    author's id; none for a forward or an inline bot's result, though Telegram names the one who
    passed it on: its words are another person's."""
    reply = message.reply_to_message
    words = message.quote.text if message.quote else reply and words_of(reply)
    author = reply.from_user if reply and not (reply.forward_origin or reply.via_bot) else None
    return words, author and str(author.id)


def where(chat_id: str) -> dict[str, Any]:
    """The Bot API's address of a chat: a forum topic's is its group, with the topic's thread."""
    chat, _, topic = chat_id.partition(":")
    return {"chat_id": chat, "message_thread_id": int(topic)} if topic.isdigit() else {"chat_id": chat_id}


def replying(msg: OutboundMessage) -> ReplyParameters | None:
    """A reply to the message ``msg`` answers, if it names one (a group's question)."""
    answers = msg.answers
    return ReplyParameters(int(answers), allow_sending_without_reply=True) \
        if answers and answers.lstrip("-").isdigit() else None
