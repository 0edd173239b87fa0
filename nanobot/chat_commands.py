"""The chat commands every channel takes, with a line each: the agent's /help, and the menu a
platform shows when "/" is typed (Telegram's setMyCommands). What each does is the agent's
(``nanobot.agent.commands``)."""

from __future__ import annotations

# (name, arguments, what it does)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("new", "", "start a fresh conversation (history and Python state cleared)"),
    ("stop", "", "cancel what I am doing now; /stop ID stops a background task"),
    ("tasks", "", "this chat's background tasks"),
    ("mode", "[tools|code|hybrid|default]", "show or set how I act in this chat"),
    ("model", "[NAME|default]", "show or set the model for this chat"),
    ("voice", "[always|whenVoice|never|default]", "when my replies are also spoken"),
    ("status", "", "model, mode and usage"),
    ("budget", "", "what today's model budget allows"),
    ("help", "", "this list"),
)

HELP = "Commands:\n" + "\n".join(f"/{name}{' ' + args if args else ''} — {what}" for name, args, what in COMMANDS)
