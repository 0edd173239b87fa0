"""The chat commands every channel takes, with a line each: the agent's /help, the menu a
platform shows when "/" is typed (Telegram's setMyCommands, Discord's slash commands, WhatsApp's
conversational components), and how a platform's own command stands for one
(``as_chat_message``). What each does is the agent's (``nanobot.agent.commands``)."""

from __future__ import annotations

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


def choices(command: str) -> list[str]:
    """The words ``/command`` takes where they are few (``/mode``: tools, code, hybrid, default),
    which a platform may offer as buttons or a list; [] where it takes a name, an id or nothing."""
    arguments = next((args for name, args, _ in COMMANDS if f"/{name}" == command.lower()), "")
    words = arguments.strip("[]").split("|") if arguments else []
    return [] if any(word.isupper() for word in words) else words


def offered(text: str) -> str | None:
    """The command ``text`` is, bare, when it takes one of a few words (``/mode``; ``/mode@bot``
    as Telegram's group menu sends it): its answer may offer them to pick (buttons, a list)."""
    command = text.strip().split("@", 1)[0].lower()
    return command if " " not in command and choices(command) else None


def picks(command: str) -> list[tuple[str, str]]:
    """What an answer to ``command`` offers: (the word shown, what a pick of it sends back), the
    latter read by ``picked``."""
    return [(word, f"{command} {word}") for word in choices(command)]


def picked(choice: str) -> str:
    """A pick from such an offer (``/mode code``) as the command it stands for; "" for anything
    that was never offered (a pick's id is whatever the client sent)."""
    command, _, word = choice.partition(" ")
    return f"{command} {word}" if word in choices(command) else ""


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
