"""Untrusted files and web pages are parsed in a child process with limits, never in the daemon.

Any allowed user, a member chat included, can send a PDF, a DOCX or a picture built to take
gigabytes or minutes to parse. In the daemon that stalls every chat or gets it killed for
memory, and since the message is durable it comes back after the restart. So each parse runs
in ``parse_child`` (CPU seconds, address space, wall time, confined where the kernel can), at
most ``CONCURRENT`` at once, and its failure is one line for the chat. A failure is recorded
beside the file (``.NAME.unreadable``), so a resumed turn does not parse it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanobot import beneath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParseLimits:
    cpu_seconds: int = 15
    memory_bytes: int = 1 << 30  # address space: Python with lxml or Pillow loaded needs ~300 MB of it
    wall_seconds: float = 20.0


LIMITS = ParseLimits()
CONCURRENT = 2  # parses at once: each may take up to LIMITS.memory_bytes
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


class Unreadable(ValueError):
    """The file was refused or could not be parsed; the message is one line for the chat."""

    def __init__(self, message: str, no_text: bool = False) -> None:
        super().__init__(message)
        self.no_text = no_text  # parsed, but there is no text in it (a scan, an empty file)


def failure_marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.unreadable")


async def parse_file(kind: str, root: Path, relative: str, limits: ParseLimits = LIMITS) -> dict[str, Any]:
    """What ``parse_child`` made of the file ``relative`` under ``root`` (``kind``: "document"
    or "image"); Unreadable when it refused, failed, or failed before (the recorded reason,
    without parsing again). The file is opened here without following links (``beneath``) and
    the child reads that very descriptor: a link a member made never reaches a parser."""
    fd = await asyncio.to_thread(beneath.open_file, root, relative)
    try:
        st = os.fstat(fd)
        version = [st.st_mtime_ns, st.st_size]  # the marker speaks for this version of the file only
        marker = failure_marker(Path(relative)).as_posix()
        previous = await asyncio.to_thread(_recorded_failure, root, marker, version)
        if previous is not None:
            raise previous
        slots = _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(CONCURRENT))
        async with slots:
            result = await _run_child(kind, fd, Path(relative).name, limits)
    finally:
        os.close(fd)
    if "error" in result:
        failure = Unreadable(result["error"], bool(result.get("no_text")))
        await asyncio.to_thread(_record_failure, root, marker, failure, version)
        raise failure
    return result


async def parse_page(html: str, url: str, max_chars: int, limits: ParseLimits = LIMITS) -> dict[str, Any]:
    """A web page as ``{"title", "markdown", "complete"}`` (``html_markdown``), made in the
    parsing process: a page is anyone's to write, and a few megabytes of it could take the
    daemon a minute and gigabytes. Unreadable when it took more than the limits allow."""
    request = json.dumps({"html": html, "url": url, "max_chars": max_chars}).encode()
    async with _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(CONCURRENT)):
        result = await _run_child("page", None, url, limits, request)
    if "error" in result:
        raise Unreadable(result["error"])
    return result


async def _run_child(kind: str, fd: int | None, name: str, limits: ParseLimits,
                     data: bytes | None = None) -> dict[str, Any]:
    """What the child made of the file ``fd`` (inherited), or else of ``data`` (its stdin)."""
    env = {"NANOBOT_PARSE_LIMITS": f"{limits.cpu_seconds},{limits.memory_bytes}"}  # no secret of the daemon's
    inherited, stdin = ((), asyncio.subprocess.PIPE) if fd is None else ((fd,), asyncio.subprocess.DEVNULL)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-m", "nanobot.media.parse_child", kind, str(0 if fd is None else fd), name, env=env,
        pass_fds=inherited, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(limits.wall_seconds):  # not wait_for: on 3.11 it can swallow a /stop
            out, err = await child.communicate(data)
    except asyncio.TimeoutError:
        child.kill()
        await child.wait()
        return {"error": f"it took longer than {limits.wall_seconds:g} s to read; I stopped"}
    except asyncio.CancelledError:  # /stop, or shutdown: the child goes too
        child.kill()
        raise
    try:
        return json.loads(out)
    except ValueError:
        log.warning("parsing %s ended with code %s: %s", name, child.returncode,
                    err.decode(errors="replace")[-300:].strip())
        return {"error": "it needs more memory or time to read than I allow for one file"}


def _recorded_failure(root: Path, marker: str, version: list[int]) -> Unreadable | None:
    try:
        record = json.loads(beneath.read_bytes(root, marker, 1 << 16))
        if record.get("version") != version:
            return None  # the file was replaced since
        return Unreadable(str(record["error"]), bool(record.get("no_text")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _record_failure(root: Path, marker: str, failure: Unreadable, version: list[int]) -> None:
    try:
        beneath.write_bytes(root, marker, json.dumps({"error": str(failure), "no_text": failure.no_text,
                                                      "version": version}).encode())
    except OSError as exc:  # not recorded: a restart parses it again, within the same limits
        log.warning("could not record that %s is unreadable: %s", marker, exc)
