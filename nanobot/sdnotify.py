"""systemd's notify protocol over the stdlib: one datagram per state change.

``Type=notify`` units get ``NOTIFY_SOCKET`` in their environment; we send ``READY=1`` once the
channels are up, ``WATCHDOG=1`` while the event loop is alive, and ``STOPPING=1`` on the way
out. Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op, so nothing here needs
libsystemd.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; False if not under systemd or it failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket: the name starts with a NUL byte
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:  # a missing notification must never take the daemon down
        log.warning("sd_notify(%s) failed: %s", state, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None if not asked."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):  # the watchdog is meant for another process
        return None
    return int(usec) / 2 / 1_000_000


async def watchdog(interval: float) -> None:
    """Ping until cancelled. It runs on the event loop, so a loop that hangs stops the pings
    and systemd restarts the service: exactly the failure a watchdog is for."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
