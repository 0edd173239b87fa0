"""Logging: timestamped lines on stderr and, for the daemon, a rotating file in the home.

Nothing secret reaches a log: every line (tracebacks included) passes a formatter that
replaces the config's secrets (API keys, bot tokens: any value under a key naming a token,
key, secret or password) with ``***``, and the HTTP clients' request lines, which carry the
Telegram token in the URL, are kept at WARNING.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from nanobot.config import url_password
from nanobot.utf8 import for_terminal, json_for_terminal

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = "logs/nanobot.log"
MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 5
_SECRET_KEY = re.compile(r"token|key|secret|password|authorization|cookie", re.I)
_secrets: set[str] = set()


# The chat a log line is about (set around each turn), and a trace id (OpenTelemetry, when on).
current_chat: ContextVar[str | None] = ContextVar("nanobot_chat", default=None)
current_trace: Callable[[], str | None] = lambda: None  # nanobot.tracing sets it when traces are on


def trace_ids_from(source: Callable[[], str | None] | None) -> None:
    """Where JSON lines get the current trace id (``nanobot.tracing``, while traces are on)."""
    global current_trace
    current_trace = source or (lambda: None)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return for_terminal(redact(super().format(record)))  # names and texts others chose, shown

    def formatMessage(self, record: logging.LogRecord) -> str:
        # What others wrote (a job's name) may hold a line break: the lines after it are indented,
        # so a line that starts with a time is always a record's own, never one they forged.
        return super().formatMessage(record).replace("\n", "\n    ")


class JsonFormatter(logging.Formatter):
    """``gateway.logFormat: "json"``: one object per line, for a log shipper."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": redact(record.getMessage()),
                 "worker": self.worker}
        if chat := current_chat.get():
            entry["chat"] = chat
        if trace := current_trace():
            entry["trace_id"] = trace
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json_for_terminal(entry)  # a line others' words are in, read in a terminal too


def use_format(log_format: str, worker: str) -> None:
    """Every handler writes ``log_format``: "text" (timestamped lines) or "json"."""
    formatter = JsonFormatter(worker) if log_format == "json" else RedactingFormatter(FORMAT)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


def remember_secrets(config: Any) -> None:
    """Collect the config's secret values, so no log line shows them."""
    _secrets.update(_secret_values(config.model_dump()))


def _secret_values(value: Any, key: str = "") -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _secret_values(v, str(k))]
    if isinstance(value, list):
        return [s for v in value for s in _secret_values(v, key)]
    if isinstance(value, str) and len(value) >= 6 and _SECRET_KEY.search(key):
        return [value]
    if isinstance(value, str) and "://" in value and (password := url_password(value)):
        return [password]  # database.url, a proxy: the password inside a URL
    return []


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a test runner swaps it). While the
    terminal prints a reply and its line is not finished, lines wait (``terminal_line``): on a
    terminal both streams share the screen, and a log line must not cut a reply in two."""

    midline = False
    held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if _StderrHandler.midline:
            _StderrHandler.held.append(record)
            return
        self.stream = sys.stderr
        super().emit(record)


def terminal_line(ended: bool) -> None:
    """The terminal's reply line is open (``ended`` False) or done: the held log lines follow."""
    _StderrHandler.midline = not ended
    if ended and _StderrHandler.held:
        held, _StderrHandler.held = _StderrHandler.held, []
        for handler in [h for h in logging.getLogger().handlers if isinstance(h, _StderrHandler)]:
            for record in held:
                handler.emit(record)


def setup(verbose: bool = False) -> None:
    """stderr: warnings (everything the agent does with ``-v``), timestamped and redacted."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    handler = _StderrHandler()
    handler.setFormatter(RedactingFormatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for noisy in ("httpx", "httpcore", "telegram.ext", "discord", "apscheduler", "openai", "nio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_to_file(home: Path) -> Path:
    """The daemon's log: ``$NANOBOT_HOME/logs/nanobot.log``, rotated at 5 MB, five kept; INFO and up."""
    path = home / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    handler.setFormatter(RedactingFormatter(FORMAT))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    for name in ("nanobot", "channels"):  # a daemon says what it does, even without -v
        logging.getLogger(name).setLevel(logging.INFO)
    path.chmod(0o600)
    return path
