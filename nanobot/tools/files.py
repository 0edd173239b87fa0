"""File tools: read, write, edit, list, move, delete and glob inside the workspace.

Every path goes through ``nanobot.tools.paths``, which keeps the tools inside the workspace
(when ``tools.restrictToWorkspace`` is on) and out of NANOBOT_HOME (always). Files are opened
relative to a pinned parent directory with ``O_NOFOLLOW``, so a symlink swapped in after the
check is refused rather than followed. Writes go to a temporary file that is then renamed over
the target: a crash never leaves a half-written file, and an existing file keeps its mode.

Also: a file with more than one hard link is not read (a link made elsewhere could expose a
file from outside the workspace); steering files are changed only as ``steering.py`` allows,
and announced; writes stay within ``tools.maxWorkspaceMb``; reading something a chat received
(its ``inbox/``) marks the turn as having read outside content.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from nanobot.beneath import write_all
from nanobot.tools.paths import open_pinned, pinned_parent, resolve_in_workspace
from nanobot.tools.quota import check_quota
from nanobot.tools.registry import ToolContext, tool
from nanobot.tools.steering import announce_change, check_change, steering_target

__all__ = ["FILE_TOOLS", "read_file", "write_file", "edit_file", "list_dir", "move_file", "delete_file", "glob",
           "MAX_READ_BYTES"]

# Bigger files rarely belong in a model's context whole; head/tail/grep read part of them.
MAX_READ_BYTES = 1_000_000


def _read_bytes(ctx: ToolContext, path: str) -> tuple[bytes, str]:
    return read_checked_bytes(ctx, path, MAX_READ_BYTES,
                              "read part of it with exec_command (head, tail, sed -n, grep)")


def read_checked_bytes(ctx: ToolContext, path: str, limit: int, hint: str) -> tuple[bytes, str]:
    """A workspace file's bytes through the path guard (no symlink swaps, no hard links, no
    FIFOs), and its path as shown to the model; ValueError past ``limit`` bytes."""
    with pinned_parent(ctx, path) as pin:
        # O_NONBLOCK: opening a FIFO must not hang the turn (it is refused just below).
        fd = open_pinned(pin, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(f"{pin.shown} is a directory; use list_dir")
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{pin.shown} is not a regular file")
            if st.st_nlink > 1:
                raise PermissionError(f"{pin.shown} has {st.st_nlink} hard links; the file tools do not read "
                                      "hard-linked files, since a link can point outside the workspace")
            too_big = ValueError(f"{pin.shown} is {st.st_size:,} bytes, over the {limit:,}-byte limit; {hint}")
            if st.st_size > limit:
                raise too_big
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:  # grew since fstat
                    raise too_big
            if pin.shown.startswith("inbox/"):
                ctx.guard.taint(f"the received file {pin.shown}")
            return b"".join(chunks), pin.shown
        finally:
            os.close(fd)


async def _write_checked(ctx: ToolContext, path: str, data: bytes, how: str) -> str:
    """Write ``data`` after the steering and quota checks; announce a steering change."""
    steering = steering_target(ctx, resolve_in_workspace(ctx, path))
    if steering:
        check_change(ctx, steering)
    check_quota(ctx, len(data))
    shown = _write_bytes(ctx, path, data)
    if steering:
        await announce_change(ctx, [shown], how)
    return shown


def _write_bytes(ctx: ToolContext, path: str, data: bytes) -> str:
    with pinned_parent(ctx, path, create_parents=True) as pin:
        try:
            old = os.stat(pin.name, dir_fd=pin.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(f"{pin.shown} is a directory")
        if old is not None and stat.S_ISLNK(old.st_mode):  # resolved away earlier, so it was swapped in
            raise PermissionError(f"{pin.shown!r} became a symlink while it was being written")
        if pin.name == ".":
            raise IsADirectoryError(f"{pin.shown} is a directory")
        tmp = f".{pin.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o666, dir_fd=pin.dir_fd)
        try:
            try:
                if old is not None:
                    os.fchmod(fd, stat.S_IMODE(old.st_mode))
                write_all(fd, data)
            finally:
                os.close(fd)
            os.rename(tmp, pin.name, src_dir_fd=pin.dir_fd, dst_dir_fd=pin.dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pin.dir_fd)
            raise
        return pin.shown


@tool
async def read_file(ctx: ToolContext, path: str) -> str:
    """Read a text file."""
    data, _ = _read_bytes(ctx, path)
    return data.decode("utf-8", errors="replace")


@tool
async def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a file (and its folders)."""
    data = content.encode("utf-8")
    shown = await _write_checked(ctx, path, data, "write_file")
    return f"Wrote {len(data):,} bytes to {shown}"


@tool
async def edit_file(ctx: ToolContext, path: str, old: str, new: str) -> str:
    """Replace the one exact occurrence of `old` with `new` in a file."""
    if not old:
        raise ValueError("old must not be empty; use write_file to replace a whole file")
    raw, shown = _read_bytes(ctx, path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{shown} is not valid UTF-8 text, so edit_file cannot change it safely") from None
    count = text.count(old)
    if count == 0:
        raise ValueError(f"old text not found in {shown}; read_file it and copy the exact text, whitespace included")
    if count > 1:
        raise ValueError(f"old text found {count} times in {shown}; include more surrounding text so it matches once")
    await _write_checked(ctx, path, text.replace(old, new, 1).encode("utf-8"), "edit_file")
    return f"Edited {shown}"


@tool
async def list_dir(ctx: ToolContext, path: str = ".") -> list[str]:
    """A directory's names, sorted; folders end with "/"."""
    with pinned_parent(ctx, path) as pin:
        fd = open_pinned(pin, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise NotADirectoryError(f"{pin.shown} is not a directory; use read_file")
            with os.scandir(fd) as entries:
                names = [e.name + "/" if e.is_dir() else e.name for e in entries]
        finally:
            os.close(fd)
    return sorted(names)


@tool(brief=True)
async def move_file(ctx: ToolContext, src: str, dst: str) -> str:
    """Move or rename a file or folder (never over an existing `dst`)."""
    names = [n for n in (steering_target(ctx, resolve_in_workspace(ctx, p)) for p in (src, dst)) if n]
    for name in names:
        check_change(ctx, name)
    with pinned_parent(ctx, src) as old, pinned_parent(ctx, dst, create_parents=True) as new:
        if not _exists(old):
            raise FileNotFoundError(f"{old.shown}: no such file or directory")
        if _exists(new):
            raise ValueError(f"{new.shown} exists already; delete_file it first or choose another name")
        if new.path.is_relative_to(old.path):
            raise ValueError(f"cannot move {old.shown} into itself")
        os.rename(old.name, new.name, src_dir_fd=old.dir_fd, dst_dir_fd=new.dir_fd)
        shown = (old.shown, new.shown)
    if names:
        await announce_change(ctx, list(shown), "move_file")
    return f"Moved {shown[0]} to {shown[1]}"


@tool(brief=True)
async def delete_file(ctx: ToolContext, path: str) -> str:
    """Delete a file (or an empty folder)."""
    name = steering_target(ctx, resolve_in_workspace(ctx, path))
    if name:
        check_change(ctx, name)
    with pinned_parent(ctx, path) as pin:
        if pin.name == "." or pin.path == resolve_in_workspace(ctx, "."):
            raise PermissionError("the workspace itself cannot be deleted")
        try:
            st = os.stat(pin.name, dir_fd=pin.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"{pin.shown}: no such file or directory") from None
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(pin.name, dir_fd=pin.dir_fd)
            except OSError:
                raise ValueError(f"{pin.shown} is a folder that is not empty; delete what is in it first") from None
        else:
            os.unlink(pin.name, dir_fd=pin.dir_fd)
        shown = pin.shown
    if name:
        await announce_change(ctx, [shown], "delete_file")
    return f"Deleted {shown}"


MAX_GLOB_RESULTS = 2000


@tool
async def glob(ctx: ToolContext, pattern: str) -> list[str]:
    """Paths matching a pattern ("src/**/*.py": src/a.py and deeper), sorted; folders end with "/"."""
    if not pattern or "\x00" in pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        raise ValueError("give a pattern relative to the workspace, e.g. '**/*.py' (no '..', no leading '/')")
    root = resolve_in_workspace(ctx, ".")
    found = []
    for match in root.glob(pattern):  # does not descend into symlinked folders
        try:
            resolve_in_workspace(ctx, str(match))  # nothing that leads outside, nothing in NANOBOT_HOME
        except (PermissionError, ValueError):
            continue
        found.append(match.relative_to(root).as_posix() + ("/" if match.is_dir() else ""))
        if len(found) > MAX_GLOB_RESULTS:
            raise ValueError(f"more than {MAX_GLOB_RESULTS} matches; use a narrower pattern")
    return sorted(found)


def _exists(pin) -> bool:
    try:
        os.stat(pin.name, dir_fd=pin.dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


FILE_TOOLS = [read_file, write_file, edit_file, list_dir, move_file, delete_file, glob]
