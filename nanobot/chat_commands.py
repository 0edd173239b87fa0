"""The chat commands every channel takes, with a line each: the agent's /help, the menu a
platform shows when "/" is typed (Telegram's setMyCommands, Discord's slash commands, WhatsApp's
conversational components), how a platform's own command stands for one (``as_chat_message``),
and what an answer offers to pick (``Offer``: buttons, a list). What each does is the agent's
(``nanobot.agent.commands``)."""

from __future__ import annotations

from collections.abc import Sequence

# (name, arguments, what it does)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("new", "", "start a fresh conversation (history and Python state cleared)"),
    ("stop", "[ID]", "cancel what I am doing now, or the background task ID"),
    ("tasks", "", "this chat's background tasks"),
    ("mode", "[tools|code|hybrid|default]", "show or set how I act in this chat"),
    ("model", "[NAME|default]", "show or set the model for this chat"),
    ("voice", "[always|whenVoice|never|default]", "when my replies are also spoken"),
    ("status", "", "model, mode and usage"),
    ("budget", "", "what today's model budget allows"),
    ("help", "", "this list"),
)

HELP = "Commands:\n" + "\n".join(f"/{name}{' ' + args if args else ''} — {what}" for name, args, what in COMMANDS)
# Where "/" is the platform's own, how the commands are typed there.
TYPED_ON = {
    "slack": "On Slack, type them after the app's command (/nanobot new), or with a space first in our direct "
             'messages (" /new").',
    "matrix": 'In Element, choose "Send as message" when it asks, or type a space first (" /new").',
}


def help_for(channel: str) -> str:
    """/help in a chat of ``channel``: the commands, and how to type them where that is not plain."""
    return HELP + (f"\n{TYPED_ON[channel]}" if channel in TYPED_ON else "")


# The commands whose answer offers what to pick (``Offer``).
OFFERING = ("/mode", "/model", "/voice")


def choices(command: str) -> list[str]:
    """The words ``/command`` takes where they are few (``/mode``: tools, code, hybrid, default),
    which a platform may offer as buttons or a list; [] where it takes a name, an id or nothing."""
    arguments = next((args for name, args, _ in COMMANDS if f"/{name}" == command.lower()), "")
    words = arguments.strip("[]").split("|") if arguments else []
    return [] if any(word.isupper() for word in words) else words


class Offer(str):
    """A command's answer that offers what to pick next (buttons, a list, where the platform has
    them): ``picks`` are the commands a pick sends, "/model fast". The agent makes it, knowing
    the chat (its trust, the configured models); the gateway carries the picks to the adapter."""

    picks: tuple[str, ...]

    def __new__(cls, text: str, picks: Sequence[str]) -> "Offer":
        answer = super().__new__(cls, text)
        answer.picks = tuple(picks)
        return answer


def shown(picks: Sequence[str], *, most: int, label_chars: int, sends_bytes: int) -> list[tuple[str, str]]:
    """``picks`` as a platform can show them: (the word shown, what a pick sends back, read by
    ``picked``). A word longer than ``label_chars`` is cut with "…"; a pick that sends more than
    ``sends_bytes`` is left out, and more than ``most`` picks are none: the answer's text names
    them all, to type."""
    fitting = [(sends.partition(" ")[2], sends) for sends in picks
               if picked(sends) == sends and len(sends.encode()) <= sends_bytes]
    cut = [(word if len(word) <= label_chars else word[:label_chars - 1] + "…", sends) for word, sends in fitting]
    return cut if len(cut) <= most else []


def picked(choice: str) -> str:
    """A pick (``/model fast``) as the command it stands for, taken as if its presser typed it
    (the agent checks the word as it does a typed one); "" for anything no answer offers: a
    pick's id is whatever the client sent, and must not become a message to the model."""
    command, _, word = choice.strip().partition(" ")
    return f"{command} {word}" if command in OFFERING and word and not any(c.isspace() for c in word) else ""


def as_chat_message(command: str, words: str) -> str:
    """A platform command's invocation as the chat message it stands for. Where the app
    registered a chat command under its own name, ``/model gpt-5`` is that command; one catch-all
    command (Slack's ``/nanobot``) takes a command's name as its first word (``/nanobot new``),
    with at most the one argument the command takes, and any other words as a message to the
    bot ("/nanobot new ideas for dinner?" is a question, not /new). No words: /help."""
    name, words = command.strip().lstrip("/").lower(), words.strip()
    takes = {known: bool(arguments) for known, arguments, _ in COMMANDS}
    if name in takes:
        return f"/{name} {words}".strip()
    first, *rest = words.split() or ["/help"]
    first = first.lstrip("/").lower()
    if first in takes and (not rest or (takes[first] and len(rest) == 1)):
        return " ".join([f"/{first}", *rest])
    return words
