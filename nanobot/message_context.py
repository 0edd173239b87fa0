"""What comes with a message besides its own words, for the model to read it as a person would:
the message a reply answers (``with_quote``), what a group said before it (``after_heard``), a
place, a contact or a poll it shares (``shared_place``, ``shared_contact``, ``shared_poll``),
and a note for files it carried that could not be received (``noting_lost``). Someone else's words brought in this way
mark the turn as outside content, as a forward does."""

from __future__ import annotations

from dataclasses import replace

from nanobot.bus import InboundMessage


Heard = tuple[str, str, str]  # a group message not for the bot: (sender id, shown as, text)
HEARD_CHARS = 1000  # of each such message


def after_heard(msg: InboundMessage, heard: list[Heard]) -> InboundMessage:
    """``msg`` (admitted, in a group) after what its chat said since the last message to the bot
    (``groupHistory`` of them, kept by the channel's store), so "@bot what do you think?" has
    the discussion it follows. Only allowed people's (``BaseChannel._overhear``), shown by what
    the platform vouches for, never a display name; someone else's words there mark the turn."""
    heard = [h for h in heard if not quotes(msg.content, h[2])]  # not twice
    if not heard:
        return msg
    lines = "\n".join(f"{shown}: {text}" for _, shown, text in heard)
    others = any(sender != msg.sender_id for sender, _, _ in heard)
    return replace(msg, content=f"[said here since the last message to me:\n{lines}]\n{msg.content}",
                   untrusted=msg.untrusted or ("the group's earlier messages" if others else None))


QUOTE_CHARS = 1000  # of the message a reply answers: enough to know what "this" is


def with_quote(text: str, quoted: str | None, author: str | None, sender_id: str,
               own_id: str) -> tuple[str, str | None]:
    """A reply's words after the message it answers, which the model would not see otherwise
    ("@bot what does this mean?" in reply to a message); and the turn's untrusted mark when
    someone else wrote that message (their words, passed on, as a forward)."""
    quoted = " ".join((quoted or "").split())
    if not quoted or not text:
        return text, None
    whose = "your" if author == own_id else "my own" if author == sender_id else "another person's"
    cut = quoted if len(quoted) <= QUOTE_CHARS else quoted[:QUOTE_CHARS] + "…"
    return f'[in reply to {whose} message: "{cut}"]\n{text}', "a quoted message" if whose == "another person's" else None


def quotes(content: str, text: str) -> bool:
    """Whether ``content`` begins with a quote of ``text`` (``with_quote``'s, both cut alike)."""
    return content.startswith("[in reply to ") and f' message: "{text}' in content.partition("\n")[0]


def noting_lost(text: str, offered: int, kept: list[str]) -> str:
    """A message's words, with a note when files it carried were not kept (too large, a failed
    download, no room: the log says which), so the model can say so; and a message of files
    alone is still answered (a message with nothing in it is not: ``_admit``)."""
    lost = offered - len(kept)
    return text if lost <= 0 else f"{text}\n[{lost} attached file(s) could not be received]".strip()


def shared_place(latitude: float, longitude: float, name: str | None = None) -> str:
    """A location someone shared, as words the model can use ("the weather here?", the way)."""
    return f"[location: {latitude:.5f}, {longitude:.5f}{f' ({name})' if name else ''}]"


def shared_contact(name: str, phones: list[str]) -> str:
    """A contact card someone shared ("save this number"), as words."""
    return f"[contact: {', '.join(part for part in (name.strip(), *phones) if part) or 'no details'}]"


def shared_poll(question: str, options: list[str]) -> str:
    """A poll someone started ("@bot which should we pick?" follows it), as words."""
    return f"[poll: {question.strip()} ({' / '.join(option.strip() for option in options)})]"
