"""exec_command: run a shell command in the chat's folder, confined.

Every command runs through ``confine.py`` (Landlock + seccomp + no capabilities + rlimits):
it reads the system directories and ``tools.exec.readPaths``, reads and writes only the
chat's root (the workspace for owner chats, ``chats/<channel>_<id>/`` for member chats), and
cannot open sockets (unless ``tools.exec.network``), read ``$NANOBOT_HOME`` or ``$HOME``, look
into or signal the daemon, or outlive the command: its whole process group is killed when the
command ends. When this machine cannot confine (no Landlock, not Linux), the tool refuses and
says how to opt out (``tools.exec.sandbox: "off"``): it never silently runs unconfined.

The deny list below is a second, older guard against *accidents* (``rm -rf ~``, a reboot);
the confinement is what stops an attacker. The child gets a small, explicit environment
(``child_env``): no ``NANOBOT_*`` secrets, and HOME and TMPDIR inside the chat's folder.

Steering files (AGENTS.md, memory/, skills/, ...) in the chat's folder are checked after each
command: a change that the chat may not make (a member chat, or a turn that read outside
content) is rolled back and refused; an owner's change is announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable

from pydantic import Field

from nanobot import confine
from nanobot.eventloop import cancel_and_wait
from nanobot.tools.registry import ToolContext, tool
from nanobot.tools.steering import Snapshot, refusal, settle
from nanobot.workspace_quota import FILE_COST, WorkspaceFull, room_left

if TYPE_CHECKING:
    from nanobot.config import Config

__all__ = ["SHELL_TOOLS", "exec_command", "DENY_RULES", "denied_reason", "child_env", "shell_status"]

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
# some. Kept: PATH to find tools, user names, locale and time zone, proxy and CA settings so
# network tools behave as they do for the daemon (when the network is allowed at all). HOME
# and TMPDIR point into the chat's folder: the real home holds ssh keys and tokens, and git,
# pip and friends still find a writable home there. TERM=dumb keeps colour codes out.
_ENV_KEEP = (
    "PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
)


def child_env(root: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in _ENV_KEEP if key in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    tmp = root / ".tmp"
    tmp.mkdir(exist_ok=True)
    env.update(HOME=str(root), TMPDIR=str(tmp), TERM="dumb")
    return env


# --- confinement -----------------------------------------------------------------------------
OPT_OUT = ('set tools.exec.sandbox to "off" to run commands unconfined, with the daemon\'s rights, '
           'or tools.exec.enabled to false to remove the shell')


@functools.cache
def confinement() -> confine.Probe:
    """What this machine offers, probed once per process (two syscalls)."""
    return confine.probe()


def shell_status(config: Config) -> str:
    """The ``Shell:`` line of ``nanobot status``."""
    settings = config.tools.exec
    if not settings.enabled:
        return "disabled (tools.exec.enabled is false)"
    if settings.sandbox == "off":
        return 'UNCONFINED (tools.exec.sandbox is "off"): commands run with the daemon\'s own rights'
    probe = confinement()
    if not probe.ok:
        return f"REFUSED ({probe.detail}); {OPT_OUT}"
    network = "network allowed" if settings.network else "no network"
    return f"confined ({probe.detail}; {network})"


def launch_argv(ctx: ToolContext, root: Path, command: str, seconds: int) -> list[str]:
    """The argv that runs ``command``: through the confining launcher unless sandbox is off."""
    settings = ctx.config.tools.exec
    shell = ["/bin/sh", "-c", command]
    if settings.sandbox == "off":
        return shell
    probe = confinement()
    if not probe.ok:
        raise PermissionError(f"exec_command refused: the shell cannot be confined on this machine "
                              f"({probe.detail}); {OPT_OUT}")
    home = ctx.config.home.resolve()
    for path in (str(root), *settings.read_paths):
        if home.is_relative_to(Path(path).expanduser().resolve()):
            raise PermissionError(f"exec_command refused: {path} contains NANOBOT_HOME ({home}), which holds "
                                  "the config and histories; the shell must not reach it")
    argv = [sys.executable, "-I", "-S", confine.__file__, "--rw", str(root), "--cpu", str(seconds + 5),
            "--fsize", str(ctx.config.tools.max_workspace_mb * 2**20),
            "--as", str(settings.max_memory_mb * 2**20)]
    for path in settings.read_paths:
        argv += ["--ro", str(Path(path).expanduser())]
    if settings.network:
        argv.append("--network")
    return [*argv, "--", *shell]


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


# How often a running command's disk use is looked at, and by how much it may pass the room left
# (the daemon writes to the same disk meanwhile: a history, the database).
ROOM_POLL_S, ROOM_SLACK = 0.1, 8 * 2**20
# After the shell exits, how long to wait for output still in the pipe. A background child
# that keeps the pipe open (`server &`) must not hold the turn until the timeout.
_DRAIN_SECONDS = 0.5


@tool
async def exec_command(
    ctx: ToolContext,
    command: str,
    timeout: Annotated[int | None, Field(description="Seconds; default from config")] = None,
) -> str:
    """Run a shell command in the workspace; returns one string: its output, then a last line "[exit code N]".

    stdout and stderr together; killed: "[killed by signal NAME]". Success: out.endswith("[exit code 0]");
    do not show that line to the user."""
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
    root = Path(ctx.workspace).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"the workspace {root} does not exist (run `nanobot onboard`)")
    seconds = timeout or settings.timeout
    argv = launch_argv(ctx, root, command, seconds)
    # Changes the chat may not make are rolled back, so their bytes are kept beforehand.
    room = functools.partial(room_left, ctx.config.workspace_path, ctx.config.tools.max_workspace_mb)
    before = await asyncio.to_thread(Snapshot.take, root, keep_bytes=refusal(ctx, "steering files") is not None)
    try:
        returncode, output = await _run(argv, root, seconds, settings.max_output_chars, room)
    finally:
        await settle(ctx, before, "exec_command")
    if returncode == confine.EXIT_REFUSED and confine.MARK in output:
        raise RuntimeError(output.strip())
    # The exit code always, as the description promises: a model cannot tell "grep found
    # nothing" (1) from success without it.
    return f"{output.rstrip(chr(10))}\n{_status(returncode)}" if output else f"(no output)\n{_status(returncode)}"


async def _run(argv: list[str], root: Path, seconds: int, limit: int, room: Callable[[], int]) -> tuple[int, str]:
    """Run ``argv`` in its own process group; (exit code, capped output). The whole group is
    killed afterwards, whatever happened: nothing the command started outlives it; and sooner
    when it takes more of the disk than the workspace has ``room`` for (WorkspaceFull)."""
    loop = asyncio.get_running_loop()
    transport, capture = await loop.subprocess_exec(
        lambda: _Capture(keep=4 * limit),  # 4 bytes per character at worst in UTF-8
        *argv,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=root, env=child_env(root),
        start_new_session=True,  # its own process group: the launcher forbids leaving it
    )
    pid = transport.get_pid()
    watch = asyncio.create_task(_watch_room(root, room, pid))
    try:
        try:
            async with asyncio.timeout(seconds):
                await capture.exited.wait()
            if watch.done() and watch.exception() is None:  # it killed the command
                raise WorkspaceFull(f"command killed: it wrote past the {watch.result() / 2**20:.1f} MiB the "
                                    "workspace had left (tools.maxWorkspaceMb); delete something first. "
                                    f"Partial output:\n{capture.text(limit).strip() or '(none)'}")
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
        _kill_group(pid)  # background children too, after every command
        transport.close()
        await cancel_and_wait(watch)
    return transport.get_returncode(), capture.text(limit)


async def _watch_room(root: Path, room: Callable[[], int], pid: int) -> int:
    """Kill the command once the file system under ``root`` lost more than the workspace's
    ``room`` since it began (and ROOM_SLACK, for the daemon's own writes meanwhile); that room,
    counted only once the command took ROOM_SLACK. RLIMIT_FSIZE bounds each file, not how many
    a loop writes: a member's loop would fill the disk the database is on."""
    start, left = _free(root), None  # (one statfs call: microseconds)
    while True:
        if (taken := start - _free(root)) > ROOM_SLACK:
            if left is None:  # only a command that writes much pays for a count of the workspace
                left = await asyncio.to_thread(room)  # (a walk: seconds, for a big one)
            if taken > max(left, 0) + ROOM_SLACK:
                _kill_group(pid)
                return left
        await asyncio.sleep(ROOM_POLL_S)


def _free(path: Path) -> int:
    """The file system's free bytes, each free inode counted as the FILE_COST a file takes."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize + st.f_favail * FILE_COST


SHELL_TOOLS = [exec_command]
