"""One gateway per home: two would fire every cron job twice and poll the same bot token
(Telegram answers the second poller with 409). The gateway holds an exclusive ``flock`` on
``$NANOBOT_HOME/gateway.lock`` (released by the kernel when the process dies, so a crash
leaves no stale lock) and writes its PID there for the refusal message and ``status``. It
also writes where its channels stand (``gateway-state.json``), which ``status`` shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from nanobot.config import Config, write_private

LOCK_NAME = "gateway.lock"
STATE_NAME = "gateway-state.json"


class GatewayRunning(Exception):
    """Another gateway holds the home."""


class GatewayLock:
    def __init__(self, home: Path) -> None:
        self.path = home / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = running_gateway_pid(self.path.parent)
            raise GatewayRunning(f"another gateway is already running on {self.path.parent} "
                                 f"(PID {pid or 'unknown'}); stop it first") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def running_gateway_pid(home: Path) -> int | None:
    """The PID of the gateway running on ``home``, or None when none runs (for ``status``)."""
    path = home / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def nothing_runs_jobs(config: Config) -> bool:
    """Nothing would run this home's cron jobs and background tasks: no gateway runs on it, and
    it is not one of several workers on PostgreSQL (theirs may run on other machines)."""
    return config.database.engine == "sqlite" and running_gateway_pid(config.home) is None


def write_gateway_state(home: Path, channels: dict[str, str], mcp: dict[str, str],
                        cooling: dict[str, float] | None = None) -> None:
    """``cooling``: providers skipped for now, and for how many more seconds."""
    until = {name: time.time() + left for name, left in (cooling or {}).items()}
    write_private(home / STATE_NAME, json.dumps({"pid": os.getpid(), "channels": channels, "mcp": mcp,
                                                 "cooling_until": until}) + "\n")


def gateway_states(home: Path, pid: int, part: str) -> dict:
    """The running gateway's ``channels``, ``mcp`` or ``cooling_until`` states (empty when it wrote none)."""
    try:
        data = json.loads((home / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get(part, {}) if data.get("pid") == pid else {}
