"""The workspace path guard shared by every tool that touches files.

Two rules, checked on the *real* path (``..`` collapsed, ``~`` expanded, symlinks followed):

1. With ``tools.restrictToWorkspace`` (the default) a path must lie inside the real workspace.
2. Always: nothing inside ``NANOBOT_HOME`` (config.json with API keys, nanobot.db, sessions/)
   is reachable, except the workspace subtree when the workspace itself lives in the home
   (the default ``~/.nanobot/workspace``).

Checking a path and then opening it leaves a window in which a directory can be swapped for a
symlink. ``pinned_parent`` closes most of it: it opens the checked parent directory, confirms
the open descriptor is the directory that was checked, and callers open the last component
relative to that descriptor with ``O_NOFOLLOW``. A hard link can make a file from elsewhere
appear inside: the file tools refuse to read files with more than one link (see files.py).

A member chat's root is its folder under ``chats/``; it must itself resolve inside the
workspace, so a folder swapped for a symlink cannot widen what the chat reaches.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from nanobot.beneath import DIR_FLAGS, LinkRefused, open_last, walk_dirs
from nanobot.trust import OWNER

if TYPE_CHECKING:
    from nanobot.tools.registry import ToolContext

__all__ = ["FileScope", "resolve_in_workspace", "display_path", "pinned_parent", "open_pinned", "Pinned"]


@dataclass(frozen=True)
class FileScope:
    """Where file access may go: the chat's root, whether it fences paths in, and the nanobot
    home, which is out of reach whatever the fence."""

    workspace: Path
    home: Path
    restrict: bool = True


def file_scope(where: ToolContext | FileScope) -> FileScope:
    """A tool context's scope. A member chat is always restricted to its own folder, whatever
    ``restrictToWorkspace`` says."""
    if isinstance(where, FileScope):
        return where
    root = Path(where.workspace).expanduser()
    if where.trust == OWNER:
        return FileScope(root, where.config.home, where.config.tools.restrict_to_workspace)
    if not _inside(root.resolve(), where.config.workspace_path.resolve()):
        raise PermissionError("this chat's folder is not inside the workspace any more; refusing file access")
    return FileScope(root, where.config.home)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def display_path(path: Path, workspace: Path) -> str:
    """``path`` as the model should see it: relative to the workspace when inside it."""
    ws = workspace.resolve()
    if _inside(path, ws):
        rel = path.relative_to(ws).as_posix()
        return rel if rel != "." else "."
    return str(path)


def _check(real: Path, ws: Path, scope: FileScope, shown: str) -> None:
    """Raise PermissionError unless the real path ``real`` may be used (``ws`` is real too)."""
    restrict = scope.restrict
    if restrict and not _inside(real, ws):
        raise PermissionError(
            f"{shown!r} is outside the workspace ({ws}); use a path relative to the workspace"
        )
    home = scope.home.expanduser().resolve()
    if _inside(real, home):
        workspace_in_home = ws != home and ws.is_relative_to(home)
        if not (workspace_in_home and _inside(real, ws)):
            where = "the workspace" if restrict else "the allowed paths"
            raise PermissionError(
                f"{shown!r} is outside {where}: it is inside NANOBOT_HOME ({home}), "
                f"which file tools never touch; the workspace is {ws}"
            )


def resolve_in_workspace(where: ToolContext | FileScope, path: str, *, must_exist: bool = False) -> Path:
    """The real absolute path for ``path``, or PermissionError if it leaves the allowed area.

    Relative paths are relative to the workspace; ``~`` is expanded. A ToolContext honours
    ``tools.restrict_to_workspace``; a FileScope says itself.
    """
    scope = file_scope(where)
    workspace = scope.workspace
    if "\x00" in path:
        raise ValueError("path contains a NUL byte")
    try:
        candidate = Path(path).expanduser()
    except RuntimeError:  # "~user" that does not exist, or no HOME
        raise ValueError(f"cannot expand {path!r}") from None
    ws = workspace.resolve()
    real = (ws / candidate).resolve(strict=False)  # joining an absolute path keeps it as is
    _check(real, ws, scope, path)
    if must_exist and not real.exists():
        raise FileNotFoundError(f"{display_path(real, ws)}: no such file or directory")
    return real


@dataclass(frozen=True)
class Pinned:
    """A checked parent directory held open, and the last component to open relative to it."""

    dir_fd: int
    name: str  # open with dir_fd=..., and O_NOFOLLOW
    path: Path  # the real path, for messages
    shown: str  # the path as the model should see it


def _walk_to(directory: Path, anchor: Path, shown: str, *, create: bool) -> int:
    """Open ``directory`` by walking down from ``anchor`` without following a symlink
    (``beneath.walk_dirs``), creating missing ones when asked. The real path has no symlinks in
    it, so one found now was swapped in since the check: refused. Directories are made only
    below the anchor, so a race cannot make ``write_file`` create them elsewhere."""
    top = os.open(anchor, DIR_FLAGS)
    try:
        return walk_dirs(top, directory.relative_to(anchor).parts, shown, create=create, mode=0o777)
    except LinkRefused:
        raise PermissionError(f"{shown!r}: a directory on the path changed while it was being opened") from None
    finally:
        os.close(top)


@contextlib.contextmanager
def pinned_parent(where: ToolContext | FileScope, path: str, *, create_parents: bool = False) -> Iterator[Pinned]:
    """Check ``path``, then open its parent directory without following any symlink on the way.

    Callers then ``os.open(pinned.name, flags | os.O_NOFOLLOW, dir_fd=pinned.dir_fd)``: a
    directory swapped for a symlink between check and open is refused here, a last component
    swapped for a symlink fails the open with ELOOP.
    """
    workspace = file_scope(where).workspace
    real = resolve_in_workspace(where, path)
    shown = display_path(real, workspace)
    parent, name = (real.parent, real.name) if real.parent != real else (real, ".")
    ws = workspace.resolve()
    anchor = ws if _inside(parent, ws) else Path(parent.anchor)
    try:
        dir_fd = _walk_to(parent, anchor, shown, create=create_parents)
    except FileExistsError:  # mkdir raced with a file of that name
        raise NotADirectoryError(f"{shown}: a parent of it is a file, not a directory") from None
    try:
        yield Pinned(dir_fd, name, real, shown)
    finally:
        os.close(dir_fd)


def open_pinned(pinned: Pinned, flags: int, mode: int = 0o666) -> int:
    """Open the pinned last component without following a symlink there (``beneath.open_last``);
    it was resolved away at the check, so a symlink now was swapped in since."""
    try:
        return open_last(pinned.dir_fd, pinned.name, flags, pinned.shown, mode)
    except IsADirectoryError:
        raise IsADirectoryError(f"{pinned.shown} is a directory") from None
    except LinkRefused:
        raise PermissionError(f"{pinned.shown!r} became a symlink while it was being opened") from None
