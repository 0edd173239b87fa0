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

import os
import stat

from nanobot.beneath import open_regular, read_all, replace_file
from nanobot.tools.paths import open_pinned, pinned_parent, resolve_in_workspace
from nanobot.tools.registry import ToolContext, tool
from nanobot.tools.steering import announce_change, check_change, steering_target
from nanobot.workspace_quota import check_room

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
        try:
            fd = open_regular(pin.dir_fd, pin.name, pin.shown)
        except IsADirectoryError:
            raise IsADirectoryError(f"{pin.shown} is a directory; use list_dir") from None
        try:
            data = read_all(fd, pin.shown, limit, hint)
        finally:
            os.close(fd)
    if pin.shown.startswith("inbox/"):
        ctx.guard.taint(f"the received file {pin.shown}")
    return data, pin.shown


async def _write_checked(ctx: ToolContext, path: str, data: bytes, how: str) -> str:
    """Write ``data`` after the steering and quota checks; announce a steering change."""
    steering = steering_target(ctx, resolve_in_workspace(ctx, path))
    if steering:
        check_change(ctx, steering)
    check_room(ctx.config.workspace_path, ctx.config.tools.max_workspace_mb, len(data))
    shown = _write_bytes(ctx, path, data)
    if steering:
        await announce_change(ctx, [shown], how)
    return shown


def _write_bytes(ctx: ToolContext, path: str, data: bytes) -> str:
    with pinned_parent(ctx, path, create_parents=True) as pin:
        replace_file(pin.dir_fd, pin.name, data, pin.shown, mode=0o666, keep_mode=True)
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
