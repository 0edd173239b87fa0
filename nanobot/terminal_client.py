"""``nanobot agent -m TEXT`` through a running gateway's ``api.sock``: standard library only,
so it starts in a fraction of the in-process path (no model SDK, no pydantic, no sandbox).

``try_gateway(argv)`` returns an exit code when it handled the command, or None (no gateway
runs on this home, or the command is not a plain one-shot message): the full CLI takes over.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import BinaryIO

LEAN_OPTIONS = {"--session": "session", "--mode": "mode"}
SOCKET = "api.sock"  # in $NANOBOT_HOME; the gateway serves it (nanobot/api/terminal.py)


def gateway_listens(path: Path) -> bool:
    """Whether a gateway answers on the socket (one left by a killed gateway does not)."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def parse(argv: list[str]) -> dict[str, str] | None:
    """``agent -m TEXT [--session KEY] [--mode MODE]`` as options, else None."""
    if len(argv) < 3 or argv[0] != "agent":
        return None
    found: dict[str, str] = {}
    rest = argv[1:]
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


def try_gateway(argv: list[str]) -> int | None:
    options = parse(argv)
    home = Path(os.environ.get("NANOBOT_HOME", "~/.nanobot")).expanduser()
    path = home / SOCKET
    if options is None or not path.exists() or os.environ.get("NANOBOT_CONFIG"):
        return None
    headers = {"X-Nanobot-Session": options.get("session", "cli:default")}
    if "mode" in options:
        headers["X-Nanobot-Mode"] = options["mode"]
    body = json.dumps({"model": "nanobot", "stream": True, "messages": [{"role": "user", "content": options["message"]}]})
    try:
        status, response = _post(str(path), body.encode(), headers)
    except OSError:  # a socket left by a gateway that is gone: run in-process
        return None
    if status != 200:
        error = json.loads(response.read() or b"{}").get("error", {})
        sys.stderr.write(f"nanobot: {error.get('message', f'the gateway answered {status}')}\n")
        return 2 if status == 400 else 1
    return _print_stream(response)


def _post(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, BinaryIO]:
    """One HTTP/1.0 request over the Unix socket (the server closes the connection at the end
    of the answer, so the body is simply read to the end). http.client would load ssl: 20 MiB."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    lines = ["POST /v1/chat/completions HTTP/1.0", "Host: localhost", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    response = sock.makefile("rb")
    status = int(response.readline().split()[1])
    while response.readline().strip():  # the headers
        pass
    return status, response


def _print_stream(response: BinaryIO) -> int:
    ended_with_newline = True
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                sys.stdout.write(piece)
                sys.stdout.flush()
                ended_with_newline = piece.endswith("\n")
    if not ended_with_newline:
        sys.stdout.write("\n")
    return 0
