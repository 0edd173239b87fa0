"""exec_command: run a shell command in the workspace.

The deny list below is a guard against *accidents* (a model that decides to "clean up" with
``rm -rf ~``, or to reboot the host), **not a sandbox**: the command runs as the daemon's user
with its permissions, and anything it can do by other spellings it can still do. Turn the tool
off with ``tools.exec.enabled: false`` where that matters, or run nanobot as a user that may do
little. ``tools.restrictToWorkspace`` only sets the working directory here.

The child gets a small, explicit environment (see ``child_env``) so the daemon's secrets
(``NANOBOT_*`` API keys and tokens, and whatever else its environment holds) never reach it.
On timeout, or when the turn is cancelled (/stop), the whole process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Annotated

from pydantic import Field

from nanobot.tools.registry import ToolContext, tool

__all__ = ["SHELL_TOOLS", "exec_command", "DENY_RULES", "denied_reason", "child_env"]

# --- the deny list -------------------------------------------------------------------------
# Each rule is (regex, reason), searched in the raw command text. The patterns stay within one
# simple command ([^;&|\n]) and a few of them only fire in command position, so that text
# which merely mentions a word (`echo reboot`, `grep -r shutdown .`, `2>/dev/null`) passes.
#
#   rm -r/-R/--recursive of /, /*, ~, ~/*, $HOME, or a top-level system directory (/etc, /usr,
#       ...), whatever other flags (-f, --no-preserve-root) and wrappers (sudo) come with it;
#       and `cd / && rm -r... *`
#   chmod/chown/chgrp -R of the same targets           mkfs, mkfs.*, mke2fs, mkswap, wipefs
#   dd of=/dev/<anything but null, zero, stdout, stderr, tty, fd/...>
#   >, >>, tee or shred onto a raw disk (/dev/sd*, hd*, vd*, xvd*, nvme*, mmcblk*, md*, dm-*,
#       loop*, disk*, mapper/...)
#   fork bombs: `name(){ name|name& }` (the classic `:(){ :|:& };:` included)
#   shutdown, reboot, halt, poweroff, init/telinit 0|6, systemctl poweroff|reboot|halt|kexec|
#       suspend|hibernate (command position only)

_SEG = r"[^;&|\n]"  # a character within one simple command
# Command position: start, a separator, `sh -c '`, or a shell keyword; then wrappers such as
# sudo, env assignments, and an optional directory (/sbin/reboot).
_CMD = (
    r"(?:^|[;&|(`{\n]|\$\(|-c\s+['\"]|\b(?:then|do|else)\s)\s*"
    r"(?:(?:sudo|doas)(?:\s+-[a-zA-Z]+(?:\s+[\w.-]+)?)*\s+"
    r"|(?:exec|nohup|command|builtin|nice|time|env|xargs)(?:\s+-\S+)*\s+"
    r"|\w+=\S*\s+)*"
    r"(?:\S*/)?"
)
_SYSTEM_DIRS = r"bin|boot|dev|etc|home|lib|lib32|lib64|opt|proc|root|sbin|srv|sys|usr|var"
_ROOTISH = (
    r"""['"]?(?:/+\.?\*?|~/*\*?|\$\{?HOME\}?/*\*?|/+(?:%s)/*\*?)['"]?(?=$|[\s;&|)`])""" % _SYSTEM_DIRS
)
_RM_RECURSIVE = r"(?=%s*\s(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)(?=$|\s))" % _SEG
_CH_RECURSIVE = r"(?=%s*\s(?:-[a-zA-Z]*R[a-zA-Z]*|--recursive)(?=$|\s))" % _SEG
_DISK = r"/dev/(?:sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|md\d|dm-\d|loop\d|disk|rdisk\d|mapper/|sr\d)"

DENY_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\brm\b" + _RM_RECURSIVE + _SEG + r"*\s" + _ROOTISH),
     "recursive rm of the root, the home directory or a system directory"),
    (re.compile(r"\bcd\s+" + _ROOTISH + r"\s*(?:&&|;|\n)\s*(?:sudo\s+)?rm\b" + _RM_RECURSIVE + _SEG + r"*\s['\"]?\*"),
     "recursive rm of everything in the root or home directory"),
    (re.compile(r"\b(?:chmod|chown|chgrp)\b" + _CH_RECURSIVE + _SEG + r"*\s" + _ROOTISH),
     "recursive chmod/chown of the root, the home directory or a system directory"),
    (re.compile(_CMD + r"(?:mkfs(?:\.\w+)?|mke2fs|mkswap|wipefs)\b"), "formatting a file system"),
    (re.compile(r"\bdd\b" + _SEG + r"*\bof=['\"]?/dev/(?!(?:null|zero|stdout|stderr|tty)\b|fd/)"),
     "dd onto a device"),
    (re.compile(r">\s*['\"]?" + _DISK), "writing to a raw disk device"),
    (re.compile(r"\b(?:tee|shred)\b" + _SEG + r"*\s['\"]?" + _DISK), "writing to a raw disk device"),
    (re.compile(r"(?P<f>[\w:.-]+)\s*\(\s*\)\s*\{[^}]*(?P=f)\s*\|\s*&?\s*(?P=f)\s*&"), "a fork bomb"),
    (re.compile(_CMD + r"(?:shutdown|reboot|halt|poweroff)\b"), "shutting down or rebooting the machine"),
    (re.compile(_CMD + r"(?:init|telinit)\s+[06]\b"), "shutting down or rebooting the machine"),
    (re.compile(_CMD + r"systemctl\s+(?:-\S+\s+)*(?:poweroff|reboot|halt|kexec|suspend|hibernate|hybrid-sleep)\b"),
     "shutting down or rebooting the machine"),
]


def denied_reason(command: str) -> str | None:
    """Why ``command`` is refused, or None if no deny rule matches."""
    for pattern, reason in DENY_RULES:
        if pattern.search(command):
            return reason
    return None


# --- the child's environment ---------------------------------------------------------------
# An allowlist, not a blocklist: the daemon's environment carries secrets (NANOBOT_PROVIDERS__
# *__API_KEY, channel tokens, and often unrelated ones like AWS_*), and a blocklist would miss
# some. What is kept is what ordinary tools need to behave: PATH to find them; the real HOME,
# because this is the user's own assistant and git, ssh, pip and friends read their config from
# there (pointing HOME at the workspace would break them and isolate nothing, since the command
# is not sandboxed); user names, locale, time zone and temp dir; proxy and CA settings so that
# network tools work as they do for the daemon. TERM=dumb keeps colour codes out of the output.
_ENV_KEEP = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
)


def child_env(workspace: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in _ENV_KEEP if key in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("HOME", str(workspace))
    env.setdefault("LANG", "C.UTF-8")
    env["TERM"] = "dumb"
    return env


# --- running -------------------------------------------------------------------------------
class _Capture(asyncio.SubprocessProtocol):
    """Collects stdout+stderr keeping only the first and last ``keep`` bytes: memory stays
    bounded however much a command prints before its timeout."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def process_exited(self) -> None:
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def text(self, limit: int) -> str:
        """The output, its middle cut out if it is over ``limit`` characters."""
        if self.total == len(self.head) + len(self.tail):  # nothing dropped yet
            whole = (self.head + self.tail).decode("utf-8", errors="replace")
            if len(whole) <= limit:
                return whole
            head, tail, total, unit = whole, whole, len(whole), "characters"
        else:
            head = self.head.decode("utf-8", errors="replace")
            tail = self.tail.decode("utf-8", errors="replace")
            total, unit = self.total, "bytes"
        first, last = head[: limit // 2], tail[len(tail) - (limit - limit // 2):]
        shown = len(first) + len(last) if unit == "characters" else len((first + last).encode())
        return f"{first}\n\n[... {total - shown:,} {unit} omitted of {total:,} ...]\n\n{last}"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _status(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"[killed by signal {signal.Signals(-returncode).name}]"
        return f"[killed by signal {-returncode}]"
    return f"[exit code {returncode}]"


# After the shell exits, how long to wait for output still in the pipe. A background child
# that keeps the pipe open (`server &`) must not hold the turn until the timeout.
_DRAIN_SECONDS = 0.5


@tool
async def exec_command(
    ctx: ToolContext,
    command: str,
    timeout: Annotated[int | None, Field(description="Seconds; default from config")] = None,
) -> str:
    """Run a shell command in the workspace; returns its output (stdout+stderr) and exit code."""
    settings = ctx.config.tools.exec
    if not settings.enabled:
        raise PermissionError("exec_command is disabled in this nanobot's config (tools.exec.enabled is false)")
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    if "\x00" in command:
        raise ValueError("command contains a NUL byte")
    reason = denied_reason(command)
    if reason:
        raise PermissionError(
            f"command refused: {reason}. This guard blocks destructive commands; "
            "if it is really intended, ask the user to run it themselves"
        )
    workspace = Path(ctx.workspace).expanduser()
    if not workspace.is_dir():
        raise FileNotFoundError(f"the workspace {workspace} does not exist (run `nanobot onboard`)")
    seconds = timeout or settings.timeout
    limit = settings.max_output_chars

    loop = asyncio.get_running_loop()
    transport, capture = await loop.subprocess_exec(
        lambda: _Capture(keep=4 * limit),  # 4 bytes per character at worst in UTF-8
        "/bin/sh", "-c", command,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=workspace, env=child_env(workspace),
        start_new_session=True,  # its own process group, so a timeout kills grandchildren too
    )
    pid = transport.get_pid()
    try:
        try:
            async with asyncio.timeout(seconds):
                await capture.exited.wait()
        except TimeoutError:
            _kill_group(pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(capture.exited.wait(), 5)
            output = capture.text(limit).strip() or "(none)"
            raise TimeoutError(
                f"command timed out after {seconds}s and was killed; partial output:\n{output}"
            ) from None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(capture.closed.wait(), _DRAIN_SECONDS)
    finally:
        if transport.get_returncode() is None:  # cancelled (/stop) or timed out
            _kill_group(pid)
        transport.close()

    returncode = transport.get_returncode()
    output = capture.text(limit)
    if returncode == 0:
        return output or "(no output)"
    return f"{output.rstrip(chr(10))}\n{_status(returncode)}" if output else _status(returncode)


SHELL_TOOLS = [exec_command]
