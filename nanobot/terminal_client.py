"""``nanobot agent -m TEXT`` through a running gateway's ``api.sock``: standard library only,
so it starts in a fraction of the in-process path (no model SDK, no pydantic, no sandbox).

``try_gateway(argv)`` returns an exit code when it handled the command, or None (no gateway
runs on this home, it runs with another config file, or the command is not a plain one-shot
message): the full CLI takes over. The config is found as the full CLI finds it (``--config``,
``NANOBOT_CONFIG``, ``$NANOBOT_HOME/config.json``) and must be the gateway's own file;
``-v`` only adds a line saying which way the message went. What is piped in follows the message
(``with_piped``, which the full CLI uses too), marked as outside content.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

from nanobot.utf8 import for_terminal

LEAN_OPTIONS = {"--session": "session", "--mode": "mode"}
SOCKET = "api.sock"  # in $NANOBOT_HOME; the gateway serves it (nanobot/api/terminal.py)
# ``cat page.html | nanobot agent -m "summarize"``: the piped text may be anyone's words, so the
# turn is marked as one reading outside content (as for an attached file).
PIPED = "what was piped in"
PIPED_HEADER = "X-Nanobot-Piped"
MAX_PIPED = 512 * 1024  # the gateway's socket takes a request of up to 1 MiB


def parse(argv: list[str]) -> dict[str, str] | None:
    """``[-v] [--config PATH] agent -m TEXT [--session KEY] [--mode MODE]`` as options, else None."""
    found: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0] != "agent":  # the options before the command
        flag = rest.pop(0)
        if flag in ("-v", "--verbose"):
            found["verbose"] = "1"
        elif flag == "--config" and rest:
            found["config"] = rest.pop(0)
        else:
            return None
    if len(rest) < 3:
        return None
    rest = rest[1:]
    while rest:
        flag = rest.pop(0)
        if flag in ("-m", "--message") and rest:
            found["message"] = rest.pop(0)
        elif flag in LEAN_OPTIONS and rest:
            found[LEAN_OPTIONS[flag]] = rest.pop(0)
        else:
            return None  # --local, --demo, --help or anything else: the full CLI
    if not found.get("session", "cli:default").startswith("cli:"):
        return None  # another chat's session: only the in-process path may act in it
    return found if "message" in found else None


def config_file(explicit: str | None) -> Path:
    """The config file the full CLI would read (nanobot.config.config_path), resolved."""
    named = explicit or os.environ.get("NANOBOT_CONFIG")
    home = Path(os.environ.get("NANOBOT_HOME", "~/.nanobot")).expanduser()
    return Path(named).expanduser().resolve() if named else (home / "config.json").resolve()


NO_GATEWAY = "no gateway answers"


def gateway_config(sock: Path) -> str | None:
    """The config file of the gateway answering on ``sock``; None for one whose config was
    built in code (an embedding program's, a test's); ``NO_GATEWAY`` when none answers."""
    try:
        status, response = _request(str(sock), "GET", "/v1/nanobot/gateway", b"", {})
    except OSError:
        return NO_GATEWAY
    return json.loads(response.read() or b"{}").get("config") if status == 200 else NO_GATEWAY


def same_config(theirs: str | None, mine: Path | None) -> bool:
    return theirs is None or theirs == str(mine)


def try_gateway(argv: list[str]) -> int | None:
    options = parse(argv)
    home = Path(os.environ.get("NANOBOT_HOME", "~/.nanobot")).expanduser()
    path = home / SOCKET
    if options is None or not path.exists():
        return None
    if not same_config(gateway_config(path), config_file(options.get("config"))):
        return None  # none runs (a socket left behind), or it runs with another config
    try:
        message, piped = with_piped(options["message"])
    except ValueError as exc:
        sys.stderr.write(f"nanobot: {exc}\n")
        return 2
    return send(path, message, options.get("session", "cli:default"), options.get("mode"), piped=piped,
                verbose=bool(options.get("verbose")))


def with_piped(message: str) -> tuple[str, bool]:
    """``git diff | nanobot agent -m "review this"``: the message with what is piped in after it
    (as llm, aichat and ``ollama run`` take it), and whether anything was; its turn reads it as
    outside content (``PIPED``). ValueError: more than ``MAX_PIPED``."""
    piped = _piped_input()
    return (f"{message}\n\n{piped}", True) if piped else (message, False)


@functools.cache  # read once: the full CLI asks again when the gateway was gone after all
def _piped_input() -> str:
    """Only from a pipe or a file: never a terminal (that would wait for typing) nor /dev/null
    (systemd's, cron's)."""
    try:
        kind = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # closed, or replaced by something without a file
        return ""
    if not (stat.S_ISFIFO(kind) or stat.S_ISREG(kind)):
        return ""
    piped = sys.stdin.buffer.read(MAX_PIPED + 1)
    if len(piped) > MAX_PIPED:
        raise ValueError(f"what is piped in is over {MAX_PIPED // 1024} KiB: put it in the workspace and ask for "
                         "it by name")
    return piped.decode("utf-8", errors="replace").strip()


def send(path: Path, message: str, session: str, mode: str | None, *, piped: bool = False,
         verbose: bool = False) -> int | None:
    """One message to the gateway on ``path``, its reply printed as it comes; the exit code
    (None: the gateway was gone after all). ``piped``: it carries what was piped in."""
    if verbose:
        sys.stderr.write(f"nanobot: through the gateway running on {path.parent} (its log has the turn)\n")
    headers = {"X-Nanobot-Session": session}
    if mode:
        headers["X-Nanobot-Mode"] = mode
    if piped:
        headers[PIPED_HEADER] = "1"
    body = json.dumps({"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": message}]})
    try:
        status, response = _request(str(path), "POST", "/v1/chat/completions", body.encode(), headers)
    except OSError:  # a socket left by a gateway that is gone: run in-process
        return None
    if status != 200:
        error = json.loads(response.read() or b"{}").get("error", {})
        sys.stderr.write(f"nanobot: {error.get('message', f'the gateway answered {status}')}\n")
        return 2 if status == 400 else 1
    return _print_stream(response)


def _request(path: str, method: str, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, BinaryIO]:
    """One HTTP/1.0 request over the Unix socket (the server closes the connection at the end
    of the answer, so the body is simply read to the end). http.client would load ssl: 20 MiB."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    lines = [f"{method} {target} HTTP/1.0", "Host: localhost", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    response = sock.makefile("rb")
    status = int(response.readline().split()[1])
    while response.readline().strip():  # the headers
        pass
    return status, response


def _print_stream(response: BinaryIO) -> int:
    """The reply as it comes; the exit code: 1 when the turn failed (as in-process)."""
    ended_with_newline, failed = True, False
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        failed = failed or bool(event.get("nanobot", {}).get("failed"))
        if aside := aside_of(event):  # a note or a file the turn sent, on a line of its own
            sys.stdout.write(("" if ended_with_newline else "\n") + for_terminal(aside_text(aside)) + "\n")
            ended_with_newline = True
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                sys.stdout.write(for_terminal(piece))
                sys.stdout.flush()
                ended_with_newline = piece.endswith("\n")
    if not ended_with_newline:
        sys.stdout.write("\n")
    return 1 if failed else 0


def aside_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """The note or file a stream's event carries (the API's ``nanobot`` field), if any: not the
    mark of a failed turn, whose words come as the reply's."""
    aside = event.get("nanobot")
    return aside if aside and "failed" not in aside else None


def aside_text(aside: dict[str, Any]) -> str:
    """A note or a file a turn sent (the API's ``nanobot`` field), as a line of the terminal."""
    file = aside.get("file")
    if isinstance(file, dict):
        caption = f" {file.get('caption')}" if file.get("caption") else ""
        return f"[file: {file.get('path')} in the chat's folder]{caption}"
    return str(aside.get("note", ""))
